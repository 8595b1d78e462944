"""On Redis Sentinel, a process hears slot grants on the master the sentinels name: for
asyncio limiters too (whose decision client only learns the master by awaiting it), and
after a failover, when the subscription moves to the promoted master by itself.

A waiter that hears no grants still gets its slot, by asking every 20 ms; these tests
check what only the subscription gives: a subscriber on the master (PUBSUB NUMSUB) and
the limiter's own account of it (``listening``)."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.backends.slots import slot_keys
from tests.support.clusters import LocalSentinel, wait_for
from tests.support.limiting import write_row
from tests.support.slots import handed_over_after_recovery, subscribers_on_master

URL = "/supplier/heard"

pytestmark = pytest.mark.slow


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    write_row(limiter_db[1], URL, rateLimit=1000, cache=0.5, maxConcurrent=1)
    return limiter_db


async def test_an_asyncio_limiter_hears_grants_on_the_sentinels_master(
    limiter_db: tuple[str, Engine], redis_sentinel: LocalSentinel, key_prefix: str
) -> None:
    async with AsyncGatewayLimiter(
        database_url=limiter_db[0],
        redis_url=redis_sentinel.url,
        key_prefix=key_prefix,
        reload_interval=3600,
    ) as alim:
        got: list[float] = []

        async def second() -> None:
            async with alim.slot(URL, timeout=5.0):
                got.append(time.monotonic())

        async with alim.slot(URL) as first:
            assert first.in_flight == 1
            # subscribed by the first slot taken (in a thread of its own)
            wait_for("the subscription", lambda: alim._slotting.listening, 5)
            assert subscribers_on_master(redis_sentinel, key_prefix) == 1
            waiter = asyncio.create_task(second())
            master = redis_sentinel.server_on(redis_sentinel.master_port()).client()
            queue = slot_keys(key_prefix, URL)[1]
            while master.zcard(queue) != 1:  # the waiter queued on the master
                assert not waiter.done()
                await asyncio.sleep(0.01)
            assert got == []
            let_go = time.monotonic()
        await asyncio.wait_for(waiter, 10)
        assert len(got) == 1 and got[0] - let_go < 0.5

    # closed with the limiter: no subscriber left on the master
    def closed() -> bool:
        return subscribers_on_master(redis_sentinel, key_prefix) == 0

    wait_for("the subscription to close", closed, 5)


def test_the_subscription_follows_a_failover_to_the_promoted_master(
    limiter_db: tuple[str, Engine], redis_sentinel: LocalSentinel, key_prefix: str
) -> None:
    # Last in this module: it kills the group's master.
    with GatewayLimiter(
        database_url=limiter_db[0],
        redis_url=redis_sentinel.url,
        key_prefix=key_prefix,
        reload_interval=3600,
        on_backend_error="local",
    ) as lim:
        with lim.slot(URL):
            pass
        wait_for("the subscription", lambda: lim._slotting.listening, 5)  # its own thread
        old = redis_sentinel.server_on(redis_sentinel.master_port())
        assert subscribers_on_master(redis_sentinel, key_prefix) == 1
        old.kill()
        wait_for("the sentinel to promote the replica",
                 lambda: redis_sentinel.master_port() != old.port, 30)  # fmt: skip
        # the subscriber reconnects by asking the sentinels, not to the dead address
        wait_for("a subscriber on the promoted master",
                 lambda: subscribers_on_master(redis_sentinel, key_prefix) == 1, 15)  # fmt: skip
        wait_for("the limiter to hear grants again", lambda: lim._slotting.listening, 5)

        # and a grant published there reaches a waiter of this process, once the
        # decisions, too, have moved to the promoted master (its leases hold the slot)
        promoted = redis_sentinel.server_on(redis_sentinel.master_port()).client()
        handed_over_after_recovery(lim, URL, key_prefix, promoted, "on the promoted master")
        assert lim._slotting.listening
