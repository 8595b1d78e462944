#!/usr/bin/env python
"""A daily calendar quota over a simulated day: what it lets through, with and without
pacing, and what the daily row costs Redis beside a per-second row.

Run from the checkout, with the venv's Python::

    python bench/calendar_quota.py            # full run, about a minute
    python bench/calendar_quota.py --quick    # smoke run, about 15 s
    python bench/calendar_quota.py --quick --day-calls 3000    # a shorter day
    python bench/calendar_quota.py --cost-only --instructions   # part 2 alone, about 30 s
    python bench/calendar_quota.py --redis-url redis://127.0.0.1:6379/0   # an existing Redis

Everything runs on one Redis: by default a private ``redis-server`` this script starts
on a free port and stops on exit.

1. A simulated day: 4 processes share one interface with a per-second row (50/s) and a
   daily quota of 10,000 in ``Asia/Shanghai``. The Redis clock is driven (each call
   passes its moment of the day), minute by minute, the processes kept in step by a
   barrier (in each minute they take turns, each its quarter of the minute, so the
   shared clock never runs back); each process's own clock is the same simulated one.
   Demand is uneven: a quiet night, a morning peak three times the afternoon's, 30,000 calls in all
   (``--quick``: 15,000), drawn from a seeded Poisson process per process and minute;
   no caller waits. The day is run twice, once with ``quotaPacing`` 0 and once with 1
   (burst 10, the ``quota_pacing_burst`` default). The table gives the permits used at
   the end of the day (read from the quota's counter in Redis), the largest overshoot
   (used beyond 10,000 at any moment: must be 0), the refusals before the day's last
   hour, when the quota was first spent, and what the last hour admitted.

2. Redis server time per decision (``INFO commandstats``, as ``server_time.py``
   measures it): the per-second row alone (``bucket.lua``), the per-second row with the
   daily row beside it (``bucket.lua`` too, both in the quota's counter's key), and
   with the daily row paced; each
   set so large that every call is admitted; and, for scale, the per-second row with a
   60 s fixed window beside it (any second limit). The target: the pair at most 1.15x
   the per-second row alone. With ``--instructions`` (needs ``valgrind``), the
   instructions Redis runs per decision too: the same on a quiet host and a busy one.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import signal
import statistics
import struct
import sys
import time
import uuid
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import redis

# Run as a script from anywhere: the checkout's package wins over any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness.args import description, int_at_least, reachable_redis
from bench.harness.report import machine_facts, table
from bench.harness.runs import delete_keys, raise_interrupt
from bench.harness.servers import private_redis
from bench.server_time import HUGE, Case, _call, _case, count_instructions, measure
from gateway_limiter.backends.redis import RedisBackend
from gateway_limiter.backends.state import state_key
from gateway_limiter.config.rules import CALENDAR_SECONDS, Rule
from gateway_limiter.config.settings import Settings
from gateway_limiter.model.calendar import DEFAULT_PACING_BURST, Calendar

ZONE = "Asia/Shanghai"
QUOTA = 10_000
PER_SECOND = 50
PROCESSES = 4
MINUTES = 24 * 60
US = 1_000_000.0
#: The simulated day (a Monday in Beijing); any day of 24 hours does.
DAY = Calendar.of("day", ZONE).period_at(1_795_968_000.0)  # 2026-11-30 local midnight


def demand(minute: int) -> float:
    """Relative demand in a minute of the day: a quiet night, a morning peak (09-12)
    three times the afternoon's, a tail in the evening."""
    hour = minute / 60
    if hour < 7:
        return 0.1
    if hour < 9:
        return 1.0
    if hour < 12:
        return 3.0
    if hour < 18:
        return 1.0
    return 0.5


def rules(url: str, paced: bool) -> Rule:
    """The interface: a per-second row, and the daily quota beside it."""
    calendar = Calendar.of("day", ZONE)
    daily = Rule(
        url,
        QUOTA,
        0.0,
        2,
        algorithm="fixed_window",
        period=CALENDAR_SECONDS[calendar.renewal.period],
        calendar=calendar,
        pacing=paced,
        pace_burst=DEFAULT_PACING_BURST,
    )
    return replace(Rule(url, PER_SECOND, 0.0, 1), also=(daily,))


def worker(
    index: int,
    redis_url: str,
    prefix: str,
    url: str,
    paced: bool,
    total: int,
    barrier: Any,
    results: Any,
) -> None:
    """One process: its share of each minute's demand, at driven moments of the day."""
    backend = RedisBackend(Settings(redis_url=redis_url, redis_timeout=10.0, key_prefix=prefix))
    rule = rules(url, paced)
    rng = random.Random(1000 * index + 7)
    weight = sum(demand(m) for m in range(MINUTES))
    start_us = DAY[0] * US
    admitted = refused_early = 0
    last_hour = 0
    spent_at = -1.0
    clock = [start_us / US]
    backend._commands.clock = lambda: clock[0]
    for minute in range(MINUTES):
        mean = total / PROCESSES * demand(minute) / weight
        calls = _poisson(rng, mean)
        # the shared clock never runs back: in each minute the processes take turns,
        # each its quarter of the minute
        moments = sorted((index + rng.random()) / PROCESSES for _ in range(calls))
        for turn in range(PROCESSES):
            barrier.wait()
            if turn != index:
                continue
            for m in moments:
                now = start_us + (minute + m) * 60 * US
                clock[0] = now / US  # this process's clock, as the boundaries read it
                verdict = backend.reserve(rule, 1, 0.0, now=now)
                if verdict.allowed:
                    admitted += 1
                    if minute >= MINUTES - 60:
                        last_hour += 1
                elif minute < MINUTES - 60:
                    refused_early += 1
                if verdict.quota_left == 0 and spent_at < 0:
                    spent_at = minute + m
    barrier.wait()
    backend.close()
    results.put((admitted, refused_early, last_hour, spent_at))


def _poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw (Knuth's method; the means here are small)."""
    limit, k, p = pow(2.718281828459045, -mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def simulated_day(redis_url: str, prefix: str, paced: bool, total: int) -> list[str]:
    """One day with 4 processes; its table row."""
    url = f"/bench/day/{uuid.uuid4().hex[:8]}"
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [
        ctx.Process(target=worker, args=(i, redis_url, prefix, url, paced, total, barrier, results))
        for i in range(PROCESSES)
    ]
    began = time.monotonic()
    for p in procs:
        p.start()
    got = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    client = redis.Redis.from_url(redis_url)
    raw = client.get(state_key(prefix, rules(url, paced).also[0]))
    client.close()
    used = struct.unpack_from("<2d", raw)[1] if isinstance(raw, bytes) else 0.0
    admitted = sum(g[0] for g in got)
    spent = [g[3] for g in got if g[3] >= 0]
    spent_text = "never" if not spent else f"{int(min(spent)) // 60:02d}:{int(min(spent)) % 60:02d}"
    return [
        "paced (burst 10)" if paced else "not paced",
        f"{admitted:,}",
        f"{used:,.0f}",
        f"{max(0, admitted - QUOTA, int(used) - QUOTA)}",
        f"{sum(g[1] for g in got):,}",
        spent_text,
        f"{sum(g[2] for g in got):,}",
        f"{time.monotonic() - began:.1f}",
    ]


def cost_cases(prefix: str) -> list[Case]:
    """The per-second row alone, and with the daily row beside it (plain and paced)."""
    from gateway_limiter.backends.scripts import Commands

    commands = Commands(prefix)
    calendar = Calendar.of("day", ZONE)

    def pair(paced: bool) -> Rule:
        url = f"/cost/{'paced' if paced else 'daily'}"
        daily = Rule(
            url,
            HUGE,
            0.0,
            2,
            algorithm="fixed_window",
            period=CALENDAR_SECONDS[calendar.renewal.period],
            calendar=calendar,
            pacing=paced,
            pace_burst=HUGE,
        )
        return replace(Rule(url, HUGE, 0.0, 1), also=(daily,))

    alone = "per-second row alone (bucket.lua)"
    window = replace(
        Rule("/cost/window", HUGE, 0.0, 1),
        also=(Rule("/cost/window", HUGE, 0.0, 3, algorithm="fixed_window", period=60),),
    )
    return [
        _case(alone, _call(commands, Rule("/cost/alone", HUGE, 0.0, 1)), None),
        _case("per-second + daily row (bucket.lua)", _call(commands, pair(False)), alone),
        _case("per-second + paced daily row (bucket.lua)", _call(commands, pair(True)), alone),
        _case("per-second + 60 s fixed window (limits.lua)", _call(commands, window), alone),
    ]


def print_day(url: str, prefix: str, total: int) -> None:
    """Part 1: the simulated day, without and with pacing."""
    print(
        f"1. A simulated day: {PROCESSES} processes, a daily quota of {QUOTA:,} "
        f"({ZONE}) beside {PER_SECOND}/s, {total:,} calls of uneven demand"
    )
    day = [simulated_day(url, prefix, paced, total) for paced in (False, True)]
    headers = [
        "quota",
        "admitted",
        "used at end",
        "overshoot",
        "refused before 23:00",
        "first spent",
        "admitted 23:00-24:00",
        "s",
    ]
    print(table(headers, day))
    print(flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--quick", action="store_true", help="a smaller day and fewer repeats")
    parser.add_argument(
        "--cost-only", action="store_true", help="only what a decision costs Redis (part 2)"
    )
    parser.add_argument(
        "--day-calls",
        type=int_at_least(1000),
        help="calls over the simulated day (default 30,000; --quick: 15,000)",
    )
    parser.add_argument("--redis-url", help="an existing Redis instead of a private one")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="also count instructions per call under callgrind (needs valgrind)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run both parts and print their tables; 130 when interrupted."""
    args = parse_args(argv)
    if args.redis_url:
        reachable_redis(args.redis_url)
    signal.signal(signal.SIGTERM, raise_interrupt)
    total = args.day_calls or (15_000 if args.quick else 30_000)
    calls, repeats = (500, 3) if args.quick else (2000, 7)
    try:
        with ExitStack() as stack:
            url = args.redis_url or stack.enter_context(private_redis())
            client = redis.Redis.from_url(url, socket_timeout=10)
            stack.callback(client.close)
            prefix = f"gwlcal{uuid.uuid4().hex[:8]}"
            stack.callback(delete_keys, client, f"{prefix}*")
            for line in machine_facts(
                client, url, private=not args.redis_url, peers=False, metrics=False
            ):
                print(line)
            print(flush=True)
            if not args.cost_only:
                print_day(url, prefix, total)
            print("2. Redis server time per decision (commandstats), every call admitted")
            group = cost_cases(prefix)
            found = measure(client, group, calls, repeats)
            rows = []
            base = statistics.median(found[group[0].name])
            for case in group:
                med = statistics.median(found[case.name])
                rows.append(
                    [case.name, f"{med:.1f}", f"{min(found[case.name]):.1f}", f"{med / base:.2f}x"]
                )
            print(table(["decision", "us/call (median)", "lowest", "x alone"], rows))
            print("target: the per-second + daily row at most 1.15x the per-second row alone")
            if args.instructions:
                counted = count_instructions(group, 500)
                alone = counted[group[0].name]
                print(flush=True)
                print("3. Instructions per decision inside EVALSHA (callgrind, a private server)")
                print(
                    table(
                        ["decision", "instructions", "x alone"],
                        [
                            [c.name, f"{counted[c.name]:,.0f}", f"{counted[c.name] / alone:.2f}x"]
                            for c in group
                        ],
                    )
                )
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
