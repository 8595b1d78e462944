"""A refused ``slot()`` says why (no free slot, or no rate permit, within its timeout,
and the calls in flight against ``maxConcurrent``); an admitted one says how long it
waited in all (the queue, then the rate), threaded and asyncio alike."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.errors import Refused
from tests.support.limiting import write_row

URL = "/slow/book"
#: one permit a second, a burst of one: a second call has no rate permit for ~1 s
SCARCE = "/slow/scarce"
PLAIN = "/slow/plain"
#: how long the holders keep both slots before a waiter gets one
HOLD_S = 0.6
#: what a loaded host may add or take between the clocks read here and the limiter's:
#: the waiter enters the slot a little after the hold starts, and is back a little
#: after its wait ends
STALL_S = 0.3


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    write_row(limiter_db[1], URL, rateLimit=1000, cache=0.2, maxConcurrent=2)
    write_row(limiter_db[1], SCARCE, rateLimit=1, maxPermits=1, cache=0, maxConcurrent=5)
    write_row(limiter_db[1], PLAIN, rateLimit=1, maxPermits=1, cache=0)
    return limiter_db


def test_no_free_slot_names_the_url_the_timeout_and_the_calls_in_flight(
    lim: GatewayLimiter,
) -> None:
    no_free_slot_is_said(lim)


def no_free_slot_is_said(lim: GatewayLimiter) -> None:
    with lim.slot(URL), lim.slot(URL):
        with pytest.raises(Refused) as refused, lim.slot(URL, timeout=0.15):
            pytest.fail("a third call went in beside two")
        with pytest.raises(Refused) as at_once, lim.slot(URL, timeout=0):
            pytest.fail("a third call went in beside two")
    assert str(refused.value) == f"{URL}: no free slot within 0.15 s (2/2 in flight)"
    assert str(at_once.value) == f"{URL}: no free slot within 0 s (2/2 in flight)"
    assert refused.value.decision.reason == "limited"
    assert refused.value.decision.in_flight == 2


def test_no_rate_permit_is_told_apart_from_no_slot(lim: GatewayLimiter) -> None:
    with lim.slot(SCARCE), pytest.raises(Refused) as refused, lim.slot(SCARCE, timeout=0.05):
        pytest.fail("a second permit within a second of a rate of 1/s")
    assert re.fullmatch(
        rf"{SCARCE}: no rate permit within 0\.05 s \([0-2]/5 in flight\)", str(refused.value)
    ), str(refused.value)
    assert refused.value.decision.reason == "limited"
    assert refused.value.decision.waited == 0.0


def test_a_row_without_max_concurrent_says_the_same(lim: GatewayLimiter) -> None:
    with lim.slot(PLAIN):
        pass
    with pytest.raises(Refused) as refused, lim.slot(PLAIN, timeout=0.05):
        pytest.fail("a second permit within a second of a rate of 1/s")
    assert str(refused.value) == f"{PLAIN}: no rate permit within 0.05 s"
    assert refused.value.decision.reason == "limited"


def _hold_both(lim: GatewayLimiter, release: threading.Event) -> list[threading.Thread]:
    """Two threads that hold both slots of URL until ``release`` (both held on return)."""

    def hold() -> None:
        with lim.slot(URL, timeout=5):
            release.wait(10)

    holders = [threading.Thread(target=hold) for _ in range(2)]
    for t in holders:
        t.start()
    deadline = time.monotonic() + 5
    while lim.in_flight(URL) != 2:
        assert time.monotonic() < deadline, "the holders never held both slots"
        time.sleep(0.005)
    return holders


def test_waited_counts_the_seconds_queued_for_a_slot(lim: GatewayLimiter) -> None:
    waited_counts_the_queue(lim)


@pytest.mark.parametrize("limiter_redis_url", ["memory://"])
def test_slots_counted_in_the_process_say_the_same(lim: GatewayLimiter) -> None:
    no_free_slot_is_said(lim)
    waited_counts_the_queue(lim)


def waited_counts_the_queue(lim: GatewayLimiter) -> None:
    with lim.slot(URL) as at_once:
        assert at_once.waited == 0.0  # a free slot and a permit: no wait at all
    release = threading.Event()
    holders = _hold_both(lim, release)
    timer = threading.Timer(HOLD_S, release.set)
    started = time.monotonic()
    timer.start()
    try:
        with lim.slot(URL, timeout=5) as queued:
            took = time.monotonic() - started
    finally:
        release.set()
        for t in holders:
            t.join(10)
    # it waited at least the hold, and no more than the call took (a loaded box adds)
    assert HOLD_S - STALL_S <= queued.waited <= took + 0.001, (queued.waited, took)
    assert took - queued.waited < STALL_S


async def test_asyncio_refusals_and_waits_say_the_same(alim: AsyncGatewayLimiter) -> None:
    async with alim.slot(URL) as at_once:
        assert at_once.waited == 0.0
    release = asyncio.Event()
    held = 0

    async def hold() -> None:
        nonlocal held
        async with alim.slot(URL, timeout=5):
            held += 1
            await release.wait()

    holders = [asyncio.create_task(hold()) for _ in range(2)]
    try:
        async with asyncio.timeout(5):
            while held != 2:
                await asyncio.sleep(0.005)
        with pytest.raises(Refused) as refused:
            async with alim.slot(URL, timeout=0.15):
                pytest.fail("a third call went in beside two")
        assert str(refused.value) == f"{URL}: no free slot within 0.15 s (2/2 in flight)"
        asyncio.get_running_loop().call_later(HOLD_S, release.set)
        started = time.monotonic()
        async with alim.slot(URL, timeout=5) as queued:
            took = time.monotonic() - started
    finally:
        release.set()
        await asyncio.gather(*holders)
    assert HOLD_S - STALL_S <= queued.waited <= took + 0.001, (queued.waited, took)
    assert took - queued.waited < STALL_S
    async with alim.slot(SCARCE):
        pass
    with pytest.raises(Refused) as no_permit:
        async with alim.slot(SCARCE, timeout=0.05):
            pytest.fail("a second permit within a second of a rate of 1/s")
    assert re.fullmatch(
        rf"{SCARCE}: no rate permit within 0\.05 s \([0-2]/5 in flight\)", str(no_permit.value)
    ), str(no_permit.value)
