#!/usr/bin/env python
"""What the console's live numbers cost a decision: the per-interface tally each
decision adds (``core/fleet.py``, ``Tallies.add``), measured side by side with the
same limiter whose tally is switched off.

Run from the checkout, with the venv's Python (about 20 s)::

    python bench/console_tally_cost.py
    python bench/console_tally_cost.py --quick   # smoke run: 3 rounds of 2,000 calls

One limiter on ``memory://`` (no network, so the in-process cost is not lost in a
round trip's noise) decides ``try_acquire(url, timeout=0)`` on an enabled row with a
rate no call reaches. Two variants of the very same limiter are timed in interleaved
rounds: "tally on" (as shipped) and "tally off" (``Tallies.add`` replaced by a
function that does nothing). Each round times 20,000 calls of each; the table gives
the best and the median per call over the rounds, the difference, and
``Tallies.add`` timed alone (what the difference is without the noise). The heartbeat's
side (encoding the rates once per ``fleet_heartbeat``) is off the decision path and
not measured here. On a shared, loaded machine read the medians with care.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import timeit
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

# Run as a script from anywhere: the checkout's package wins over any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness.args import description
from bench.harness.report import load_average, table
from gateway_limiter import GatewayLimiter
from gateway_limiter.core.fleet import Tallies

URL = "/bench/tally"
ROUNDS = 25
CALLS = 20_000


def per_call_us(limiter: GatewayLimiter, calls: int) -> float:
    """µs per ``try_acquire`` over ``calls`` calls."""
    decide = limiter.try_acquire
    start = time.perf_counter()
    for _ in range(calls):
        decide(URL, timeout=0)
    return (time.perf_counter() - start) / calls * 1e6


def nothing(self: Tallies, url: str, allowed: bool, waited: bool) -> None:
    """``Tallies.add`` switched off."""


def main(argv: Sequence[str] | None = None) -> int:
    """Print the side-by-side table (``--help`` says what it is)."""
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument(
        "--quick", action="store_true", help="3 rounds of 2,000 calls (a smoke run)"
    )
    args = parser.parse_args(argv)
    rounds, calls = (3, 2_000) if args.quick else (ROUNDS, CALLS)
    from bench.harness.limiters import sqlite_table, started_limiter

    with ExitStack() as stack:
        db = sqlite_table(stack, {URL: {"rate_limit": 100_000_000, "cache": 0.0}})
        limiter = started_limiter(
            stack, db, "memory://", "gwl-bench-tally", expect_rules=1, metrics=False
        )
        shipped: Any = Tallies.add
        times: dict[str, list[float]] = {"tally on": [], "tally off": []}
        for _ in range(rounds):
            for name, took in times.items():
                Tallies.add = shipped if name == "tally on" else nothing  # type: ignore[method-assign]
                try:
                    took.append(per_call_us(limiter, calls))
                finally:
                    Tallies.add = shipped  # type: ignore[method-assign]
        counted = sum(limiter.call_counts[URL])
    # The tally's own work, alone: what the difference above should be without noise.
    alone = Tallies()
    add = alone.add
    add_us = [
        timeit.timeit(lambda: add(URL, True, False), number=calls) / calls * 1e6
        for _ in range(rounds)
    ]
    on, off = times["tally on"], times["tally off"]
    print(f"load:     {load_average()}")
    print(f"rounds:   {rounds} x {calls} calls per variant, interleaved; memory://, metrics off")
    print(f"counted:  {counted} decisions by the tally (the 'on' rounds and the warm-up)")
    print()
    print(
        table(
            ["try_acquire per call", "best us", "median us"],
            [
                ["tally off", f"{min(off):.3f}", f"{statistics.median(off):.3f}"],
                ["tally on (as shipped)", f"{min(on):.3f}", f"{statistics.median(on):.3f}"],
                [
                    "difference",
                    f"{min(on) - min(off):+.3f}",
                    f"{statistics.median(on) - statistics.median(off):+.3f}",
                ],
                ["Tallies.add alone", f"{min(add_us):.3f}", f"{statistics.median(add_us):.3f}"],
            ],
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
