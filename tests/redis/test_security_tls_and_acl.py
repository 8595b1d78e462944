"""``rediss://`` (TLS) and Redis ACL users, on real private redis-servers.

The CA (and a client certificate, for servers that ask for one) go in the URL's query,
as redis-py reads them: ``rediss://user:pass@host:port/0?ssl_ca_certs=/path/ca.crt``.
A server that cannot be verified or refuses the password is an unreachable Redis: the
failure policy decides, no caller sees an exception, and no message shows the password.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.backends.state import bucket_key
from gateway_limiter.cli import main
from tests.support.limiting import evalsha_calls, scan_keys, write_row
from tests.support.services import AclUser, RedisServer, TlsFiles

#: A password as secrets look: long, with characters a URL must percent-encode.
SECRET = "Xq7-s3cr3t/pw:@ 'q'"
ACL_PREFIX = "gwacl"
#: What the limiter needs (docs/reliability.md): the scripts, and what they and
#: status call (GET, SET, TIME); nothing else.
MINIMAL_COMMANDS = ("resetchannels", "-@all", "+evalsha", "+script|load", "+get", "+set", "+time")
#: The user may touch keys under the limiter's prefix only (any other key is NOPERM),
#: with the commands above only.
USER = AclUser("gateway", SECRET, (f"~{ACL_PREFIX}:*", *MINIMAL_COMMANDS))


def secret_forms() -> list[str]:
    """Every spelling of the password that must never be shown."""
    return [SECRET, quote(SECRET, safe=""), quote(SECRET), "s3cr3t"]


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        for form in secret_forms():
            assert form not in text, f"{form!r} shown in {text!r}"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return TlsFiles.make(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def server(request: pytest.FixtureRequest, tls: TlsFiles) -> Iterator[RedisServer]:
    """A private Redis as the test's parameter says: TLS, mutual TLS, ACL, or TLS + ACL."""
    kind = request.param
    kinds: dict[str, dict[str, Any]] = {
        "tls": {"tls": tls},
        "mtls": {"tls": tls, "client_certs": True},
        "acl": {"user": USER},
        "tls+acl": {"tls": tls, "user": USER},
    }
    s = RedisServer(**kinds[kind]).start()
    yield s
    s.stop()


def url_for(server: RedisServer, tls: TlsFiles, *, ca: bool = True, cert: bool = True) -> str:
    query = []
    if server.tls and ca:
        query.append(f"ssl_ca_certs={tls.ca}")
    if server.client_certs and cert:
        query += [f"ssl_certfile={tls.client_cert}", f"ssl_keyfile={tls.client_key}"]
    return server.url + ("?" + "&".join(query) if query else "")


@pytest.fixture
def db(migrated_db: tuple[str, Engine]) -> str:
    url, engine = migrated_db
    # 5 saved up, refilled at 1/s: a loaded host's stalls between the calls counted on
    # it refill nothing
    write_row(engine, "/ibe/x", rateLimit=1, maxPermits=5, cache=0.0, status=1)
    return url


def limiter(db: str, redis_url: str, **settings: Any) -> GatewayLimiter:
    lim = GatewayLimiter(
        database_url=db,
        redis_url=redis_url,
        key_prefix=ACL_PREFIX,
        reload_interval=3600,
        redis_timeout=1.0,  # TLS handshakes on a loaded CI host: no false outage here
        redis_connect_timeout=2.0,
        **settings,
    )
    lim.start()
    return lim


@pytest.mark.parametrize("server", ["tls", "mtls", "acl", "tls+acl"], indirect=True)
def test_decisions_are_shared_over_tls_and_as_an_acl_user(
    server: RedisServer, tls: TlsFiles, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    admin = server.client()
    before = evalsha_calls(admin)
    lim = limiter(db, url_for(server, tls))
    try:
        got = [lim.try_acquire("/ibe/x") for _ in range(6)]
        assert lim.backend_healthy and lim.backend_fallbacks == 0
        assert got == [True] * 5 + [False]
        assert lim.local_refusals == 1  # the fifth reply said: nothing free for a second
    finally:
        lim.close()
    assert evalsha_calls(admin) == before + 5  # Redis decided, over this connection
    assert scan_keys(admin) == {bucket_key(ACL_PREFIX, "/ibe/x")}
    assert_no_secret(caplog.text)


@pytest.mark.parametrize("server", ["tls+acl"], indirect=True)
async def test_the_asyncio_limiter_speaks_tls_and_acl_too(
    server: RedisServer, tls: TlsFiles, db: str
) -> None:
    admin = server.client()
    async with AsyncGatewayLimiter(
        database_url=db,
        redis_url=url_for(server, tls),
        key_prefix=ACL_PREFIX,
        reload_interval=3600,
        redis_timeout=1.0,
        redis_connect_timeout=2.0,
    ) as lim:
        assert [await lim.try_acquire("/ibe/x") for _ in range(6)] == [True] * 5 + [False]
        assert lim.backend_healthy
    assert admin.exists(bucket_key(ACL_PREFIX, "/ibe/x"))


@pytest.mark.parametrize("server", ["acl"], indirect=True)
def test_the_acl_user_confined_to_the_prefix_is_all_the_limiter_needs(
    server: RedisServer, tls: TlsFiles, db: str
) -> None:
    # The ACL refuses any key outside gwacl:*; a limiter with another prefix fails on
    # every decision (and the policy decides), so the one above touched nothing else.
    lim = GatewayLimiter(
        database_url=db, redis_url=url_for(server, tls), key_prefix="other", reload_interval=3600
    )
    lim.start()
    try:
        lim.try_acquire("/ibe/x")
        assert lim.backend_fallbacks == 1
        assert not lim.backend_healthy
    finally:
        lim.close()


WRONG = {
    "wrong password": lambda s, tls: url_for(s, tls).replace(
        quote(SECRET, safe=""), "x" + quote(SECRET, safe="")
    ),
    "CA not given": lambda s, tls: url_for(s, tls, ca=False),
    "no client certificate": lambda s, tls: url_for(s, tls, cert=False),
}


@pytest.mark.parametrize(
    ("server", "wrong"),
    [("tls+acl", "wrong password"), ("tls+acl", "CA not given"), ("mtls", "no client certificate")],
    indirect=["server"],
)
def test_a_server_that_cannot_be_trusted_or_refuses_us_is_an_outage_the_policy_rides(
    server: RedisServer,
    tls: TlsFiles,
    db: str,
    wrong: str,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GATEWAY_LIMITER_KEY_PREFIX", ACL_PREFIX)
    caplog.set_level(logging.DEBUG)
    redis_url = WRONG[wrong](server, tls)
    lim = limiter(db, redis_url)
    try:
        # local policy: the same limit in this process; never an exception
        assert [lim.try_acquire("/ibe/x") for _ in range(6)] == [True] * 5 + [False]
        assert not lim.backend_healthy and lim.backend_fallbacks == 6
    finally:
        lim.close()
    assert "Redis unreachable" in caplog.text
    # status says the state cannot be read, and why, without the password
    capsys.readouterr()
    code = main(["--database-url", db, "--redis-url", redis_url, "status"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "cannot read bucket state" in err
    assert_no_secret(caplog.text, out, err)
    assert scan_keys(server.client()) == set()


@pytest.mark.parametrize("server", ["tls+acl"], indirect=True)
def test_status_and_conf_list_show_the_live_bucket_never_the_password(
    server: RedisServer,
    tls: TlsFiles,
    db: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GATEWAY_LIMITER_KEY_PREFIX", ACL_PREFIX)
    redis_url = url_for(server, tls)
    lim = limiter(db, redis_url)
    try:
        assert lim.reserve("/ibe/x", 10, 10.0).allowed  # 5 s of debt in the shared bucket
    finally:
        lim.close()
    capsys.readouterr()
    for argv in (["status"], ["status", "/ibe/x"], ["conf", "list"], ["-v", "status"]):
        code = main(["--database-url", db, "--redis-url", redis_url, *argv])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert_no_secret(out, err)
    code = main(["--database-url", db, "--redis-url", redis_url, "status"])
    out, _ = capsys.readouterr()
    assert f"rediss://{USER.name}:***@127.0.0.1:{server.port}/0" in out
    assert "in debt: callers queue" in out  # the live state, read over TLS as the user


def test_the_ca_path_may_also_come_from_a_settings_file(
    tls: TlsFiles, db: str, tmp_path: Path
) -> None:
    server = RedisServer(tls=tls, user=USER).start()
    try:
        settings = tmp_path / "settings.toml"
        settings.write_text(
            f"database_url = '{db}'\nredis_url = '{url_for(server, tls)}'\n"
            f"key_prefix = '{ACL_PREFIX}'\nreload_interval = 3600\nredis_timeout = 1.0\n",
            encoding="utf-8",
        )
        with GatewayLimiter.from_settings(settings) as lim:
            assert lim.try_acquire("/ibe/x")
            assert lim.backend_fallbacks == 0
    finally:
        server.stop()
