"""Timing loops: threads or coroutines calling one decision in a loop, warmed up and
then counted for a fixed time, and threads contending for one interface."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, field

import redis

#: Errors a call may raise that are counted, not fatal (timeouts on a loaded host).
REDIS_ERRORS = (redis.RedisError, OSError)
#: A decision: True when admitted (throughput cells).
Call = Callable[[], bool]
#: A contended attempt: (admitted, seconds the caller must wait before going ahead).
Attempt = Callable[[], tuple[bool, float]]


@dataclass(frozen=True)
class Slice:
    """One counted slice of one throughput cell."""

    admitted: float  # admitted calls per second
    refused: int  # calls refused although the limit is huge
    errors: int  # calls that raised a Redis error (a timeout, a lost connection)


def run_threads(threads: int, worker: Callable[[int, threading.Event], None]) -> None:
    """Run ``worker(i, halt)`` on ``threads`` daemon threads; re-raise the first error.

    ``halt`` is set when a worker fails or the main thread is interrupted (Ctrl-C), so
    every worker leaves its loop instead of talking to a Redis that is going away.
    """
    halt = threading.Event()
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            worker(i, halt)
        except BaseException as e:  # handed to the main thread
            errors.append(e)
            halt.set()

    pool = [
        threading.Thread(target=guarded, args=(i,), daemon=True, name=f"bench-{i}")
        for i in range(threads)
    ]
    try:
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    except BaseException:
        halt.set()
        raise
    if errors:
        raise errors[0]


def measure_slice(call: Call, threads: int, warmup: float, duration: float) -> Slice:
    """Warm up for ``warmup`` s, then count completed calls for ``duration`` s."""
    admitted = [0] * threads
    refused = [0] * threads
    errors = [0] * threads
    marks: dict[str, float] = {}

    def set_marks() -> None:
        now = time.perf_counter()
        marks["measure"] = now + warmup
        marks["end"] = now + warmup + duration

    barrier = threading.Barrier(threads, action=set_marks)

    def worker(i: int, halt: threading.Event) -> None:
        barrier.wait()
        clock, stopped = time.perf_counter, halt.is_set
        measure, end = marks["measure"], marks["end"]
        while clock() < measure and not stopped():
            with suppress(*REDIS_ERRORS):
                call()
        ok = bad = err = 0
        while clock() < end and not stopped():
            try:
                if call():
                    ok += 1
                else:
                    bad += 1
            except REDIS_ERRORS:  # counted, never fatal: a loaded host times out
                err += 1
        admitted[i], refused[i], errors[i] = ok, bad, err

    run_threads(threads, worker)
    rate = sum(admitted) / duration if duration else 0.0
    return Slice(rate, sum(refused), sum(errors))


def measure_throughput(
    calls: dict[str, Call],
    *,
    threads: int,
    rounds: int,
    prewarm: float,
    warmup: float,
    duration: float,
) -> dict[str, dict[int, list[Slice]]]:
    """Every cell (contender x 1 or ``threads`` threads), in ``rounds`` interleaved rounds.

    Each cell is warmed up once for ``prewarm`` s; then every round counts each cell for
    ``duration`` s after a ``warmup`` of its own, in an order rotated each round, so
    background load on a shared machine hits every contender alike.
    """
    names = list(calls)
    results: dict[str, dict[int, list[Slice]]] = {n: {1: [], threads: []} for n in names}
    for n in (1, threads):
        for name in names:  # connections opened, scripts loaded, code paths warm
            measure_slice(calls[name], n, prewarm, 0.0)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in (1, threads):
            for name in order:
                results[name][n].append(measure_slice(calls[name], n, warmup, duration))
    return results


@dataclass
class Contention:
    """What happened when threads hammered one contended interface."""

    calls: int = 0
    #: Time (perf_counter) each admitted caller went ahead, after any wait.
    released: list[float] = field(default_factory=list)
    #: For callers told to wait: release minus (decision returned + wait), seconds.
    lateness: list[float] = field(default_factory=list)
    #: For callers told to wait: release minus (call started + wait): adds the round trip.
    lateness_bound: list[float] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    #: Longest time from the call to going ahead, seconds.
    longest: float = 0.0
    start: float = 0.0
    errors: int = 0


def measure_contention(attempt: Attempt, threads: int, seconds: float) -> Contention:
    """``threads`` callers attempt back to back for ``seconds``; admitted ones wait as told."""
    per_thread = [Contention() for _ in range(threads)]
    marks: dict[str, float] = {}

    def set_marks() -> None:
        marks["start"] = time.perf_counter()

    barrier = threading.Barrier(threads, action=set_marks)

    def worker(i: int, halt: threading.Event) -> None:
        mine = per_thread[i]
        barrier.wait()
        clock, stopped = time.perf_counter, halt.is_set
        end = marks["start"] + seconds
        while not stopped():
            called = clock()
            if called >= end:
                break
            try:
                allowed, wait = attempt()
            except REDIS_ERRORS:
                mine.errors += 1
                continue
            returned = clock()
            mine.calls += 1
            if not allowed:
                continue
            if wait > 0:
                time.sleep(wait)  # as GatewayLimiter.try_acquire does
                released = clock()
                mine.waits.append(wait)
                mine.lateness.append(released - (returned + wait))
                mine.lateness_bound.append(released - (called + wait))
            else:
                released = returned
            mine.released.append(released)
            mine.longest = max(mine.longest, released - called)

    run_threads(threads, worker)
    total = Contention(start=marks["start"])
    for part in per_thread:
        total.calls += part.calls
        total.errors += part.errors
        total.released.extend(part.released)
        total.lateness.extend(part.lateness)
        total.lateness_bound.extend(part.lateness_bound)
        total.waits.extend(part.waits)
        total.longest = max(total.longest, part.longest)
    total.released.sort()
    return total


#: An awaitable decision: True when admitted (asyncio throughput cells).
AsyncCall = Callable[[], Awaitable[bool]]


async def measure_async_slice(call: AsyncCall, tasks: int, warmup: float, duration: float) -> Slice:
    """``tasks`` coroutines calling in a loop: warm up, then count for ``duration`` s."""
    counting = stop = False
    admitted = refused = errors = 0

    async def worker() -> None:
        nonlocal admitted, refused, errors
        while not stop:
            try:
                ok = await call()
            except REDIS_ERRORS:  # counted, never fatal: a loaded host times out
                if counting:
                    errors += 1
                await asyncio.sleep(0)  # an error may come without I/O: let the clock run
                continue
            if ok:
                if counting:
                    admitted += 1
            else:
                if counting:
                    refused += 1
                # A refusal on this huge limit is the failure policy deciding in-process,
                # with no I/O: without a yield the workers would spin and the slice
                # would never end.
                await asyncio.sleep(0)

    workers = [asyncio.create_task(worker()) for _ in range(tasks)]
    try:
        await asyncio.sleep(warmup)
        counting, began = True, time.perf_counter()
        await asyncio.sleep(duration)
        counting, took = False, time.perf_counter() - began
    finally:
        stop = True
        await asyncio.gather(*workers, return_exceptions=True)
    return Slice(admitted / took if duration else 0.0, refused, errors)
