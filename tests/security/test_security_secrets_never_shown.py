"""Database and Redis passwords never appear in logs, errors, ``status`` or ``conf list``.

Checked three ways: any password in any URL form is masked (property); the errors a
bad URL raises never quote it (property, through the real constructors); and the
failure paths on real services (a wrong password to MariaDB and to a Redis ACL user,
an unreachable host) with every logger captured at DEBUG.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import pymysql
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter, Settings, SettingsError, load_settings
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.cli import main
from gateway_limiter.config.table import DatabaseUrlError, make_engine
from gateway_limiter.observe.redact import mask_secrets, mask_url
from tests.support.limiting import write_row
from tests.support.services import (
    MARIADB_HOST,
    MARIADB_PORT,
    AclUser,
    RedisServer,
    free_port,
    mariadb_connection,
)

SCHEMES = [
    "mysql+pymysql",
    "mariadb+pymysql",
    "sqlite",
    "postgresql",
    "redis",
    "rediss",
    "unix",
    "redis+sentinel",
    "redis+cluster",
]
#: Markers at both ends: a partly masked password still shows one of them.
HEAD, TAIL = "Zq8", "8qZ"
#: What RFC 3986 allows in a password (unreserved, sub-delims, ":"), plus what the
#: parsers take anyway (spaces, quotes, "@"), plus percent-escapes and non-ASCII.
PASSWORD_CHARS = st.sampled_from([*list("abcXYZ019-._~!$&'()*+,;=: \"@%"), "%40", "%2F", "é", "中"])
passwords = st.lists(PASSWORD_CHARS, max_size=20).map(lambda cs: HEAD + "".join(cs) + TAIL)
users = st.sampled_from(["", "gw", "gateway-limiter", "user.name", "u%40x"])
hosts = st.sampled_from(["127.0.0.1", "db.internal", "[::1]", "h", "h:6379", "127.0.0.1:1"])
paths = st.sampled_from(["", "/", "/0", "/db", "/db?charset=utf8mb4", "/0?ssl_cert_reqs=none"])


def assert_hidden(password: str, *texts: str) -> None:
    for text in texts:
        for shown in (password, HEAD, TAIL):
            assert shown not in text, f"{shown!r} shown in {text!r}"


@settings(max_examples=500, deadline=None)
@given(scheme=st.sampled_from(SCHEMES), user=users, password=passwords, host=hosts, path=paths)
def test_any_password_in_any_url_is_masked(
    scheme: str, user: str, password: str, host: str, path: str
) -> None:
    for url in (
        f"{scheme}://{user}:{password}@{host}{path}",
        f"{scheme}://{user}:{quote(password, safe='')}@{host}{path}",
        f"{scheme}://{host}{path or '/'}?password={quote(password, safe='')}",
        f"{user}:{password}@{host}{path}",  # the scheme forgotten: a setting's value
    ):
        masked = mask_url(url)
        assert_hidden(password, masked)
        if "://" in url:  # free text can tell a URL only by its scheme
            assert mask_secrets(url) == masked
        assert "***" in masked
        # A masked URL stays recognisable: scheme and host are kept.
        assert host.split(":", maxsplit=1)[0].strip("[]") in masked


@settings(max_examples=200, deadline=None)
@given(
    user=users,
    password=passwords.filter(lambda p: not set(p) & set("/?#")),
    bad=st.sampled_from([":notaport", ":99999999", ":-1", ":6379x"]),
)
def test_errors_from_a_bad_url_never_quote_its_password(user: str, password: str, bad: str) -> None:
    # The password as a parser reads it: no "/", "?" or "#" (they end the authority
    # for redis-py, so such a password must be percent-encoded anyway).
    redis_url = f"redis://{user}:{password}@h{bad}/0"
    database_url = f"mysql+pymysql://{user}:{password}@h{bad}/db"
    messages = []
    for attempt in (
        lambda: GatewayLimiter(redis_url=redis_url),
        lambda: AsyncGatewayLimiter(redis_url=redis_url),
        lambda: GatewayLimiter(database_url=database_url),
        lambda: make_engine(database_url),
        lambda: load_settings(environ={}, redis_url=f"http://{user}:{password}@h/0"),
        lambda: load_settings(environ={"GATEWAY_LIMITER_DATABASE_URL": f"{user}:{password}@h"}),
    ):
        try:
            attempt()
        except (ValueError, SettingsError, DatabaseUrlError) as e:
            messages.append(f"{e} {e!r} {e.args!r}")
    assert messages  # each of these URLs is refused somewhere
    assert_hidden(password, *messages)


def test_settings_and_their_repr_never_show_a_password() -> None:
    s = Settings(
        database_url=f"mysql+pymysql://gw:{HEAD}p w'x{TAIL}@db/limits",
        redis_url=f"rediss://gateway:{HEAD}pw{TAIL}@cache:6380/0?password={HEAD}q{TAIL}",
    )
    # Before: the dataclass repr showed both URLs as they are, so logging a Settings
    # (or an error carrying one) printed the passwords.
    for text in (repr(s), str(s), str(s.masked()), f"{s!r}"):
        assert_hidden(f"{HEAD}pw{TAIL}", text)
        assert "mysql+pymysql://gw:***@db/limits" in text


# --- on real services ---------------------------------------------------------------

SECRET = f"{HEAD}-s3cr3t pw'{TAIL}"


@pytest.fixture
def db_user(migrated_db: tuple[str, Engine]) -> Iterator[str]:
    """A MariaDB user with SECRET as its password, on the test's database; its URL."""
    engine = migrated_db[1]
    write_row(engine, "/ibe/x", rateLimit=5, cache=0.0, status=1)
    database = engine.url.database
    name = f"gwl_{uuid.uuid4().hex[:8]}"
    conn = mariadb_connection()
    with conn.cursor() as cur:
        cur.execute("CREATE USER %s@'%%' IDENTIFIED BY %s", (name, SECRET))
        cur.execute(f"GRANT ALL ON `{database}`.* TO %s@'%%'", (name,))
    try:
        yield (
            f"mysql+pymysql://{name}:{quote(SECRET, safe='')}@"
            f"{MARIADB_HOST}:{MARIADB_PORT}/{database}"
        )
    finally:
        with conn.cursor() as cur:
            cur.execute("DROP USER IF EXISTS %s@'%%'", (name,))
        conn.close()


@pytest.fixture
def acl_redis() -> Iterator[RedisServer]:
    server = RedisServer(user=AclUser("gateway", SECRET)).start()
    yield server
    server.stop()


def forms() -> list[str]:
    return [SECRET, quote(SECRET, safe=""), quote(SECRET), HEAD, TAIL, "s3cr3t"]


def assert_secret_hidden(*texts: str) -> None:
    for text in texts:
        for form in forms():
            assert form not in text, f"{form!r} shown in {text!r}"


CLI_COMMANDS = [
    ["conf", "list"],
    ["-v", "conf", "list"],
    ["status"],
    ["-v", "status", "/ibe/x"],
    ["switch", "status"],
    ["db", "current"],
    ["db", "upgrade"],
    ["conf", "set", "/ibe/x", "--rate", "5"],
]


def run_everything(
    database_url: str,
    redis_url: str,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> list[str]:
    """Start a limiter, decide, reload, ask its status, run the CLI: all that it printed,
    logged and raised."""
    shown: list[str] = []
    lim = GatewayLimiter(
        database_url=database_url,
        redis_url=redis_url,
        reload_interval=3600,
        redis_timeout=1.0,
        key_prefix=f"t{uuid.uuid4().hex[:8]}",
    )
    try:
        shown.append(str(lim.start()))
        assert isinstance(lim.try_acquire("/ibe/x"), bool)  # never an exception
        shown.append(str(lim.reload()))
        shown += [repr(s) for s in lim.status()]
        shown.append(repr(lim.settings))
    finally:
        lim.close()
    for argv in CLI_COMMANDS:
        capsys.readouterr()
        code = main(["--database-url", database_url, "--redis-url", redis_url, *argv])
        out, err = capsys.readouterr()
        assert "Traceback" not in err
        shown += [f"exit {code}", out, err]
    shown.append(caplog.text)
    return shown


def test_a_working_password_protected_database_and_redis_show_no_password(
    db_user: str,
    acl_redis: RedisServer,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger: ours, SQLAlchemy, redis, apscheduler
    shown = run_everything(db_user, acl_redis.url, caplog, capsys)
    assert "exit 1" not in shown  # all of it worked ...
    assert any(f"gateway:***@127.0.0.1:{acl_redis.port}" in s for s in shown)
    assert_secret_hidden(*shown)  # ... and showed no password


@pytest.mark.parametrize(
    "fault", ["wrong database password", "database unreachable", "wrong redis password"]
)
def test_failures_show_no_password_either(
    db_user: str,
    acl_redis: RedisServer,
    fault: str,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    database_url, redis_url = db_user, acl_redis.url
    encoded = quote(SECRET, safe="")
    if fault == "wrong database password":
        database_url = database_url.replace(encoded, encoded + "x")
    elif fault == "database unreachable":
        database_url = database_url.replace(f":{MARIADB_PORT}/", f":{free_port()}/")
    else:
        redis_url = redis_url.replace(encoded, encoded + "x")
    shown = run_everything(database_url, redis_url, caplog, capsys)
    text = "\n".join(shown)
    if fault == "wrong redis password":
        assert "WRONGPASS" in text or "invalid username-password" in text
    elif fault == "wrong database password":
        assert "Access denied" in text
    else:
        assert "Can't connect" in text
    assert "exit 1" in shown  # the CLI said so ...
    assert_secret_hidden(*shown)  # ... without the password


def test_the_test_user_really_has_that_password(db_user: str) -> None:
    # The failure test above would pass vacuously if the user had no password.
    name = db_user.split("//")[1].split(":", maxsplit=1)[0]
    with pytest.raises(pymysql.err.OperationalError, match="Access denied"):
        pymysql.connect(host=MARIADB_HOST, port=MARIADB_PORT, user=name, password="")
    pymysql.connect(host=MARIADB_HOST, port=MARIADB_PORT, user=name, password=SECRET).close()
