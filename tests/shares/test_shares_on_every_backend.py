"""The same channel cap and named caller decided by every backend that decides: a
3-master Redis Cluster (one slot per capped channel: no CROSSSLOT), the asyncio
limiter on Redis, and ``memory://`` (the in-process model the ``local`` failure policy
runs)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.config.rules import CHANNEL_URL
from tests.support.clusters import LocalCluster
from tests.support.limiting import limiter, write_row


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    engine = limiter_db[1]
    for url in ("/a", "/b", "/c"):
        write_row(engine, url, rateLimit=10, cache=0.0, channelType="CH")
    write_row(engine, CHANNEL_URL, rateLimit=4, cache=0.0, channelType="CH")
    write_row(engine, "/p", rateLimit=2, cache=0.0, perCaller=1)
    write_row(engine, "/p", add=True, rateLimit=5, cache=0.0, perCaller=1, callerKey="A")
    return limiter_db


@pytest.fixture
def limiter_settings() -> dict[str, Any]:
    return {"reload_interval": 3600, "on_backend_error": "deny", "redis_timeout": 2.0}


CHANNEL_CALLS = ["/a", "/b", "/c", "/a", "/b", "/c"]
#: 4 for the channel over its three interfaces, then refused
CHANNEL_ADMITS = [True, True, True, True, False, False]


def decide_sync(lim: GatewayLimiter) -> tuple[list[bool], list[bool], list[bool]]:
    channel = [lim.try_acquire(url, timeout=0) for url in CHANNEL_CALLS]
    named = [lim.try_acquire("/p", timeout=0, key="A") for _ in range(6)]
    default = [lim.try_acquire("/p", timeout=0, key="B") for _ in range(3)]
    return channel, named, default


@pytest.mark.parametrize("limiter_redis_url", ["memory://"])
def test_memory_decides_shares_as_redis_does(lim: GatewayLimiter) -> None:
    channel, named, default = decide_sync(lim)
    assert channel == CHANNEL_ADMITS
    assert named == [True] * 5 + [False]  # A's own 5
    assert default == [True, True, False]  # B: the default 2


@pytest.mark.slow
def test_a_cluster_decides_a_capped_channel_in_one_slot(
    limiter_db: tuple[str, Engine],
    redis_cluster: LocalCluster,
    key_prefix: str,
    limiter_settings: dict[str, Any],
) -> None:
    lim = limiter(limiter_db[0], redis_cluster.url, key_prefix, **limiter_settings)
    try:
        channel, named, default = decide_sync(lim)
        assert lim.backend_fallbacks == 0  # no CROSSSLOT, no error: Redis decided all
    finally:
        lim.close()
    assert channel == CHANNEL_ADMITS
    assert named == [True] * 5 + [False]
    assert default == [True, True, False]


async def test_the_asyncio_limiter_decides_shares_on_redis(alim: AsyncGatewayLimiter) -> None:
    channel = [await alim.try_acquire(url, timeout=0) for url in CHANNEL_CALLS]
    named = [await alim.try_acquire("/p", timeout=0, key="A") for _ in range(6)]
    default = [await alim.try_acquire("/p", timeout=0, key="B") for _ in range(3)]
    assert channel == CHANNEL_ADMITS
    assert named == [True] * 5 + [False]
    assert default == [True, True, False]
    assert alim.backend_fallbacks == 0


def test_admin_sets_a_named_caller_beside_the_default_row(
    migrated_db: tuple[str, Engine],
) -> None:
    from gateway_limiter import admin
    from gateway_limiter.config.rules import build_rules
    from gateway_limiter.config.table import read_rows

    db, engine = migrated_db
    default = admin.set_limit(db, "/adm", 10, per_caller=True)
    named = admin.set_limit(db, "/adm", 50, per_caller=True, caller_key="A")
    again = admin.set_limit(db, "/adm", 12, per_caller=True)  # the default row, not A's
    assert again == default != named
    ruleset = build_rules(read_rows(engine), 0.5)
    assert ruleset.rules["/adm"].rate == 12
    assert ruleset.named[("/adm", "A")].rate == 50
    with pytest.raises(ValueError, match="callerKey 'A' needs perCaller = 1"):
        admin.set_limit(db, "/adm", 5, caller_key="A")
