#!/usr/bin/env python
"""What one gateway-limiter decision costs, and how exact it is, next to its peers.

Run from the checkout, with the venv's Python::

    python bench/decision_cost.py            # full run, about a minute
    python bench/decision_cost.py --quick    # smoke run, about 15 s
    python bench/decision_cost.py --redis-url redis://127.0.0.1:6379/0   # an existing Redis

Everything is measured in one run, on one Redis: by default a private ``redis-server``
this script starts on a free port (no persistence) and stops on exit, Ctrl-C included,
so nothing else disturbs it.

1. Throughput: calls/s of one decision, from 1 thread and from N threads (default 8),
   each cell warmed up first and then counted for a fixed duration:

   - floor: redis-py ``EVALSHA`` of ``return 1`` (``register_script``) on the very
     client the limiter uses (same pool, timeouts, parser): a round trip with no work;
   - ref: ``EVALSHA`` of a script that only runs the Redis commands a shared bucket
     cannot do without (TIME, GET, SET with PX) and no logic, same client: the
     part of the gap to the floor that any design keeping this contract pays;
   - gateway-limiter: ``GatewayLimiter.try_acquire(url, timeout=0)`` on an enabled row
     with rateLimit 10,000,000, so every call is admitted and decided by bucket.lua;
     it records Prometheus metrics when prometheus-client is installed (the default),
     and is measured once more with the setting ``metrics = false``;
   - limits: ``MovingWindowRateLimiter.hit`` on its Redis storage, 10,000,000/second;
   - pyrate-limiter: ``Limiter.try_acquire(blocking=False)`` on a ``RedisBucket``
     (its sliding-window log) and, for a like-for-like token bucket, on a
     ``StateBucket(TokenBucket, RedisStateStore)``; 10,000,000/second.

2. Accuracy under contention: N threads hammer one interface limited at 50/s with
   capacity 50 and a wait budget of 0.2 s. gateway-limiter goes through
   ``GatewayLimiter.reserve`` and then sleeps the verdict's wait, which is exactly what
   ``try_acquire`` does, so the release time can be measured against the reserved one.
   The peers do not wait; a refused caller simply retries.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import math
import signal
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path

import redis

# Run as a script from anywhere: the checkout's package wins over any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import limiters
from bench.harness.args import description, int_at_least, positive_int, reachable_redis
from bench.harness.limiters import OPEN_RATE, OPEN_URL, floors, sqlite_table, started_limiter
from bench.harness.report import fmt, load_average, machine_facts, table
from bench.harness.runs import ErrorLog, delete_keys, raise_interrupt
from bench.harness.servers import private_redis
from bench.harness.stats import max_in_window, median, percentile, quantile
from bench.harness.timing import (
    AsyncCall,
    Attempt,
    Call,
    Contention,
    Slice,
    measure_async_slice,
    measure_contention,
    measure_throughput,
)
from gateway_limiter import GatewayLimiter

#: The contended interface: 50/s, capacity 50 (the default: one second's worth), 0.2 s.
CONTENDED_RATE = 50
CONTENDED_CAPACITY = 50
CONTENDED_BUDGET = 0.2
CONTENDED_URL = "/bench/contended"


@dataclass(frozen=True)
class Plan:
    """How long each measurement runs.

    Every throughput cell is warmed up once for ``prewarm`` seconds, then counted for
    ``rounds`` x ``duration`` seconds in all, in ``rounds`` short interleaved slices
    (every cell once per round, order rotated, each slice after a ``warmup`` of its own
    threads): background load on a shared machine then hits every contender alike,
    and each contender is compared with a floor measured moments apart.
    """

    prewarm: float
    warmup: float
    duration: float
    rounds: int
    contention: float
    threads: int

    @property
    def counted(self) -> float:
        """Seconds each throughput cell is counted, over all rounds."""
        return self.duration * self.rounds


FULL = Plan(prewarm=0.2, warmup=0.03, duration=0.125, rounds=16, contention=3.0, threads=8)
QUICK = Plan(prewarm=0.05, warmup=0.02, duration=0.1, rounds=4, contention=1.0, threads=8)


# --------------------------------------------------------------------------- contenders


@dataclass
class Contender:
    """One implementation under test: its throughput call and its contended attempt."""

    name: str
    call: Call
    attempt: Attempt
    #: What it may admit in a run of T seconds at rate r with capacity C (as text).
    bound_text: str
    bound: Callable[[float], float]
    #: Most it may admit in any 1 s window, as a multiple of the rate.
    window_bound: float
    waits: bool = False


def token_bound(seconds: float) -> float:
    """A token bucket: the capacity, plus the rate for the time elapsed."""
    return CONTENDED_RATE * seconds + CONTENDED_CAPACITY


def window_bound(seconds: float) -> float:
    """A 1 s sliding window: the rate for each started second."""
    return CONTENDED_RATE * math.ceil(seconds - 1e-9)


def gateway_limiter(
    stack: ExitStack, redis_url: str, run_id: str, *, metrics: bool = True
) -> tuple[Contender, GatewayLimiter]:
    """gateway-limiter on a temporary SQLite table with an open and a contended row.

    ``metrics``: the setting of that name; on, it records Prometheus metrics when
    prometheus-client is installed (the default, as in production).
    """
    database_url = sqlite_table(
        stack,
        {
            OPEN_URL: {"rate_limit": OPEN_RATE, "cache": 0.0},
            CONTENDED_URL: {"rate_limit": CONTENDED_RATE, "cache": CONTENDED_BUDGET},
        },
    )
    limiter = started_limiter(
        stack, database_url, redis_url, f"gwlbench{run_id}", expect_rules=2, metrics=metrics
    )
    rule = limiter.registry.snapshot.rules[CONTENDED_URL]
    if rule.burst != CONTENDED_CAPACITY or rule.cache != CONTENDED_BUDGET:
        raise SystemExit(f"contended rule is {rule}, expected capacity 50 and cache 0.2")

    def call() -> bool:
        return limiter.try_acquire(OPEN_URL, timeout=0)

    def attempt() -> tuple[bool, float]:
        verdict = limiter.reserve(CONTENDED_URL)  # timeout None: the row's cache, 0.2 s
        return verdict.allowed, verdict.wait_us / 1_000_000.0

    return (
        Contender(
            "gateway-limiter try_acquire" if metrics else "gateway-limiter, metrics off",
            call,
            attempt,
            "rT+C",
            token_bound,
            (CONTENDED_RATE + CONTENDED_CAPACITY) / CONTENDED_RATE,
            waits=True,
        ),
        limiter,
    )


def limits_moving_window(stack: ExitStack, redis_url: str, run_id: str) -> Contender:
    """``limits``: moving window on its Redis storage."""
    call, attempt = limiters.limits_moving_window(stack, redis_url, run_id, CONTENDED_RATE)
    return Contender("limits MovingWindow hit", call, attempt, "rT", window_bound, 1.0)


def pyrate(stack: ExitStack, redis_url: str, run_id: str, *, token_bucket: bool) -> Contender:
    """pyrate-limiter 4: a ``RedisBucket`` (sliding-window log) or a Redis ``TokenBucket``."""
    call, attempt = limiters.pyrate(
        stack, redis_url, run_id, CONTENDED_RATE, token_bucket=token_bucket
    )
    if token_bucket:
        return Contender(
            "pyrate StateBucket(TokenBucket)",
            call,
            attempt,
            "rT+C",
            token_bound,
            (CONTENDED_RATE + CONTENDED_CAPACITY) / CONTENDED_RATE,
        )
    return Contender("pyrate RedisBucket (log)", call, attempt, "rT", window_bound, 1.0)


# --------------------------------------------------------------------------- asyncio


async def measure_async(
    limiter: GatewayLimiter, redis_url: str, run_id: str, plan: Plan, tasks: int = 64
) -> dict[str, list[Slice]]:
    """Table 3: the async floor, AsyncGatewayLimiter and limits.aio, interleaved rounds."""
    from limits import RateLimitItemPerSecond
    from limits.aio.storage import RedisStorage
    from limits.aio.strategies import MovingWindowRateLimiter

    from gateway_limiter.aio import AsyncGatewayLimiter

    async with AsyncGatewayLimiter(limiter.settings) as alimiter:
        client = alimiter.backend.client
        bare = client.register_script("return 1")
        storage = RedisStorage(redis_url, implementation="redispy")
        strategy = MovingWindowRateLimiter(storage)
        item, key = RateLimitItemPerSecond(OPEN_RATE), f"bench{run_id}:aio-open"

        async def floor() -> bool:
            return bool(await bare() == 1)

        async def gwl() -> bool:
            return await alimiter.try_acquire(OPEN_URL, timeout=0)

        async def limits_hit() -> bool:
            return bool(await strategy.hit(item, key))

        calls: dict[str, AsyncCall] = {
            ASYNC_FLOOR: floor,
            "gateway-limiter (async) try_acquire": gwl,
            ASYNC_PEER: limits_hit,
        }
        names = list(calls)
        results: dict[str, list[Slice]] = {n: [] for n in names}
        for name in names:  # connections opened, scripts loaded
            await measure_async_slice(calls[name], tasks, plan.prewarm, 0.0)
        for r in range(plan.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                results[name].append(
                    await measure_async_slice(calls[name], tasks, plan.warmup, plan.duration)
                )
        with suppress(Exception):
            await storage.reset()
        return results


ASYNC_FLOOR = "floor: async EVALSHA 'return 1'"
ASYNC_PEER = "limits.aio MovingWindow hit"


def print_async(results: dict[str, list[Slice]], plan: Plan, tasks: int = 64) -> None:
    """Table 3 and its legend."""
    print(
        f"3. asyncio: {tasks} concurrent tasks on one event loop, admitted decisions "
        f"per second on a huge limit (median of {plan.rounds} rounds)"
    )
    base, peer = results[ASYNC_FLOOR], results[ASYNC_PEER]
    rows = []
    for name, cells in results.items():
        rows.append(
            [
                name,
                f"{median([c.admitted for c in cells]):,.0f}",
                ratio_text(cells, base),
                ratio_text(cells, peer),
                f"{sum(c.refused for c in cells):,}/{sum(c.errors for c in cells):,}",
            ]
        )
    headers = ["contender", "calls/s", "x floor (p25-p75)", "x limits.aio (p25-p75)", "refused/err"]
    print(table(headers, rows))
    print(
        "floor: redis.asyncio EVALSHA of 'return 1' on the async limiter's own client. "
        "limits.aio: RedisStorage(implementation='redispy').\n"
        "x limits.aio: median of the per-round ratios to limits.aio."
    )


# --------------------------------------------------------------------------- reporting


def ratio_text(cell: Sequence[Slice], base: Sequence[Slice]) -> str:
    """Median of the per-round ratios to the floor, with their interquartile range."""
    ratios = [c.admitted / b.admitted for c, b in zip(cell, base, strict=True) if b.admitted]
    if not ratios:
        return "n/a"
    return f"{median(ratios):.2f} ({quantile(ratios, 0.25):.2f}-{quantile(ratios, 0.75):.2f})"


def throughput_rows(
    results: dict[str, dict[int, list[Slice]]], threads: int, floor_name: str
) -> list[list[str]]:
    """Rows of table 1: medians over the rounds."""
    base = results[floor_name]
    rows = []
    for name, cells in results.items():
        one = median([s.admitted for s in cells[1]])
        many = median([s.admitted for s in cells[threads]])
        refused = sum(s.refused for s in cells[1] + cells[threads])
        errors = sum(s.errors for s in cells[1] + cells[threads])
        rows.append(
            [
                name,
                f"{one:,.0f}",
                f"{1e6 / one:.0f}" if one else "n/a",
                ratio_text(cells[1], base[1]),
                f"{many:,.0f}",
                ratio_text(cells[threads], base[threads]),
                f"{refused:,}/{errors:,}",
            ]
        )
    return rows


def contention_row(c: Contender, result: Contention, seconds: float) -> list[str]:
    """One row of table 2."""
    in_run = sum(1 for t in result.released if t < result.start + seconds)
    window = max_in_window(result.released)
    own = c.bound(seconds)
    late = [x * 1000 for x in result.lateness]
    over = sum(1 for w in result.waits if w > CONTENDED_BUDGET + 1e-9)
    waited = c.waits
    return [
        c.name,
        f"{result.calls:,}/{result.errors:,}",
        str(in_run),
        f"{in_run / token_bound(seconds):.3f}",
        f"{own:.0f} ({c.bound_text})",
        f"{in_run / own:.3f}",
        f"{window / CONTENDED_RATE:.2f} ({c.window_bound:.2f})",
        str(len(result.waits)) if waited else "-",
        fmt(percentile(late, 0.50), ".2f") if waited else "-",
        fmt(percentile(late, 0.99), ".2f") if waited else "-",
        f"{max(result.waits, default=0) * 1000:.0f}/{result.longest * 1000:.0f}" if waited else "-",
        str(over) if waited else "-",
    ]


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--quick", action="store_true", help="short smoke run (~15 s)")
    parser.add_argument(
        "--redis-url",
        help="use this Redis instead of starting a private redis-server "
        "(keys are unique to the run and deleted afterwards)",
    )
    parser.add_argument(
        "--threads",
        type=int_at_least(2),
        default=None,
        help="threads of the N-thread cells (at least 2)",
    )
    parser.add_argument(
        "--tasks",
        type=positive_int,
        action="append",
        help="coroutines of table 3 (repeat for one table each; default 64)",
    )
    parser.add_argument(
        "--asyncio-only", action="store_true", help="table 3 only (skip tables 1 and 2)"
    )
    return parser.parse_args(argv)


def print_throughput(
    results: dict[str, dict[int, list[Slice]]], plan: Plan, floor_name: str
) -> None:
    """Table 1 and its legend."""
    print(
        "1. Throughput: admitted decisions per second on a huge limit "
        f"(median of {plan.rounds} rounds)"
    )
    headers = [
        "contender",
        "1 thread/s",
        "us/call",
        "x floor (p25-p75)",
        f"{plan.threads} threads/s",
        "x floor (p25-p75)",
        "refused/err",
    ]
    print(table(headers, throughput_rows(results, plan.threads, floor_name)))
    print(
        "us/call: 1e6 / (1 thread/s). x floor: median of the per-round ratios to the floor "
        "(interquartile range).\nrefused/err: calls refused although the limit is huge / "
        "calls that raised a Redis error, all rounds."
    )


def print_contention(rows: list[list[str]], gwl: Contention | None, plan: Plan) -> None:
    """Table 2 and its legend."""
    print(
        f"2. Accuracy under contention: {plan.threads} threads, one interface at "
        f"r={CONTENDED_RATE}/s, capacity C={CONTENDED_CAPACITY}, wait budget "
        f"{CONTENDED_BUDGET:g} s, T={plan.contention:g} s"
    )
    headers = [
        "contender",
        "calls/err",
        "admitted",
        "/(rT+C)",
        "own bound",
        "/bound",
        "max1s/r (bound)",
        "waited",
        "late p50 ms",
        "late p99 ms",
        "max wait/took ms",
        "over budget",
    ]
    print(table(headers, rows))
    print(
        "admitted: callers that went ahead (after any wait) within T. own bound: what the "
        "algorithm may admit in T\n(token bucket rT+C, 1 s window rT). max1s/r: most "
        "admitted in any sliding 1 s window / r.\nlate: release time minus reserved time "
        "(decision returned + granted wait), callers that waited.\nmax wait/took: longest "
        "wait granted / longest call-to-release. over budget: waits granted > budget."
    )
    if gwl is not None and gwl.lateness_bound:
        bound = [x * 1000 for x in gwl.lateness_bound]
        print(
            "gateway-limiter lateness counted from the call's start instead (adds the "
            f"decision round trip): p50 {percentile(bound, 0.5):.2f} ms, "
            f"p99 {percentile(bound, 0.99):.2f} ms"
        )


def sync_tables(
    stack: ExitStack,
    redis_url: str,
    run_id: str,
    plan: Plan,
    gwl: Contender,
    limiter: GatewayLimiter,
) -> None:
    """Tables 1 and 2, printed as they complete."""
    quiet, _ = gateway_limiter(stack, redis_url, run_id, metrics=False)
    contenders = [
        gwl,
        limits_moving_window(stack, redis_url, run_id),
        pyrate(stack, redis_url, run_id, token_bucket=False),
        pyrate(stack, redis_url, run_id, token_bucket=True),
    ]
    floor_name = "floor: EVALSHA 'return 1'"
    bare_call, state_call = floors(limiter, run_id)
    calls: dict[str, Call] = {
        floor_name: bare_call,
        "ref: EVALSHA TIME+GET+SET PX": state_call,
    }
    for c in contenders:
        calls[c.name] = c.call
        if c is gwl:  # right below it: the same bucket, metrics not recorded (throughput only)
            calls[quiet.name] = quiet.call

    results = measure_throughput(
        calls,
        threads=plan.threads,
        rounds=plan.rounds,
        prewarm=plan.prewarm,
        warmup=plan.warmup,
        duration=plan.duration,
    )
    print_throughput(results, plan, floor_name)
    print(flush=True)

    rows, gwl_result = [], None
    for c in contenders:
        result = measure_contention(c.attempt, plan.threads, plan.contention)
        rows.append(contention_row(c, result, plan.contention))
        if c is gwl:
            gwl_result = result
    print_contention(rows, gwl_result, plan)
    print(flush=True)


def run(args: argparse.Namespace, plan: Plan, stack: ExitStack) -> None:
    """Both measurements, printed as they complete."""
    run_id = uuid.uuid4().hex[:8]
    redis_url = args.redis_url or stack.enter_context(private_redis())
    admin = redis.Redis.from_url(redis_url, socket_timeout=5)
    stack.callback(admin.close)
    if args.redis_url:
        stack.callback(delete_keys, admin, f"*{run_id}*")
    for line in machine_facts(admin, redis_url, private=not args.redis_url):
        print(line)
    print(
        f"plan:     throughput: per cell {plan.prewarm:g} s warm-up, then {plan.rounds} "
        f"interleaved rounds x {plan.duration:g} s counted ({plan.counted:g} s); "
        f"contention {plan.contention:g} s; {plan.threads} threads"
        + (" (--quick)" if args.quick else "")
    )
    print(flush=True)

    errors = ErrorLog()
    logging.getLogger("gateway_limiter").addHandler(errors)
    stack.callback(logging.getLogger("gateway_limiter").removeHandler, errors)
    gwl, limiter = gateway_limiter(stack, redis_url, run_id)
    if not args.asyncio_only:
        sync_tables(stack, redis_url, run_id, plan, gwl, limiter)

    for tasks in args.tasks or [64]:
        print_async(
            asyncio.run(measure_async(limiter, redis_url, run_id, plan, tasks)), plan, tasks
        )
        print(flush=True)
    if errors.count:
        print(
            f"gateway-limiter opened its circuit breaker {errors.count} time(s) "
            "(Redis errors; on_backend_error=deny refused meanwhile)"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Run both measurements and print the tables; 130 when interrupted."""
    args = parse_args(argv)
    plan = QUICK if args.quick else FULL
    if args.threads is not None:
        plan = dataclasses.replace(plan, threads=args.threads)
    if args.redis_url:
        reachable_redis(args.redis_url)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s: %(message)s")
    signal.signal(signal.SIGTERM, raise_interrupt)  # `kill` cleans up like Ctrl-C
    began = time.monotonic()
    try:
        with ExitStack() as stack:  # closes limiters and clients, then stops redis-server
            run(args, plan, stack)
    except KeyboardInterrupt:
        print("\ninterrupted; cleaned up", file=sys.stderr)
        return 130
    print(f"\n(run took {time.monotonic() - began:.1f} s; load average now {load_average()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
