"""A release hands the freed slot straight to the first caller queued (``slot.lua``):
the waiter is woken and goes without asking again, in arrival order across limiters;
the rate is still decided for it; a grant nobody claims lapses, and one given up is
passed on."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.backends.scripts import Commands
from gateway_limiter.backends.slots import (
    QUEUED,
    TAKEN,
    SlotReply,
    channel,
    parse_counts,
    parse_grant,
    parse_take,
    release_call,
    renew_call,
    slot_keys,
    take_call,
)
from gateway_limiter.core.decision import Decision
from gateway_limiter.errors import Refused
from tests.support.limiting import evalsha_calls, limiter, write_row

URL = "/supplier/seat"
SLOW = "/supplier/slow-rate"


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    write_row(limiter_db[1], URL, rateLimit=1000, cache=5.0, maxConcurrent=1)
    write_row(limiter_db[1], SLOW, rateLimit=1, cache=5.0, maxConcurrent=1)
    return limiter_db


@pytest.fixture
def limiter_settings() -> dict[str, Any]:
    return {"reload_interval": 3600}


def _queued(client: redis.Redis, prefix: str, n: int) -> None:
    """Wait until ``n`` callers are queued for URL."""
    deadline = time.monotonic() + 5
    while client.zcard(slot_keys(prefix, URL)[1]) != n:
        assert time.monotonic() < deadline, f"never {n} queued"
        time.sleep(0.005)


def test_a_queued_waiter_gets_the_slot_without_asking_again(
    lim: GatewayLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    got: list[Decision] = []
    inside, leave = threading.Event(), threading.Event()

    def wait() -> None:
        with lim.slot(URL) as decision:
            got.append(decision)
            inside.set()
            leave.wait(5)

    waiter = threading.Thread(target=wait)
    with lim.slot(URL):
        before = evalsha_calls(redis_client)
        waiter.start()
        _queued(redis_client, key_prefix, 1)
    assert inside.wait(5)
    # its take (queued) and the holder's release: the hand-over cost no third call
    assert evalsha_calls(redis_client) - before == 2
    assert got[0].allowed and got[0].in_flight == 1
    assert redis_client.zcard(slot_keys(key_prefix, URL)[0]) == 1  # the waiter holds it
    assert redis_client.zcard(slot_keys(key_prefix, URL)[1]) == 0
    leave.set()
    waiter.join(5)
    assert redis_client.zcard(slot_keys(key_prefix, URL)[0]) == 0


@pytest.fixture
def second(
    limiter_db: tuple[str, Engine], limiter_redis_url: str, key_prefix: str
) -> Iterator[GatewayLimiter]:
    """Another limiter on the same Redis and prefix: another process, as far as the
    slots are concerned (its own subscriber and lease ids)."""
    other = limiter(limiter_db[0], limiter_redis_url, key_prefix, reload_interval=3600)
    yield other
    other.close()


def test_slots_go_in_arrival_order_across_limiters(
    lim: GatewayLimiter, second: GatewayLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    order: list[str] = []

    def wait(name: str, limiter_: GatewayLimiter) -> None:
        with limiter_.slot(URL, timeout=5.0):
            order.append(name)

    waiters = []
    with lim.slot(URL):
        for n, (name, limiter_) in enumerate(
            [("b1", second), ("a1", lim), ("b2", second), ("a2", lim)], start=1
        ):
            waiters.append(threading.Thread(target=wait, args=(name, limiter_)))
            waiters[-1].start()
            _queued(redis_client, key_prefix, n)
    for t in waiters:
        t.join(10)
    assert order == ["b1", "a1", "b2", "a2"]


def test_a_waiter_the_rate_refuses_at_the_hand_over_is_told_at_once(
    lim: GatewayLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    refused: list[tuple[float, Refused]] = []

    def wait() -> None:
        try:
            with lim.slot(SLOW, timeout=1.5):
                pytest.fail("admitted though the rate owes 3 s")
        except Refused as e:
            refused.append((time.monotonic(), e))

    waiter = threading.Thread(target=wait)
    with lim.slot(SLOW):
        waiter.start()
        deadline = time.monotonic() + 5
        while redis_client.zcard(slot_keys(key_prefix, SLOW)[1]) != 1:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        # the rate (1/s) now owes 3 s, more than the waiter's budget of 1.5 s
        rule = lim.registry.snapshot.rules[SLOW]
        assert lim.backend.reserve(rule, 3, 10.0).allowed
        released = time.monotonic()
    waiter.join(5)
    assert len(refused) == 1
    at, error = refused[0]
    assert error.decision.reason == "limited"
    assert at - released < 1.0  # told by the hand-over, not at the end of its 1.5 s
    assert redis_client.zcard(slot_keys(key_prefix, SLOW)[0]) == 0  # the slot stays free
    assert redis_client.zcard(slot_keys(key_prefix, SLOW)[1]) == 0


# --- the script itself: what a waiter that missed its message, gave up or died finds ---


def _take(lim: GatewayLimiter, prefix: str, lease_id: str, lease_s: float = 10.0) -> SlotReply:
    rule = lim.registry.snapshot.rules[URL]
    call = take_call(Commands(prefix), prefix, rule, 5.0, None, lease_id, lease_s, 2.0)
    return parse_take(lim.backend.script(call))


def _release(lim: GatewayLimiter, prefix: str, lease_id: str) -> tuple[int, int]:
    call = release_call(prefix, URL, lease_id, 1, 10.0)
    return parse_counts(lim.backend.script(call))


def _in_flight(lim: GatewayLimiter, prefix: str) -> int:
    reply = lim.backend.script(renew_call(prefix, URL, [], 10.0))
    return parse_counts(reply)[1]


def test_a_grant_is_kept_for_a_waiter_that_missed_its_message(
    lim: GatewayLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    pubsub = redis_client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    pubsub.subscribe(channel(key_prefix))
    assert _take(lim, key_prefix, "h").state == TAKEN
    assert _take(lim, key_prefix, "w").state == QUEUED
    assert _release(lim, key_prefix, "h") == (1, 1)  # handed over: still one held
    message = None
    deadline = time.monotonic() + 5
    while message is None and time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.1)
    pubsub.close()
    assert message is not None
    lease_id, granted = parse_grant(message["data"])
    assert lease_id == "w" and granted.state == TAKEN and granted.in_flight == 1
    assert granted.verdict is not None and granted.verdict.allowed
    # "w" asks again (it never heard): the same grant, taken once
    again = _take(lim, key_prefix, "w")
    assert again.state == TAKEN and again.in_flight == 1 and again.verdict == granted.verdict
    assert redis_client.hlen(slot_keys(key_prefix, URL)[5]) == 0
    assert _release(lim, key_prefix, "w") == (1, 0)


def test_a_slot_granted_to_a_waiter_that_gives_up_goes_to_the_next(
    lim: GatewayLimiter, key_prefix: str
) -> None:
    assert _take(lim, key_prefix, "h").state == TAKEN
    assert _take(lim, key_prefix, "w1").state == QUEUED
    assert _take(lim, key_prefix, "w2").state == QUEUED
    _release(lim, key_prefix, "h")  # to w1, which is giving up at that moment
    assert _release(lim, key_prefix, "w1") == (1, 1)  # its give-up hands the slot on
    assert _take(lim, key_prefix, "w2").state == TAKEN  # w2's grant, found on asking
    assert _take(lim, key_prefix, "late").state == QUEUED
    assert _in_flight(lim, key_prefix) == 1


def test_a_grant_nobody_claims_lapses_with_its_lease(
    lim: GatewayLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    lease_s = 0.3
    assert _take(lim, key_prefix, "h", lease_s).state == TAKEN
    assert _take(lim, key_prefix, "dead", lease_s).state == QUEUED  # then its process died
    _release(lim, key_prefix, "h")
    assert _in_flight(lim, key_prefix) == 1  # granted to "dead", leased for 0.3 s
    # real time: the lease lapses on Redis' clock
    time.sleep(lease_s + 0.1)
    assert _in_flight(lim, key_prefix) == 0
    assert _take(lim, key_prefix, "next").state == TAKEN
    assert redis_client.hlen(slot_keys(key_prefix, URL)[5]) == 0  # the grant went with it


def test_a_refused_hand_over_takes_nothing_and_tells_the_waiter(
    lim: GatewayLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    rule = lim.registry.snapshot.rules[URL]
    commands = Commands(key_prefix)
    assert _take(lim, key_prefix, "h").state == TAKEN
    # a waiter with no budget left for the rate: queued with 0.2 s, and the rate owes more
    call = take_call(commands, key_prefix, rule, 0.2, None, "w", 10.0, 2.0)
    assert parse_take(lim.backend.script(call)).state == QUEUED
    assert lim.backend.reserve(rule, 3000, 10.0).allowed  # the 1,000 saved, then 2 s owed
    assert _release(lim, key_prefix, "h") == (1, 0)
    assert _in_flight(lim, key_prefix) == 0
    assert redis_client.zcard(slot_keys(key_prefix, URL)[1]) == 0
    # not queued any more: it asks as a newcomer, with 5 s to wait for the rate this time
    again = _take(lim, key_prefix, "w")
    assert again.state == TAKEN and again.verdict is not None
    # what the rate owed, still owed: 2 s, plus up to the 1 ms the take's own permit had
    # not yet refilled when the reserve ran (on a fast host, under 1 ms later)
    assert 1.5e6 < again.verdict.wait_us <= 2.001e6


async def test_a_caller_cancelled_in_the_rate_s_wait_gives_its_slot_back(
    alim: AsyncGatewayLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    leases = slot_keys(key_prefix, SLOW)[0]
    async with alim.slot(SLOW):  # spends the one permit: the next waits ~1 s for the rate
        pass
    task = asyncio.create_task(alim.slot(SLOW, timeout=5.0).__aenter__())
    deadline = time.monotonic() + 5
    while redis_client.zcard(leases) != 1:  # the slot is held through the rate's wait
        assert time.monotonic() < deadline and not task.done()
        await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert redis_client.zcard(leases) == 0


def test_without_a_subscription_a_waiter_finds_its_grant_by_asking(
    limiter_db: tuple[str, Engine],
    limiter_redis_url: str,
    redis_client: redis.Redis,
    key_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # as while the subscription is lost (or none can be made): waiters ask often
    monkeypatch.setattr("gateway_limiter.backends.redis.redis_connect", lambda *_: None)
    unheard = limiter(limiter_db[0], limiter_redis_url, key_prefix, reload_interval=3600)
    try:
        order: list[int] = []

        def wait(n: int) -> None:
            with unheard.slot(URL, timeout=5.0):
                order.append(n)

        waiters = [threading.Thread(target=wait, args=(n,)) for n in range(3)]
        with unheard.slot(URL):
            assert not unheard._slotting.listening
            for n, t in enumerate(waiters, start=1):
                t.start()
                deadline = time.monotonic() + 5
                while redis_client.zcard(slot_keys(key_prefix, URL)[1]) != n:
                    assert time.monotonic() < deadline
                    time.sleep(0.005)
            released = time.monotonic()
        for t in waiters:
            t.join(5)
        took = time.monotonic() - released
        assert order == [0, 1, 2]  # each handed the slot in turn, found on its next ask
        assert took < 2.0  # asks every 20 ms, not once a second
    finally:
        unheard.close()


#: Rewrites a queued waiter's ask of the rate into the form a version before the packed
#: bucket config stored: bucket.lua's arguments as text, the budget at the 4th.
AS_AN_EARLIER_VERSION_ASKED = """
local ask = cmsgpack.unpack(redis.call("HGET", KEYS[1], ARGV[1]))
local rate, capacity = struct.unpack("<dd", ask[3][1])
ask[3] = {tostring(rate), tostring(capacity), ask[3][2], ask[3][3]}
ask[4] = 4
redis.call("HSET", KEYS[1], ARGV[1], cmsgpack.pack(ask))
return ask[3]
"""


def test_a_waiter_queued_by_an_earlier_version_is_handed_its_slot(
    lim: GatewayLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    # A rolling upgrade: a process of the earlier version queued "old"; this one releases.
    assert _take(lim, key_prefix, "h").state == TAKEN
    assert _take(lim, key_prefix, "old").state == QUEUED
    keys = slot_keys(key_prefix, URL)
    text = redis_client.eval(AS_AN_EARLIER_VERSION_ASKED, 1, keys[4], "old")
    assert text[:2] == [b"1000", b"1000"]  # the rate and capacity, as text
    assert _release(lim, key_prefix, "h") == (1, 1)  # handed over: still one held
    assert redis_client.hexists(keys[5], "old")  # the grant, kept until "old" asks
    again = _take(lim, key_prefix, "old")
    assert again.state == TAKEN and again.in_flight == 1
    assert again.verdict is not None and again.verdict.allowed
