"""Slots in the metrics (in flight, waits, refusals), and on Redis Cluster and Sentinel
(every key of one interface under its hash tag; releases heard through the one
subscriber)."""

from __future__ import annotations

import threading
import time

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.backends.slots import slot_keys
from gateway_limiter.errors import Refused
from tests.support.clusters import LocalCluster, LocalSentinel
from tests.support.limiting import write_row

URL = "/supplier/observed"
#: an interface under a channel cap: its keys carry the channel's hash tag
CAPPED = "/supplier/capped"


def _sample(name: str) -> float:
    return REGISTRY.get_sample_value(name, {"interface": URL}) or 0.0


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    write_row(limiter_db[1], URL, rateLimit=1000, cache=0.5, maxConcurrent=1)
    write_row(limiter_db[1], CAPPED, rateLimit=1000, cache=0.5, maxConcurrent=1, channelType="B2B")
    write_row(limiter_db[1], "*", rateLimit=1000, cache=0.5, channelType="B2B")
    return limiter_db


def test_in_flight_waits_and_refusals_are_in_the_metrics(lim: GatewayLimiter) -> None:
    waits = _sample("gateway_limiter_slot_waits_total")
    refusals = _sample("gateway_limiter_slot_refusals_total")
    with lim.slot(URL):
        assert _sample("gateway_limiter_in_flight") == 1
        with pytest.raises(Refused), lim.slot(URL, timeout=0.05):
            pass
    assert _sample("gateway_limiter_slot_waits_total") == waits + 1
    assert _sample("gateway_limiter_slot_refusals_total") == refusals + 1
    assert _sample("gateway_limiter_in_flight") == 0


def _one_at_a_time(lim: GatewayLimiter, queue: str, url: str = URL) -> None:
    """Two callers on a cap of 1: the second gets the slot when the first gives it back
    (``queue``: the interface's queue key, where the second is seen waiting)."""
    got: list[float] = []

    def second() -> None:
        with lim.slot(url, timeout=5.0):
            got.append(time.monotonic())

    with lim.slot(url) as first:
        assert first.in_flight == 1
        waiter = threading.Thread(target=second)
        waiter.start()
        queued_by = time.monotonic() + 5.0
        while not lim.backend.client.zcard(queue):  # its place in the queue, not a guess
            assert time.monotonic() < queued_by, "the second caller never queued"
            time.sleep(0.005)
        assert got == []
        let_go = time.monotonic()
    waiter.join(10)
    assert len(got) == 1
    assert got[0] - let_go < 0.5  # heard, not found by asking again a second later


@pytest.mark.slow
def test_slots_on_redis_cluster(
    limiter_db: tuple[str, Engine], redis_cluster: LocalCluster, key_prefix: str
) -> None:
    with GatewayLimiter(
        database_url=limiter_db[0],
        redis_url=redis_cluster.url,
        key_prefix=key_prefix,
        reload_interval=3600,
    ) as lim:
        _one_at_a_time(lim, slot_keys(key_prefix, URL)[1])


@pytest.mark.slow
def test_slots_of_a_channel_capped_interface_on_redis_cluster(
    limiter_db: tuple[str, Engine], redis_cluster: LocalCluster, key_prefix: str
) -> None:
    leases = slot_keys(key_prefix, CAPPED, "B2B")[0]
    # under the channel's hash tag, beside the interface's limits: one Cluster slot
    assert leases == f"{key_prefix}:{{=B2B}}:{CAPPED}:slots"
    with GatewayLimiter(
        database_url=limiter_db[0],
        redis_url=redis_cluster.url,
        key_prefix=key_prefix,
        reload_interval=3600,
        on_backend_error="deny",  # a call Redis refused would fail, not fall back
    ) as lim:
        client = lim.backend.client
        with lim.slot(CAPPED) as decision:
            assert decision.allowed and decision.in_flight == 1
            assert client.zcard(leases) == 1
        assert client.zcard(leases) == 0
        _one_at_a_time(lim, slot_keys(key_prefix, CAPPED, "B2B")[1], CAPPED)
        assert lim.in_flight(CAPPED) == 0


@pytest.mark.slow
def test_slots_through_sentinel(
    limiter_db: tuple[str, Engine], redis_sentinel: LocalSentinel, key_prefix: str
) -> None:
    with GatewayLimiter(
        database_url=limiter_db[0],
        redis_url=redis_sentinel.url,
        key_prefix=key_prefix,
        reload_interval=3600,
    ) as lim:
        _one_at_a_time(lim, slot_keys(key_prefix, URL)[1])


@pytest.mark.slow
async def test_asyncio_slots_on_redis_cluster(
    limiter_db: tuple[str, Engine], redis_cluster: LocalCluster, key_prefix: str
) -> None:
    async with AsyncGatewayLimiter(
        database_url=limiter_db[0],
        redis_url=redis_cluster.url,
        key_prefix=key_prefix,
        reload_interval=3600,
    ) as alim:
        async with alim.slot(URL) as decision:
            assert decision.in_flight == 1
            with pytest.raises(Refused):
                async with alim.slot(URL, timeout=0.05):
                    pass
        assert await alim.in_flight(URL) == 0
