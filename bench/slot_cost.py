#!/usr/bin/env python
"""What taking and giving back a slot (``limiter.slot``) costs, beside a bare EVALSHA.

Run from the checkout, with the venv's Python::

    python bench/slot_cost.py            # about 20 s
    python bench/slot_cost.py --quick    # smoke run, a few seconds

One thread, one private ``redis-server`` (no persistence), uncontended (the slot is
always free): each row is calls per second and the mean microseconds per call, and the
Redis round trips each call makes (EVALSHA calls counted by ``INFO commandstats``).

- floor: redis-py ``EVALSHA`` of ``return 1`` on the limiter's own client;
- try_acquire: one rate decision (``bucket.lua``), for reference;
- slot: ``with limiter.slot(url): pass`` on a row with ``maxConcurrent``: the rate
  permit and the slot taken in one script call, given back in a second.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

# Run as a script from anywhere: the checkout's package wins over any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness.args import description, reachable_redis
from bench.harness.limiters import floors, sqlite_table, started_limiter
from bench.harness.report import load_average, table
from bench.harness.servers import private_redis

SLOT_URL = "/bench/slot"
RATE_URL = "/bench/rate"


def _evalshas(client: Any) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def measure(call: Callable[[], object], seconds: float, client: Any) -> tuple[float, float]:
    """(calls per second, EVALSHAs per call) of ``call`` on one thread for ``seconds``."""
    for _ in range(200):  # warm up: connections, scripts loaded, caches
        call()
    before, calls = _evalshas(client), 0
    started = time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        call()
        calls += 1
    elapsed = time.perf_counter() - started
    return calls / elapsed, (_evalshas(client) - before) / calls


def main() -> None:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--quick", action="store_true", help="1 s per row")
    parser.add_argument("--redis-url", help="an existing Redis instead of a private one")
    args = parser.parse_args()
    if args.redis_url:
        reachable_redis(args.redis_url)
    seconds = 1.0 if args.quick else 5.0
    with ExitStack() as stack:
        redis_url = args.redis_url or stack.enter_context(private_redis())
        database_url = sqlite_table(
            stack,
            {
                SLOT_URL: {"rate_limit": 10_000_000, "cache": 0.0, "max_concurrent": 1000},
                RATE_URL: {"rate_limit": 10_000_000, "cache": 0.0},
            },
        )
        limiter = started_limiter(
            stack, database_url, redis_url, f"gwlbench{uuid.uuid4().hex[:8]}", metrics=False
        )
        client = limiter.backend.client
        bare, _state = floors(limiter, uuid.uuid4().hex[:8])

        def slot() -> None:
            with limiter.slot(SLOT_URL):
                pass

        rows = []
        floor_rate = 0.0
        for name, call in (
            ("floor: EVALSHA 'return 1'", bare),
            ("try_acquire (bucket.lua)", lambda: limiter.try_acquire(RATE_URL, timeout=0)),
            ("slot: take + give back", slot),
        ):
            rate, trips = measure(call, seconds, client)
            floor_rate = floor_rate or rate
            rows.append(
                [
                    name,
                    f"{rate:,.0f}",
                    f"{1e6 / rate:,.0f}",
                    f"{trips:.2f}",
                    f"{rate / floor_rate:.2f}",
                ]
            )
        print("Slot cost: one thread, uncontended")
        print(f"load average: {load_average()} (a shared machine: compare rows, not runs)")
        print()
        print(table(["call", "calls/s", "µs/call", "round trips", "x floor"], rows))


if __name__ == "__main__":
    main()
