"""An asyncio limiter's slot grants after a Sentinel failover: its subscriber (a thread of
its own, which asks the sentinels at each connect) resubscribes on the promoted master,
and a waiter of the limiter is handed its slot there.

A module of its own: the failover kills the group's master, and each module gets a
fresh group (``redis_sentinel``)."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from gateway_limiter.aio import AsyncGatewayLimiter
from tests.support.clusters import LocalSentinel
from tests.support.limiting import write_row
from tests.support.slots import (
    await_for,
    handed_over_after_recovery_async,
    subscribers_on_master,
)

URL = "/supplier/heard-async"

pytestmark = pytest.mark.slow


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    write_row(limiter_db[1], URL, rateLimit=1000, cache=0.5, maxConcurrent=1)
    return limiter_db


async def test_an_asyncio_limiters_subscription_follows_a_failover(
    limiter_db: tuple[str, Engine], redis_sentinel: LocalSentinel, key_prefix: str
) -> None:
    async with AsyncGatewayLimiter(
        database_url=limiter_db[0],
        redis_url=redis_sentinel.url,
        key_prefix=key_prefix,
        reload_interval=3600,
        on_backend_error="local",
    ) as alim:
        async with alim.slot(URL):
            pass
        await await_for("the subscription", lambda: alim._slotting.listening, 5)
        old = redis_sentinel.server_on(redis_sentinel.master_port())
        assert subscribers_on_master(redis_sentinel, key_prefix) == 1
        old.kill()

        def moved() -> bool:
            return redis_sentinel.master_port() != old.port

        def one_there() -> bool:
            return subscribers_on_master(redis_sentinel, key_prefix) == 1

        await await_for("the sentinel to promote the replica", moved, 30)
        # the subscriber reconnects by asking the sentinels, not to the dead address
        await await_for("a subscriber on the promoted master", one_there, 15)
        await await_for("the limiter to hear grants again", lambda: alim._slotting.listening, 5)

        promoted = redis_sentinel.server_on(redis_sentinel.master_port()).client()
        await handed_over_after_recovery_async(
            alim, URL, key_prefix, promoted, "on the promoted master"
        )
        assert alim._slotting.listening
