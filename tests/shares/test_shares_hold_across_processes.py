"""Capacity shares hammered from several processes on one real Redis.

- Two interfaces of one channel at 25/s each under a channel row of 30/s: past the
  first second's burst, at most 30 admissions in any second across both, at least
  0.9 x 30/s used, and neither interface over its own 25.
- Partner A named at 50/s beside a default per-caller row of 10/s: A gets its 50/s and
  B its 10/s, each within its bucket's burst.

Admissions are timed by each process's clock when the call returns (after any wait);
on a loaded 2-core machine a return can be late by tens of milliseconds, so "in any
second" is counted over windows of ``JITTER_WINDOW`` s (a late return can only move an
admission later, never pack more of them into a real second than the bucket allowed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from tests.support.limiting import write_row
from tests.support.services import RedisServer

SECONDS = 4.0
#: "any second", less the lateness a loaded host adds to the moment a call returns
JITTER_WINDOW = 0.9

WORKER = textwrap.dedent("""
    import json, sys, threading, time
    from gateway_limiter import GatewayLimiter
    db, redis_url, prefix, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    calls = json.loads(sys.argv[5])  # [[url, key or null, threads], ...]
    releases, lock = [], threading.Lock()
    with GatewayLimiter(database_url=db, redis_url=redis_url, key_prefix=prefix,
                        redis_timeout=2.0, reload_interval=3600) as lim:
        print("ready", flush=True)
        start_at = float(sys.stdin.readline())
        time.sleep(max(0.0, start_at - time.time()))
        def work(url, key):
            while time.time() < start_at + seconds:
                if lim.try_acquire(url, key=key):
                    with lock:
                        releases.append([url, key, time.time()])
        threads = [threading.Thread(target=work, args=(url, key))
                   for url, key, n in calls for _ in range(n)]
        for t in threads: t.start()
        for t in threads: t.join()
        fell_back = lim.backend_fallbacks
    print(json.dumps({"releases": releases, "fell_back": fell_back}))
""")


#: What one worker does: (url, caller key or None, threads) for each kind of call.
Plan = list[tuple[str, str | None, int]]


def run_processes(
    db_url: str, redis_url: str, prefix: str, plans: list[Plan]
) -> tuple[float, list[tuple[str, str | None, float]]]:
    """Run one worker per plan together for SECONDS; when they started, and every
    admission (url, key, time)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, db_url, redis_url, prefix, str(SECONDS), json.dumps(p)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ | {"PYTHONPATH": str(Path(__file__).parents[2])},
        )
        for p in plans
    ]
    try:
        for p in procs:  # imports and start() can take seconds on a loaded host
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready"
        start_at = time.time() + 0.3
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(f"{start_at}\n")
            p.stdin.close()
        outputs = []
        for p in procs:
            assert p.stdout is not None
            outputs.append(p.stdout.read())
            p.wait(60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0] * len(procs)
    results: list[dict[str, Any]] = [json.loads(out) for out in outputs]
    assert [r["fell_back"] for r in results] == [0] * len(procs)  # every decision shared
    releases = [(url, key, t) for r in results for url, key, t in r["releases"]]
    return start_at, releases


def most_in_any_window(times: list[float], window: float) -> int:
    times = sorted(times)
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] >= window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


@pytest.mark.slow
def test_a_channel_of_two_interfaces_stays_within_its_cap_across_processes(
    migrated_db: tuple[str, Engine], redis_server: RedisServer, key_prefix: str
) -> None:
    db_url, engine = migrated_db
    write_row(engine, "/ch/search", rateLimit=25, cache=0.1, channelType="IBE+")
    write_row(engine, "/ch/book", rateLimit=25, cache=0.1, channelType="IBE+")
    write_row(engine, "*", rateLimit=30, cache=0.1, channelType="IBE+")
    both: Plan = [("/ch/search", None, 2), ("/ch/book", None, 2)]
    start_at, releases = run_processes(db_url, redis_server.url, key_prefix, [both, both])
    end = start_at + SECONDS
    settled = [t for _, _, t in releases if t >= start_at + 1.0]  # past the first burst
    # the channel: at most 30 in any second, and its rate used
    assert most_in_any_window(settled, JITTER_WINDOW) <= 30
    assert len(settled) >= 0.9 * 30 * (end - start_at - 1.0 - 0.1)
    # over the whole run, never more than the channel's burst plus its rate
    span = max(t for _, _, t in releases) - start_at
    assert len(releases) <= 30 + 30 * span + 1
    for url in ("/ch/search", "/ch/book"):
        mine = [t for u, _, t in releases if u == url]
        assert mine, url  # both interfaces got a share
        assert most_in_any_window([t for t in mine if t >= start_at + 1.0], JITTER_WINDOW) <= 25
        assert len(mine) <= 25 + 25 * span + 1


@pytest.mark.slow
def test_a_named_partner_gets_its_rate_and_everyone_else_the_default(
    migrated_db: tuple[str, Engine], redis_server: RedisServer, key_prefix: str
) -> None:
    db_url, engine = migrated_db
    write_row(engine, "/partners", rateLimit=10, cache=0.1, perCaller=1)
    write_row(engine, "/partners", add=True, rateLimit=50, cache=0.1, perCaller=1, callerKey="A")
    mixed: Plan = [("/partners", "A", 2), ("/partners", "B", 1)]
    start_at, releases = run_processes(db_url, redis_server.url, key_prefix, [mixed, mixed])
    span = max(t for _, _, t in releases) - start_at
    for key, rate in (("A", 50), ("B", 10)):
        times = [t for _, k, t in releases if k == key]
        # within the bucket's burst (its rate) plus its rate over the run ...
        assert len(times) <= rate + rate * span + 1, key
        # ... and the rate is had: at least 0.9 of it past the burst
        assert len(times) >= rate + 0.9 * rate * (SECONDS - 1.0), key
        settled = [t for t in times if t >= start_at + 1.0]
        assert most_in_any_window(settled, JITTER_WINDOW) <= rate, key
