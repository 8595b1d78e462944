#!/usr/bin/env python
"""Overload: callers demanding far more than one interface's rate, side by side.

Run from the checkout, with the venv's Python::

    python bench/overload.py            # full run, about 40 s
    python bench/overload.py --quick    # smoke run, about 15 s

One private ``redis-server`` (free port, no persistence), started and stopped by this
run. First the bare floor is measured: redis-py ``EVALSHA`` of ``return 1`` from 8
threads (what one round trip per decision can reach at best). The interface's rate R
is then a tenth of that floor, rounded down, so that even a limiter that made one round
trip per call at floor speed would face 10x its rate; every contender is then driven
as hard as it goes, by 8 threads and by 256 coroutines, with no pause between calls.

Rows: the floor; gateway-limiter ``try_acquire(url)`` on a row of ``rateLimit`` R,
``maxPermits`` R/10 and ``cache`` 0 (refuse at once), as shipped (hopeless callers are
refused in-process) and with that fast path switched off (every call a round trip, as
before it existed); ``limits`` moving window and pyrate-limiter (its Redis sliding-window
log and its Redis token bucket) at R per second. Cells are measured in interleaved
rounds (each contender once per round, order rotated), so background load hits all
alike.

Columns: decisions per second (admitted and refused), that as a multiple of the floor,
admitted per second, and the most admitted in one counted slice against what the
contender's own algorithm allows in it (token bucket: R x slice + capacity; window:
R per started second).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import uuid
from collections.abc import Awaitable, Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import redis
import redis.asyncio

# Run as a script from anywhere: the checkout's package wins over any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness.args import description, positive_int
from bench.harness.limiters import sqlite_table, started_limiter
from bench.harness.report import load_average, machine_facts, table
from bench.harness.servers import private_redis
from bench.harness.stats import median
from bench.harness.timing import Slice, measure_async_slice, measure_slice
from gateway_limiter import GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter

URL = "/bench/overloaded"
THREADS = 8
TASKS = 256


@dataclass(frozen=True)
class Plan:
    """How long the floor is measured, and each cell after its warm-up, in how many rounds."""

    floor_seconds: float
    warmup: float
    duration: float
    rounds: int


FULL = Plan(floor_seconds=1.0, warmup=0.2, duration=1.0, rounds=3)
QUICK = Plan(floor_seconds=0.5, warmup=0.1, duration=0.5, rounds=2)


@dataclass(frozen=True)
class Cell:
    """One contender's counted slice: what it decided, admitted and failed."""

    decisions: float  # per second, admitted and refused
    admitted: int  # in the counted slice
    errors: int


@dataclass(frozen=True)
class Contender:
    """One implementation under test: its threaded and asyncio calls, and its bound."""

    name: str
    sync: Callable[[], bool] | None
    aio: Callable[[], Awaitable[bool]] | None
    bound: Callable[[float], float]  # most it may admit in a slice of that many seconds
    bound_text: str


# --------------------------------------------------------------------------- measuring


def measure_threads(call: Callable[[], bool], warmup: float, duration: float) -> Cell:
    """8 threads calling as fast as they go (``harness.timing.measure_slice``)."""
    return cell_of(measure_slice(call, THREADS, warmup, duration), duration)


async def measure_tasks(
    call: Callable[[], Awaitable[bool]], warmup: float, duration: float
) -> Cell:
    """256 coroutines on one loop (``harness.timing.measure_async_slice``)."""
    return cell_of(await measure_async_slice(call, TASKS, warmup, duration), duration)


def cell_of(counted: Slice, duration: float) -> Cell:
    """A slice's admitted rate and refusal count as decisions per second and admissions."""
    admitted = round(counted.admitted * duration)
    return Cell((admitted + counted.refused) / duration, admitted, counted.errors)


# --------------------------------------------------------------------------- contenders


def gateway_limiters(
    stack: ExitStack, redis_url: str, run_id: str, rate: int, capacity: int
) -> tuple[GatewayLimiter, GatewayLimiter]:
    """Two limiters on one temporary SQLite row: as shipped, and without the fast path.
    They keep separate buckets (key prefixes), so neither eats the other's permits."""
    database_url = sqlite_table(
        stack,
        {URL: {"rate_limit": rate, "max_permits": capacity, "cache": 0.0}},
        prefix="gwl-overload-",
    )
    # on_backend_error="deny" (started_limiter's): a Redis error shows as an error, not
    # as local work.
    made = [
        started_limiter(stack, database_url, redis_url, f"gwlover{run_id}{name}")
        for name in ("fast", "slow")
    ]
    made[1]._local_refusals = None  # fast path off: every call asks Redis, as before it existed
    return made[0], made[1]


def peers(stack: ExitStack, redis_url: str, run_id: str, rate: int) -> list[Contender]:
    """limits and pyrate-limiter at ``rate`` per second on the same Redis."""
    from limits import RateLimitItemPerSecond
    from limits.aio.storage import RedisStorage as AsyncRedisStorage
    from limits.aio.strategies import MovingWindowRateLimiter as AsyncMovingWindow
    from limits.storage import storage_from_string
    from limits.strategies import MovingWindowRateLimiter
    from pyrate_limiter import (
        Duration,
        Limiter,
        Rate,
        RedisBucket,
        RedisStateStore,
        StateBucket,
        TokenBucket,
    )

    item = RateLimitItemPerSecond(rate)
    storage = storage_from_string(redis_url)
    stack.callback(storage.storage.connection_pool.disconnect)  # type: ignore[union-attr]
    moving = MovingWindowRateLimiter(storage)
    async_moving = AsyncMovingWindow(AsyncRedisStorage(redis_url, implementation="redispy"))
    key, akey = f"bench{run_id}:limits", f"bench{run_id}:limits-aio"

    client = redis.Redis.from_url(redis_url)
    stack.callback(client.close)
    rates = [Rate(rate, Duration.SECOND)]
    log = Limiter(RedisBucket.init(rates, client, f"bench{run_id}:pyrate-log"))
    tb = Limiter(
        StateBucket(rates, TokenBucket(), RedisStateStore(client, f"bench{run_id}:pyrate-tb"))
    )
    stack.callback(log.close)
    stack.callback(tb.close)

    def window(seconds: float) -> float:
        return rate * math.ceil(seconds - 1e-9)

    def bucket(seconds: float) -> float:
        return rate * seconds + rate  # pyrate's burst defaults to the limit

    async def limits_aio() -> bool:
        return bool(await async_moving.hit(item, akey))

    return [
        Contender(
            "limits MovingWindow hit", lambda: bool(moving.hit(item, key)), limits_aio, window, "rT"
        ),
        Contender(
            "pyrate RedisBucket (log)",
            lambda: bool(log.try_acquire("x", blocking=False)),
            None,
            window,
            "rT",
        ),
        Contender(
            "pyrate StateBucket(TokenBucket)",
            lambda: bool(tb.try_acquire("x", blocking=False)),
            None,
            bucket,
            "rT+r",
        ),
    ]


# --------------------------------------------------------------------------- the run


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument(
        "--rate", type=positive_int, help="the interface's rate (default: floor / 10)"
    )
    return parser.parse_args(argv)


def run(args: argparse.Namespace, stack: ExitStack) -> None:
    """Measure the floor, set the rate from it, then both tables."""
    plan = QUICK if args.quick else FULL
    redis_url = stack.enter_context(private_redis())
    run_id = uuid.uuid4().hex[:8]
    client = redis.Redis.from_url(redis_url)
    stack.callback(client.close)
    for line in machine_facts(client, redis_url, True):
        print(line)

    bare = client.register_script("return 1")
    apool = redis.asyncio.BlockingConnectionPool.from_url(redis_url, max_connections=64)
    aclient = redis.asyncio.Redis.from_pool(apool)
    abare = aclient.register_script("return 1")

    def floor() -> bool:
        return bool(bare() == 1)

    async def afloor() -> bool:
        return bool(await abare() == 1)

    measured = measure_threads(floor, plan.warmup, plan.floor_seconds).decisions
    rate = args.rate or max(1, int(float(f"{measured / 10:.2g}")))
    capacity = max(1, rate // 10)
    print(
        f"floor, {THREADS} threads: {measured:,.0f} EVALSHA/s -> the interface's rate R = "
        f"{rate:,}/s (capacity {capacity} for gateway-limiter), callers unpaced\n"
    )

    fast, slow = gateway_limiters(stack, redis_url, run_id, rate, capacity)
    afast = AsyncGatewayLimiter(fast.settings)

    def ours(seconds: float) -> float:
        return rate * seconds + capacity

    def sync_of(lim: GatewayLimiter) -> Callable[[], bool]:
        return lambda: lim.try_acquire(URL)

    async def aio_ours() -> bool:
        return await afast.try_acquire(URL)

    contenders = [
        Contender("floor: EVALSHA 'return 1'", floor, afloor, lambda s: math.inf, "-"),
        Contender("gateway-limiter try_acquire", sync_of(fast), aio_ours, ours, "rT+C"),
        Contender("gateway-limiter, fast path off", sync_of(slow), None, ours, "rT+C"),
        *peers(stack, redis_url, run_id, rate),
    ]

    sync_cells: dict[str, list[Cell]] = {c.name: [] for c in contenders if c.sync}
    for r in range(plan.rounds):
        order = contenders[r % len(contenders) :] + contenders[: r % len(contenders)]
        for c in order:
            if c.sync is not None:
                sync_cells[c.name].append(measure_threads(c.sync, plan.warmup, plan.duration))
    print(f"1. {THREADS} threads, unpaced, on one interface of R = {rate:,}/s")
    print(report(contenders, sync_cells, plan, rate))

    async def async_rounds() -> dict[str, list[Cell]]:
        await afast.start()
        try:
            cells: dict[str, list[Cell]] = {c.name: [] for c in contenders if c.aio}
            for r in range(plan.rounds):
                order = contenders[r % len(contenders) :] + contenders[: r % len(contenders)]
                for c in order:
                    if c.aio is not None:
                        cell = await measure_tasks(c.aio, plan.warmup, plan.duration)
                        cells[c.name].append(cell)
            return cells
        finally:
            await afast.aclose()
            await aclient.aclose()

    async_cells = asyncio.run(async_rounds())
    print(f"\n2. asyncio, {TASKS} coroutines on one loop, unpaced, same interface")
    print(report(contenders, async_cells, plan, rate))
    print(
        f"\nlocal refusals: {fast.local_refusals:,} (threads), "
        f"{afast.local_refusals:,} (asyncio); load at end: {load_average()}"
    )


def report(contenders: list[Contender], cells: dict[str, list[Cell]], plan: Plan, rate: int) -> str:
    """One table: decisions/s against the floor, admitted/s, and the bound per slice."""
    floor = median([c.decisions for c in cells[contenders[0].name]])
    rows = []
    for c in contenders:
        if c.name not in cells:
            continue
        got = cells[c.name]
        decisions = median([x.decisions for x in got])
        most = max(x.admitted for x in got)
        bound = c.bound(plan.duration)
        rows.append(
            [
                c.name,
                f"{decisions:,.0f}",
                f"{decisions / floor:.1f}x",
                "-"
                if math.isinf(bound)
                else f"{median([x.admitted for x in got]) / plan.duration:,.0f}",
                "-" if math.isinf(bound) else f"{most:,} / {bound:,.0f} ({c.bound_text})",
                f"{sum(x.errors for x in got):,}",
            ]
        )
    return table(
        ["contender", "decisions/s", "x floor", "admitted/s", "most in a slice / bound", "err"],
        rows,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print its tables."""
    args = parse_args(argv)
    with ExitStack() as stack:
        run(args, stack)
    return 0


if __name__ == "__main__":
    sys.exit(main())
