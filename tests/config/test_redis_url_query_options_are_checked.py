"""An unknown option in ``redis_url``'s query is a one-line ValueError naming it and the
options allowed, when the limiter is built: not a TypeError traceback at ``start()``
(redis-py hands every query option to the connection as a keyword)."""

from __future__ import annotations

import pytest

from gateway_limiter import GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter
from tests.support.commandline import cli
from tests.support.services import RedisServer

pytestmark = pytest.mark.usefixtures("no_local_settings")

LIMITERS = [GatewayLimiter, AsyncGatewayLimiter]


@pytest.mark.parametrize("limiter", LIMITERS)
@pytest.mark.parametrize("scheme", ["redis://127.0.0.1:6379", "rediss://127.0.0.1:6379"])
def test_an_unknown_option_is_named_with_the_allowed_ones(
    limiter: type[GatewayLimiter | AsyncGatewayLimiter], scheme: str
) -> None:
    url = f"{scheme}/0?foo=bar"
    with pytest.raises(ValueError, match="unknown option foo in the query") as raised:
        limiter(redis_url=url, database_url="sqlite://")
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"redis_url {url}:")
    allowed = message.split("(allowed: ", 1)[1].split(")", maxsplit=1)[0].split(", ")
    assert {"db", "socket_keepalive", "client_name", "username"} <= set(allowed)
    assert ("ssl_ca_certs" in allowed) is scheme.startswith("rediss")
    # the settings own the decision path's timeouts and pool: not offered in the query
    assert not {"socket_timeout", "socket_connect_timeout", "max_connections", "timeout"} & set(
        allowed
    )


@pytest.mark.parametrize("limiter", LIMITERS)
@pytest.mark.parametrize(
    ("option", "setting"),
    [
        ("socket_timeout=5", "redis_timeout"),
        ("socket_connect_timeout=5", "redis_connect_timeout"),
        ("max_connections=2", "redis_pool_size"),
        ("timeout=7", "redis_timeout"),
    ],
)
def test_an_option_a_setting_owns_is_refused_naming_the_setting(
    limiter: type[GatewayLimiter | AsyncGatewayLimiter], option: str, setting: str
) -> None:
    # redis-py would let the query win silently: seconds where the setting says 50 ms.
    name = option.split("=", 1)[0]
    with pytest.raises(ValueError, match=f"the query sets {name} \\(use the setting {setting}"):
        limiter(redis_url=f"redis://127.0.0.1:6379/0?{option}", database_url="sqlite://")


@pytest.mark.parametrize("limiter", LIMITERS)
def test_a_unix_socket_url_is_checked_the_same_way(
    limiter: type[GatewayLimiter | AsyncGatewayLimiter],
) -> None:
    with pytest.raises(ValueError, match=r"unknown options foo, x in the query \(allowed: "):
        limiter(redis_url="unix:///tmp/redis.sock?db=1&foo=1&x=2", database_url="sqlite://")


@pytest.mark.parametrize("limiter", LIMITERS)
def test_a_tls_option_on_a_plain_url_says_it_needs_rediss(
    limiter: type[GatewayLimiter | AsyncGatewayLimiter],
) -> None:
    with pytest.raises(ValueError, match="ssl_ options need a rediss:// URL"):
        limiter(redis_url="redis://127.0.0.1:6379/0?ssl_ca_certs=/ca.crt", database_url="sqlite://")


@pytest.mark.parametrize("limiter", LIMITERS)
def test_the_password_stays_masked_in_the_message(
    limiter: type[GatewayLimiter | AsyncGatewayLimiter],
) -> None:
    with pytest.raises(ValueError) as raised:
        limiter(redis_url="redis://gw:s3cret@127.0.0.1:6379/0?foo=1", database_url="sqlite://")
    assert "s3cret" not in str(raised.value)
    assert "redis://gw:***@127.0.0.1:6379/0" in str(raised.value)
    assert "unknown option foo" in str(raised.value)


@pytest.mark.parametrize("scheme", ["redis+sentinel", "redis+cluster"])
@pytest.mark.parametrize("limiter", LIMITERS)
def test_sentinel_and_cluster_urls_take_no_query_at_all(
    limiter: type[GatewayLimiter | AsyncGatewayLimiter], scheme: str
) -> None:
    path = "/gwl" if scheme == "redis+sentinel" else ""
    with pytest.raises(ValueError, match="options after '\\?' or '#' are not supported"):
        limiter(redis_url=f"{scheme}://127.0.0.1:26379{path}?foo=bar", database_url="sqlite://")


def test_known_options_still_work_against_a_real_redis(
    redis_server: RedisServer, key_prefix: str
) -> None:
    url = f"{redis_server.url}?socket_keepalive=true&client_name=gw-test"
    with GatewayLimiter(
        redis_url=url, database_url="sqlite://", key_prefix=key_prefix, reload_interval=60
    ) as limiter:
        assert limiter.try_acquire("/not-configured")
        names = {c["name"] for c in redis_server.client().client_list()}
        assert "gw-test" in names


async def test_known_options_still_work_with_asyncio(
    redis_server: RedisServer, key_prefix: str
) -> None:
    url = f"{redis_server.url}?client_name=gw-async"
    async with AsyncGatewayLimiter(
        redis_url=url, database_url="sqlite://", key_prefix=key_prefix, reload_interval=60
    ) as limiter:
        await limiter.backend.prepare()  # a round trip on a connection named by the URL
        names = {c["name"] for c in redis_server.client().client_list()}
        assert "gw-async" in names


def test_the_command_line_says_it_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    ran = cli(
        capsys, "--database-url", "sqlite://", "--redis-url", "redis://h:1/0?foo=bar", "status"
    )
    assert ran.code != 0
    assert "Traceback" not in ran.err
    (line,) = ran.err.splitlines()
    assert "unknown option foo in the query (allowed: " in line
