#!/usr/bin/env python
"""Fleet outage: what a fleet of real processes admits while Redis is killed, per policy.

Run from the checkout, with the venv's Python (it needs the test extras: the fleet and
the restartable Redis are the tests' own, tests/support/outage.py)::

    python bench/fleet_outage.py            # full run, about 1 minute
    python bench/fleet_outage.py --quick    # smoke run: a 3 s outage, about 35 s
    python bench/fleet_outage.py --quick --only local    # one row, about 12 s

Four processes (``python -m tests.support.fleet``) call ``try_acquire(url, timeout=0)``
on one interface (R = 40/s, C = 40; the rule on a temporary SQLite table), every
other setting the default. After 3 s (every process knows N = 4) one private
``redis-server`` is SIGKILLed for 8 s and restarted empty. Rows:

- ``share``, even demand: 3 unpaced threads per process (each far above its share);
- ``local``, the same load: each process decides the whole rule alone;
- ``share``, uneven demand: one process carries 80 % of 50 calls/s (12 threads of
  10/3 calls/s), the three others one such thread each.

Columns: calls made; admitted over the outage against 0.8 x R x D; admitted per
process; the most and least admitted in any 1 s window from 1.5 s into the outage
(10 ms steps; a call counts only if it began and ended in the window) against
1.15 x R.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path

# Run as a script from anywhere: the checkout's package wins over any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness.limiters import write_rows
from bench.harness.report import load_average, machine_facts, table
from tests.support.outage import (
    CAPACITY,
    OUTAGE_S,
    PROCESSES,
    RATE,
    UNEVEN_PACE,
    UNEVEN_THREADS,
    URL,
    run_outage,
)
from tests.support.services import RedisServer

#: The table's rows by ``--only``'s name: label, policy, threads per process, pace.
CASES: dict[str, tuple[str, str, list[int] | None, float]] = {
    "share": ("share (default), even demand", "share", None, 0.0),
    "local": ("local, even demand", "local", None, 0.0),
    "uneven": ("share (default), 80 % on one process", "share", UNEVEN_THREADS, UNEVEN_PACE),
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 3 s outage (a smoke run)")
    parser.add_argument(
        "--only",
        choices=sorted(CASES),
        help="run one row: share (even demand), local, or uneven (share, 80 %% on one)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the three rows and print the table."""
    args = parse_args(argv)
    outage_s = 3.0 if args.quick else OUTAGE_S
    rows = []
    with tempfile.TemporaryDirectory(prefix="gwl-bench-outage-") as workdir:
        database_url = f"sqlite:///{Path(workdir) / 'limits.db'}"
        write_rows(database_url, {URL: {"rate_limit": RATE, "cache": 0.0}})
        server = RedisServer().start()
        try:
            for line in machine_facts(server.client(), server.url, private=True):
                print(line)
            print()
            cases = [CASES[args.only]] if args.only else list(CASES.values())
            for label, policy, threads, paced in cases:
                prefix = f"bench{uuid.uuid4().hex[:8]}"
                report = run_outage(
                    database_url,
                    server,
                    prefix,
                    policy,
                    threads=threads,
                    paced=paced,
                    outage_s=outage_s,
                )
                f = report.figures()
                rows.append(
                    [
                        label,
                        f"{report.calls:,}",
                        "/".join(str(n) for n in report.sizes_before),
                        f"{f['admitted_in_outage']} ({f['floor_0_8_R_D']:.0f})",
                        "/".join(str(n) for n in f["by_process"]),
                        f"{f['most_in_1s']} ({f['ceiling_1_15_R']:.0f})",
                        str(f["least_in_1s"]),
                    ]
                )
        finally:
            server.stop()
    print(
        f"Fleet outage: {PROCESSES} processes, R = {RATE}/s, C = {CAPACITY}, "
        f"Redis killed for {outage_s:.0f} s (load average now {load_average()})"
    )
    headers = [
        "policy, demand",
        "calls",
        "N known",
        "admitted in outage (0.8 R D)",
        "per process",
        "most in 1 s (1.15 R)",
        "least in 1 s",
    ]
    print(table(headers, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
