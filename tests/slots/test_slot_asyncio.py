"""``AsyncGatewayLimiter.slot``: the same slots, awaited; cancellation gives them back."""

from __future__ import annotations

import asyncio
from functools import partial

import pytest
import redis
from sqlalchemy import Engine

from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.backends.slots import slot_keys
from gateway_limiter.errors import Refused
from tests.support.limiting import evalsha_calls, write_row
from tests.support.waiting import wait_for_async

URL = "/supplier/book"


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    write_row(limiter_db[1], URL, rateLimit=1000, cache=0.2, maxConcurrent=2)
    return limiter_db


def queued(client: redis.Redis, prefix: str) -> int:
    """Callers in the slot queue of URL, as Redis holds it."""
    return int(client.zcard(slot_keys(prefix, URL)[1]))


def queued_are(client: redis.Redis, prefix: str, callers: int) -> bool:
    return queued(client, prefix) == callers


async def test_slots_are_held_and_given_back(
    alim: AsyncGatewayLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    async with alim.slot(URL) as first, alim.slot(URL) as second:
        assert (first.in_flight, second.in_flight) == (1, 2)
        assert [s.in_flight for s in await alim.status()] == [2]
        with pytest.raises(Refused):
            async with alim.slot(URL, timeout=0.05):
                pytest.fail("a third call went in beside two")
    assert redis_client.zcard(slot_keys(key_prefix, URL)[0]) == 0
    assert await alim.in_flight(URL) == 0


async def test_a_cancelled_holder_gives_its_slot_back(
    alim: AsyncGatewayLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    inside = asyncio.Event()

    async def hold() -> None:
        async with alim.slot(URL):
            inside.set()
            await asyncio.Event().wait()  # held until cancelled

    task = asyncio.create_task(hold())
    await asyncio.wait_for(inside.wait(), 5)
    assert redis_client.zcard(slot_keys(key_prefix, URL)[0]) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert redis_client.zcard(slot_keys(key_prefix, URL)[0]) == 0


async def test_a_cancelled_waiter_holds_nothing_and_the_queue_moves_on(
    alim: AsyncGatewayLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    async with alim.slot(URL), alim.slot(URL):
        waiter = asyncio.create_task(alim.slot(URL, timeout=5).__aenter__())
        await wait_for_async(lambda: queued(redis_client, key_prefix) == 1, 5, "the waiter queued")
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
    # both slots back; a newcomer is not held up behind the cancelled waiter for long
    async with alim.slot(URL, timeout=3.0) as decision:
        assert decision.in_flight == 1
    assert redis_client.zcard(slot_keys(key_prefix, URL)[0]) == 0


async def test_waiters_are_woken_by_a_release_in_arrival_order(
    alim: AsyncGatewayLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    order: list[int] = []
    leave = [asyncio.Event() for _ in range(6)]  # holders 0-1, then waiters 2-5

    async def hold(n: int) -> None:
        async with alim.slot(URL, timeout=5.0):
            order.append(n)
            await leave[n].wait()

    tasks = [asyncio.create_task(hold(n)) for n in range(2)]
    while len(order) < 2:
        await asyncio.sleep(0.01)
    for n in range(2, 6):
        tasks.append(asyncio.create_task(hold(n)))
        # each is queued before the next arrives
        await wait_for_async(partial(queued_are, redis_client, key_prefix, n - 1), 5)
    # one slot at a time: whoever leaves, the longest waiter goes next
    for n, leaving in enumerate((1, 0, 3, 2)):
        leave[leaving].set()
        while len(order) < 3 + n:
            await asyncio.sleep(0.005)
    for event in leave:
        event.set()
    await asyncio.gather(*tasks)
    assert sorted(order[:2]) == [0, 1]  # the holders went in together
    assert order[2:] == [2, 3, 4, 5]


async def test_an_asyncio_waiter_is_handed_the_slot_without_asking_again(
    alim: AsyncGatewayLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    inside, leave = asyncio.Event(), asyncio.Event()

    async def wait() -> None:
        async with alim.slot(URL, timeout=5.0) as decision:
            assert decision.allowed and decision.in_flight == 2
            inside.set()
            await leave.wait()

    async with alim.slot(URL):
        async with alim.slot(URL):
            before = evalsha_calls(redis_client)
            waiter = asyncio.create_task(wait())
            while redis_client.zcard(slot_keys(key_prefix, URL)[1]) != 1:
                await asyncio.sleep(0.005)
        await asyncio.wait_for(inside.wait(), 5)
        # the waiter's take (queued) and the release that handed it the slot
        assert evalsha_calls(redis_client) - before == 2
        leave.set()
        await waiter
