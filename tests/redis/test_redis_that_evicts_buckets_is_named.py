"""A Redis set up to evict keys when full would drop buckets (an evicted bucket is a full
bucket): the limiter says so once, naming the setting and the fix, at start or when
Redis first answers; it says nothing under ``noeviction``, or when CONFIG is refused."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.backends.cluster import cluster_policies
from gateway_limiter.backends.readiness import EVICTING_POLICIES, eviction_warning
from gateway_limiter.backends.state import bucket_key
from tests.support.limiting import limiter, write_row
from tests.support.services import AclUser, RedisServer
from tests.support.traffic import stat

URL = "/evict/search"
#: A read deadline a loaded host keeps: these tests are about the eviction check, and a
#: timed-out call would be an outage they do not mean to test.
PATIENT = 2.0


def eviction_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "maxmemory-policy" in r.getMessage()]


@pytest.fixture
def evicting_redis(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    server = RedisServer("--maxmemory-policy", request.param).start()
    yield server
    server.stop()


@pytest.mark.parametrize("evicting_redis", ["allkeys-lru", "volatile-ttl"], indirect=True)
def test_an_evicting_policy_is_named_once_with_its_fix(
    evicting_redis: RedisServer,
    migrated_db: tuple[str, Engine],
    key_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    db_url, engine = migrated_db
    write_row(engine, URL, rateLimit=100, cache=0.0, status=1)
    policy = str(evicting_redis.client().config_get("maxmemory-policy")["maxmemory-policy"])
    with caplog.at_level(logging.WARNING, logger="gateway_limiter"):
        lim = limiter(db_url, evicting_redis.url, key_prefix, redis_timeout=PATIENT)
        try:
            for _ in range(20):
                lim.try_acquire(URL, timeout=0)
            assert lim.backend_healthy  # a warning, not a failure
        finally:
            lim.close()
    [line] = eviction_lines(caplog)
    assert policy in line
    assert "an evicted bucket is a full bucket" in line
    assert "noeviction" in line


@pytest.mark.parametrize("evicting_redis", ["noeviction"], indirect=True)
def test_noeviction_says_nothing(
    evicting_redis: RedisServer,
    migrated_db: tuple[str, Engine],
    key_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    db_url, engine = migrated_db
    write_row(engine, URL, rateLimit=100, cache=0.0, status=1)
    with caplog.at_level(logging.WARNING, logger="gateway_limiter"):
        lim = limiter(db_url, evicting_redis.url, key_prefix, redis_timeout=PATIENT)
        try:
            assert lim.try_acquire(URL, timeout=0)
        finally:
            lim.close()
    assert eviction_lines(caplog) == []
    assert stat(evicting_redis.client(), "config|get") == 1  # it did ask


@pytest.mark.parametrize("evicting_redis", ["allkeys-lfu"], indirect=True)
async def test_asyncio_names_an_evicting_policy_once(
    evicting_redis: RedisServer,
    migrated_db: tuple[str, Engine],
    key_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    db_url, engine = migrated_db
    write_row(engine, URL, rateLimit=100, cache=0.0, status=1)
    with caplog.at_level(logging.WARNING, logger="gateway_limiter"):
        async with AsyncGatewayLimiter(
            database_url=db_url,
            redis_url=evicting_redis.url,
            key_prefix=key_prefix,
            redis_timeout=PATIENT,
        ) as lim:
            for _ in range(20):
                await lim.try_acquire(URL, timeout=0)
            assert lim.backend_healthy
    [line] = eviction_lines(caplog)
    assert "allkeys-lfu" in line and "noeviction" in line


def test_named_when_redis_first_answers_after_start(
    migrated_db: tuple[str, Engine], key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    db_url, engine = migrated_db
    write_row(engine, URL, rateLimit=100, cache=0.0, status=1)
    server = RedisServer("--maxmemory-policy", "volatile-lru")  # not started yet
    try:
        with caplog.at_level(logging.WARNING, logger="gateway_limiter"):
            lim = limiter(db_url, server.url, key_prefix, breaker_seconds=0.0)
            try:
                lim.try_acquire(URL, timeout=0)
                assert eviction_lines(caplog) == []  # nothing to ask yet
                server.start()
                for _ in range(20):
                    lim.try_acquire(URL, timeout=0)
                assert server.client().exists(bucket_key(key_prefix, URL))
            finally:
                lim.close()
        [line] = eviction_lines(caplog)
        assert "volatile-lru" in line
    finally:
        server.stop()


def test_config_refused_says_nothing_and_limits(
    migrated_db: tuple[str, Engine], key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An ACL user without CONFIG (what docs/reliability.md lists is all it needs)."""
    db_url, engine = migrated_db
    write_row(engine, URL, rateLimit=100, cache=0.0, status=1)
    commands = ("-@all", "+evalsha", "+script|load", "+get", "+set", "+time")
    user = AclUser("gateway", "gateway-password", (f"~{key_prefix}:*", *commands))
    server = RedisServer("--maxmemory-policy", "allkeys-lru", user=user).start()
    try:
        with caplog.at_level(logging.WARNING, logger="gateway_limiter"):
            lim = limiter(db_url, server.url, key_prefix, redis_timeout=PATIENT)
            try:
                assert lim.try_acquire(URL, timeout=0)
                assert lim.backend_healthy
                assert lim.backend_fallbacks == 0
            finally:
                lim.close()
        assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
        assert stat(server.client(), "config|get") == 0  # refused before it ran
    finally:
        server.stop()


def test_which_policies_warn() -> None:
    assert {"allkeys-lru", "volatile-ttl", "volatile-lru", "allkeys-random"} <= EVICTING_POLICIES
    assert eviction_warning(["noeviction", None]) is None
    assert eviction_warning([]) is None
    warning = eviction_warning(["noeviction", "volatile-lfu"])
    assert warning is not None and "volatile-lfu" in warning and "noeviction" in warning
    replies = {"n1:1": {"maxmemory-policy": "noeviction"}, "n2:2": {"maxmemory-policy": "x"}}
    assert sorted(cluster_policies(replies)) == ["noeviction", "x"]  # type: ignore[type-var]
    assert cluster_policies({b"maxmemory-policy": b"allkeys-lru"}) == ["allkeys-lru"]
