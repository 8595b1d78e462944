"""``limiter.slot``: one slot per call in flight, given back whatever ends the block."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.backends.slots import slot_keys
from gateway_limiter.core.slots import BUSY_RETRY_AFTER_S
from gateway_limiter.errors import Refused
from tests.support.limiting import evalsha_calls, write_row

URL = "/supplier/search"


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    write_row(limiter_db[1], URL, rateLimit=1000, cache=0.2, maxConcurrent=2)
    write_row(limiter_db[1], "/rate-only", rateLimit=1000, cache=0.2)
    return limiter_db


def test_a_slot_is_held_while_the_block_runs_and_given_back_after(
    lim: GatewayLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    leases = slot_keys(key_prefix, URL)[0]
    with lim.slot(URL) as first:
        assert first.allowed and first.in_flight == 1
        assert redis_client.zcard(leases) == 1
        with lim.slot(URL) as second:
            assert second.in_flight == 2
            assert lim.in_flight(URL) == 2
    assert redis_client.zcard(leases) == 0
    assert lim.in_flight(URL) == 0


def test_no_free_slot_within_the_timeout_is_refused_with_the_decision(lim: GatewayLimiter) -> None:
    with lim.slot(URL), lim.slot(URL):
        started = time.monotonic()
        with pytest.raises(Refused) as refused, lim.slot(URL, timeout=0.1):
            pytest.fail("a third call went in beside two")
        waited = time.monotonic() - started
    assert refused.value.decision.reason == "limited"
    assert refused.value.decision.in_flight == 2
    assert 0.09 <= waited < 2.0  # it waited its timeout, and no more than a loaded box adds
    # "soon", not the 10 s lease: a slot frees when a call ends, which nobody foresees
    retry_after = refused.value.decision.retry_after
    assert retry_after is not None and 0 < retry_after <= BUSY_RETRY_AFTER_S


def test_the_slot_is_given_back_when_the_block_raises(
    lim: GatewayLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    with pytest.raises(KeyError), lim.slot(URL):
        raise KeyError("boom")
    assert redis_client.zcard(slot_keys(key_prefix, URL)[0]) == 0


def test_a_waiter_gets_a_released_slot_promptly(
    lim: GatewayLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    entered = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with lim.slot(URL):
            entered.set()
            release.wait(5)

    holders = [threading.Thread(target=hold) for _ in range(2)]
    for t in holders:
        t.start()
    assert entered.wait(5)
    held_by = time.monotonic() + 5.0
    while lim.in_flight(URL) != 2:
        assert time.monotonic() < held_by, "the holders never held both slots"
        time.sleep(0.005)
    got: list[float] = []

    def wait_for_one() -> None:
        with lim.slot(URL, timeout=5.0):
            got.append(time.monotonic())

    waiter = threading.Thread(target=wait_for_one)
    waiter.start()
    queue = slot_keys(key_prefix, URL)[1]
    deadline = time.monotonic() + 5.0
    while not redis_client.zcard(queue) and time.monotonic() < deadline:
        time.sleep(0.005)  # the waiter's place in the queue, not a guess at when
    assert redis_client.zcard(queue) == 1
    assert got == []
    released = time.monotonic()
    release.set()
    waiter.join(5)
    for t in holders:
        t.join(5)
    assert len(got) == 1
    # within ~10 ms of the release on an idle box; a loaded 2-core box adds scheduling
    assert got[0] - released < 0.25


def test_taking_and_giving_back_a_slot_is_two_round_trips(
    lim: GatewayLimiter, redis_client: redis.Redis
) -> None:
    before = evalsha_calls(redis_client)
    with lim.slot(URL):
        pass
    assert evalsha_calls(redis_client) - before == 2


def test_an_interface_without_max_concurrent_is_decided_on_its_rate(lim: GatewayLimiter) -> None:
    with lim.slot("/rate-only") as decision:
        assert decision.allowed and decision.in_flight is None
    with lim.slot("/not-configured") as decision:
        assert decision.reason == "not_configured"


@pytest.mark.parametrize("limiter_redis_url", ["memory://"])
def test_on_memory_the_slots_are_this_process_s(lim: GatewayLimiter) -> None:
    with lim.slot(URL) as first, lim.slot(URL) as second:
        assert (first.in_flight, second.in_flight) == (1, 2)  # this one included
        with pytest.raises(Refused), lim.slot(URL, timeout=0.05):
            pytest.fail("a third call went in beside two")
        assert lim.in_flight(URL) == 2
    assert lim.in_flight(URL) == 0


def test_a_waiter_that_gives_up_leaves_the_queue_at_once(
    lim: GatewayLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    queue = slot_keys(key_prefix, URL)[1]
    with lim.slot(URL):
        with lim.slot(URL), pytest.raises(Refused), lim.slot(URL, timeout=0.1):
            pytest.fail("a third call went in beside two")
        assert redis_client.zcard(queue) == 0
        # one slot free, nobody queued: a caller that will not wait gets it
        with lim.slot(URL, timeout=0) as decision:
            assert decision.in_flight == 2
    with lim.slot(URL), lim.slot(URL), pytest.raises(Refused), lim.slot(URL, timeout=0):
        pytest.fail("a third call went in beside two")
    assert redis_client.zcard(queue) == 0  # timeout 0: it never took a place
