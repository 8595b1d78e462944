"""A limiter starts while its Redis is away (one server, Sentinel, Cluster; threads and
asyncio): the failure policy decides until Redis answers, then the scripts are loaded
and decisions are shared, with no restart. A ``redis+cluster://`` URL naming a server
that is not in cluster mode starts too, and the policy decides."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import Engine

from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.backends.state import bucket_key
from tests.support.clocks import DrivenClock
from tests.support.clusters import LocalCluster, LocalSentinel
from tests.support.limiting import limiter, write_row
from tests.support.services import RedisServer
from tests.support.traffic import stat
from tests.support.waiting import wait_for

URL = "/start/without-redis"
#: deny: a decision the policy made is a refusal, one Redis made (rate 50/s) an admission
SETTINGS: dict[str, Any] = {
    "on_backend_error": "deny",
    "breaker_seconds": 0.2,
    # generous: a cluster's nodes may be slow to answer on a loaded 2-core host
    "redis_timeout": 0.5,
}
#: Starting a cluster or a sentinel group takes seconds on a loaded host.
RESUME_S = 60.0


@dataclass
class Planned:
    """A Redis of some kind, its URL known before it runs."""

    url: str
    start: Callable[[], object]
    #: does ``key`` exist where the limiter keeps it
    holds: Callable[[str], bool]
    #: SCRIPT LOAD calls its masters ran
    script_loads: Callable[[], int]


@contextmanager
def planned(kind: str) -> Iterator[Planned]:
    """A Redis of ``kind`` with nothing listening yet; stopped afterwards."""
    if kind == "redis":
        server = RedisServer()
        try:
            yield Planned(
                server.url,
                server.start,
                lambda key: bool(server.client().exists(key)),
                lambda: stat(server.client(), "script|load"),
            )
        finally:
            server.stop()
    elif kind == "sentinel":
        group = LocalSentinel()

        def master() -> RedisServer:
            return group.server_on(group.master_port())

        try:
            yield Planned(
                group.url,
                group.start,
                lambda key: bool(master().client().exists(key)),
                lambda: stat(master().client(), "script|load"),
            )
        finally:
            group.stop()
    else:
        cluster = LocalCluster()
        try:
            yield Planned(
                cluster.url,
                cluster.start,
                lambda key: bool(cluster.client().exists(key)),
                lambda: sum(stat(n.client(), "script|load") for n in cluster.running()),
            )
        finally:
            cluster.stop()


KINDS = ["redis", "sentinel", "cluster"]


def wait_until(what: str, check: Callable[[], bool], seconds: float = RESUME_S) -> None:
    wait_for(check, seconds, what, every=0.05)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_starts_without_redis_and_shares_once_it_answers(
    kind: str, migrated_db: tuple[str, Engine], key_prefix: str
) -> None:
    db_url, engine = migrated_db
    write_row(engine, URL, rateLimit=50, cache=0.0, status=1)
    with planned(kind) as redis_:
        lim = limiter(db_url, redis_.url, key_prefix, **SETTINGS)  # nothing listens: starts
        try:
            assert not lim.backend_healthy
            assert not lim.try_acquire(URL, timeout=0)  # deny decided
            assert lim.backend_fallbacks >= 1
            redis_.start()
            wait_until(f"{kind}: a decision by Redis", lambda: lim.try_acquire(URL, timeout=0))
            assert lim.backend_healthy
            assert redis_.holds(bucket_key(key_prefix, URL))  # the shared bucket
            assert redis_.script_loads() >= 1  # got ready once Redis answered
        finally:
            lim.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
async def test_asyncio_starts_without_redis_and_shares_once_it_answers(
    kind: str, migrated_db: tuple[str, Engine], key_prefix: str
) -> None:
    db_url, engine = migrated_db
    write_row(engine, URL, rateLimit=50, cache=0.0, status=1)
    with planned(kind) as redis_:
        async with AsyncGatewayLimiter(
            database_url=db_url, redis_url=redis_.url, key_prefix=key_prefix, **SETTINGS
        ) as lim:
            assert not lim.backend_healthy
            assert not await lim.try_acquire(URL, timeout=0)
            assert lim.backend_fallbacks >= 1
            await asyncio.to_thread(redis_.start)
            deadline = time.monotonic() + RESUME_S
            while not await lim.try_acquire(URL, timeout=0):
                assert time.monotonic() < deadline, f"{kind}: no decision by Redis"
                await asyncio.sleep(0.05)
            assert lim.backend_healthy
            assert await asyncio.to_thread(redis_.holds, bucket_key(key_prefix, URL))
            assert await asyncio.to_thread(redis_.script_loads) >= 1


def test_cluster_url_on_a_server_not_in_cluster_mode_starts(
    migrated_db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str
) -> None:
    db_url, engine = migrated_db
    write_row(engine, URL, rateLimit=50, cache=0.0, status=1)
    url = f"redis+cluster://127.0.0.1:{private_redis.port}"
    clock = DrivenClock()  # the breaker's seconds are the limiter's clock's
    lim = limiter(db_url, url, key_prefix, clock=clock, **SETTINGS)
    try:
        assert not lim.try_acquire(URL, timeout=0)
        clock.advance(SETTINGS["breaker_seconds"] * 2)  # the probe fails the same way
        assert not lim.try_acquire(URL, timeout=0)
        assert lim.backend_fallbacks >= 2
        assert not lim.backend_healthy
    finally:
        lim.close()


async def test_asyncio_cluster_url_on_a_server_not_in_cluster_mode_starts(
    migrated_db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str
) -> None:
    db_url, engine = migrated_db
    write_row(engine, URL, rateLimit=50, cache=0.0, status=1)
    url = f"redis+cluster://127.0.0.1:{private_redis.port}"
    clock = DrivenClock()  # the breaker's seconds are the limiter's clock's
    async with AsyncGatewayLimiter(
        database_url=db_url, redis_url=url, key_prefix=key_prefix, clock=clock, **SETTINGS
    ) as lim:
        assert not await lim.try_acquire(URL, timeout=0)
        clock.advance(SETTINGS["breaker_seconds"] * 2)  # the probe fails the same way
        assert not await lim.try_acquire(URL, timeout=0)
        assert lim.backend_fallbacks >= 2
        assert not lim.backend_healthy
