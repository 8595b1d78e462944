#!/usr/bin/env python
"""One hot interface at R = 50,000/s across 4 processes, with and without leases.

Run from the checkout, with the venv's Python::

    python bench/lease_cost.py            # about 30 s
    python bench/lease_cost.py --quick    # smoke run, a few seconds

One private ``redis-server`` (no persistence) and a SQLite table with two rows of the
same rate and capacity: one plain, one with ``leaseMs``. For each row in turn,
``--processes`` processes (spawned) with ``--threads`` threads each call
``try_acquire(url, timeout=0)`` as fast as they can for ``--seconds``; then the same
with a wait budget, ``--timeout`` (0.05 s by default): each thread reserves with that
budget and sleeps the wait it is given, so the fleet offers far more than R and is
served at R, the bucket dry (a lease row then takes debt leases: docs/algorithms.md,
"Rate leases"). Printed side by side, from the same run:

- decisions/s and admitted/s over the whole fleet;
- EVALSHA per admitted call (``INFO commandstats``: every decision script call the
  server ran while the fleet measured);
- Redis CPU per admitted call (``INFO cpu``, user + system, over the same span);
- the peak admitted in any 1 s (10 ms bins of wall clock, merged over the processes;
  each admission counted when its call returned, after its wait) against the bound of
  docs/algorithms.md ("Leases"), C the capacity (here R), L the row's leaseMs:
  C + R x (1 + L/1000) for any traffic, whatever the number of processes. An admission
  happened at most "late" (the slowest admitted call, beyond its wait) before it was
  counted, so a window of counts may hold up to R x late more than the bound;
- the permits the processes handed back, and those they dropped in-process as too old
  to return any (here, each process's first lease, taken before the start line, is
  renewed seconds later); with a wait budget, the permits scheduled as debt and those
  of them never used.

Without leases the bound is C + R (a token bucket).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import threading
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

# Run as a script from anywhere: the checkout's package wins over any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from bench.harness.args import description, positive_float, positive_int
from bench.harness.limiters import sqlite_table, started_limiter
from bench.harness.report import load_average, table
from bench.harness.servers import private_redis

RATE = 50_000
PLAIN_URL = "/bench/hot/plain"
LEASE_URL = "/bench/hot/lease"
BIN_S = 0.01  # admissions are counted per 10 ms of wall clock


def worker(
    db: str,
    redis_url: str,
    prefix: str,
    url: str,
    threads: int,
    seconds: float,
    timeout: float,
    start: Any,
    done: Any,
    results: Any,
) -> None:
    """One process of the fleet: ``threads`` threads hammering ``url``."""
    with ExitStack() as stack:
        limiter = started_limiter(stack, db, redis_url, prefix, fleet_heartbeat=1.0)
        limiter.try_acquire(url, timeout=0)  # connections and scripts ready
        bins: list[Counter[int]] = [Counter() for _ in range(threads)]
        calls = [0] * threads
        slowest = [0.0] * threads

        def hammer(i: int, until: float) -> None:
            mine, n, most = bins[i], 0, 0.0
            acquire, reserve = limiter.try_acquire, limiter.reserve
            while (began := time.time()) < until:
                n += 1
                wait_s = 0.0
                if timeout > 0:  # the wait it is given, slept as try_acquire would
                    verdict = reserve(url, timeout=timeout)
                    if not verdict.allowed:
                        continue
                    if (wait_s := verdict.wait_us / 1e6) > 0:
                        time.sleep(wait_s)
                elif not acquire(url, timeout=0):
                    continue
                now = time.time()  # admitted between began and now: counted at now
                mine[int(now / BIN_S)] += 1
                most = max(most, now - began - wait_s)
            calls[i], slowest[i] = n, most

        start.wait()
        until = time.time() + seconds
        pool = [threading.Thread(target=hammer, args=(i, until)) for i in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        done.wait()  # the parent reads Redis' counters before anyone closes
        merged: Counter[int] = Counter()
        for b in bins:
            merged.update(b)
        leases = limiter._leases
        counts = (
            (0, 0, 0, 0, 0)
            if leases is None
            else (leases.refills, leases.handed_back, leases.dropped, leases.owed, leases.owed_lost)
        )
        results.put((sum(calls), dict(merged), max(slowest), counts))
        done.wait()


def _redis_counters(client: redis.Redis) -> tuple[int, float]:
    stats: dict[str, Any] = client.info("commandstats")
    calls = int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
    cpu: dict[str, Any] = client.info("cpu")
    return calls, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def _peak(bins: Counter[int]) -> int:
    """The most admitted in any 1 s (100 consecutive 10 ms bins)."""
    if not bins:
        return 0
    first, last = min(bins), max(bins)
    width = round(1.0 / BIN_S)
    counts = [bins.get(i, 0) for i in range(first, last + 1)]
    window = sum(counts[:width])
    most = window
    for i in range(width, len(counts)):
        window += counts[i] - counts[i - width]
        most = max(most, window)
    return most


def run(
    db: str, redis_url: str, url: str, processes: int, threads: int, seconds: float, timeout: float
) -> dict[str, float]:
    """One fleet on ``url``, its callers' budget ``timeout``: its figures."""
    ctx = mp.get_context("spawn")
    start, done = ctx.Barrier(processes + 1), ctx.Barrier(processes + 1)
    results = ctx.Queue()
    prefix = f"gwl-bench-lease-{uuid.uuid4().hex[:8]}"
    args = (db, redis_url, prefix, url, threads, seconds, timeout, start, done, results)
    procs = [ctx.Process(target=worker, args=args) for _ in range(processes)]
    client = redis.Redis.from_url(redis_url)
    for p in procs:
        p.start()
    try:
        start.wait(timeout=120)
        before = _redis_counters(client)
        done.wait(timeout=seconds + 120)
        after = _redis_counters(client)
        decisions, bins, late = 0, Counter[int](), 0.0
        refills, back, dropped, owed, unused = 0, 0, 0, 0, 0
        for _ in procs:
            n, b, slowest, (renewed, handed, lost, debt, never) = results.get(timeout=60)
            decisions += n
            bins.update(b)
            late = max(late, slowest)
            refills, back, dropped = refills + renewed, back + handed, dropped + lost
            owed, unused = owed + debt, unused + never
        done.wait(timeout=60)
    finally:
        for p in procs:
            p.join(timeout=60)
        client.close()
    admitted = sum(bins.values())
    return {
        "decisions/s": decisions / seconds,
        "admitted/s": admitted / seconds,
        "evalsha/admitted": (after[0] - before[0]) / max(admitted, 1),
        "cpu us/admitted": (after[1] - before[1]) * 1e6 / max(admitted, 1),
        "peak": float(_peak(bins)),
        "late": late,
        "lease calls/admitted": refills / max(admitted, 1),
        "handed back": float(back),
        "dropped": float(dropped),
        "owed": float(owed),
        "owed unused": float(unused),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--quick", action="store_true", help="a smoke run, a few seconds")
    parser.add_argument("--processes", type=positive_int, default=4)
    parser.add_argument("--threads", type=positive_int, default=4)
    parser.add_argument("--seconds", type=positive_float, default=10.0)
    parser.add_argument("--lease-ms", type=positive_int, default=20)
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=0.05,
        help="the wait budget of the second pair (s)",
    )
    a = parser.parse_args()
    seconds = 2.0 if a.quick else a.seconds
    lease_ms = a.lease_ms
    with ExitStack() as stack:
        redis_url = stack.enter_context(private_redis())
        db = sqlite_table(
            stack,
            {
                PLAIN_URL: {"rate_limit": RATE, "cache": 0.0},
                LEASE_URL: {"rate_limit": RATE, "cache": 0.0, "lease_ms": lease_ms},
            },
        )
        load = load_average()
        fleets = [
            run(db, redis_url, url, a.processes, a.threads, seconds, timeout)
            for timeout in (0.0, a.timeout)
            for url in (PLAIN_URL, LEASE_URL)
        ]
    size = RATE * lease_ms // 1000
    waits = f", timeout {a.timeout:g}"
    bounds = {
        "without leases": f"{2 * RATE:,}",
        f"leaseMs {lease_ms}": f"{2 * RATE + size:,}",
        "without leases" + waits: f"{2 * RATE:,}",
        f"leaseMs {lease_ms}" + waits: f"{2 * RATE + size:,}",
    }
    rows = []
    for (name, bound), figures in zip(bounds.items(), fleets, strict=True):
        rows.append(
            [
                name,
                f"{figures['decisions/s']:,.0f}",
                f"{figures['admitted/s']:,.0f}",
                f"{figures['evalsha/admitted']:.4f}",
                f"{figures['lease calls/admitted']:.4f}",
                f"{figures['cpu us/admitted']:.2f}",
                f"{figures['peak']:,.0f}",
                f"{figures['late'] * 1000:.1f}",
                bound,
            ]
        )
    print(
        f"Lease cost: one interface at R = {RATE:,}/s (capacity R), {a.processes} processes x "
        f"{a.threads} threads, {seconds:g} s each, try_acquire(timeout=0), then reserve("
        f"timeout={a.timeout:g}) and its wait slept"
    )
    print(f"load average before: {load}")
    print(
        table(
            [
                "row",
                "decisions/s",
                "admitted/s",
                "EVALSHA/admitted",
                "of which lease.lua",
                "Redis CPU us/admitted",
                "peak in 1 s",
                "late ms",
                "bound",
            ],
            rows,
        )
    )
    for (plain, leased), budget in zip(
        (fleets[:2], fleets[2:]), ("0", f"{a.timeout:g}"), strict=True
    ):
        ratio = plain["evalsha/admitted"] / max(leased["evalsha/admitted"], 1e-12)
        cpu = plain["cpu us/admitted"] / max(leased["cpu us/admitted"], 1e-12)
        print(
            f"timeout={budget}: Redis calls per admitted call: {ratio:,.1f}x fewer with "
            f"leases; Redis CPU per admitted call: {cpu:,.1f}x less"
        )
        print(
            f"  leaseMs {lease_ms}: {leased['handed back']:,.0f} permits handed back, "
            f"{leased['dropped']:,.0f} dropped in-process as too old to return any, "
            f"{leased['owed']:,.0f} scheduled as debt ({leased['owed unused']:,.0f} unused)"
        )
    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    main()
