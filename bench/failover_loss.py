#!/usr/bin/env python
"""Failover loss: what a fleet admits over the rule when the Redis master is SIGKILLed
and a replica that may not have received the last decisions takes over.

Run from the checkout, with the venv's Python (it needs the test extras: the fleet,
the Sentinel group and the Cluster are the tests' own, tests/support/failover.py)::

    python bench/failover_loss.py              # 3 Sentinel runs + 2 Cluster runs
    python bench/failover_loss.py --quick      # one Sentinel run (a smoke run)
    python bench/failover_loss.py --runs 5     # 5 of each

Three processes (``python -m tests.support.fleet``), 3 unpaced threads each, call
``try_acquire(url, timeout=0)`` on one interface (R = 100/s, C = 100; the rule on a
temporary SQLite table), every other setting the default (``share`` while Redis is
away). After 3 s the master holding the bucket is SIGKILLed: on the Sentinel fixture
(1 master, 1 replica, one sentinel, down-after 1 s), or on a Cluster of 3 masters with
a replica each (node timeout 1 s). While the master runs, a sampler reads the
replica's ``slave_repl_offset`` and then the master's ``master_repl_offset`` every
10 ms: the bytes the replica is behind.

Table 1, per run: seconds to the promotion and to the first decision Redis made again;
admitted over the failover period T (1 s before the kill to 2 s after Redis decides
again) against R x T + C, and the excess (negative: headroom); the most admitted in
any 1 s window of T (10 ms steps; a call counts if it began and ended in the window);
the replication lag seen (median / max bytes, and in decisions and ms at the rate
Redis admitted); the bytes the promoted replica never received (the master's offset
just before the kill less the replica's just after) and the admitted decisions they
held. The ``--cut-runs`` rows write the row with ``maxPermits`` = 10 x R and cut the
replica off 300 ms before the kill, so that writes are surely lost. Table 2: admitted
per 1 s window from 2 s before the kill. Table 3: the price of making the replica
acknowledge each decision (``WAIT 1 100`` pipelined after it) against the decision
alone and under ``min-replicas-to-write``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

# Run as a script from anywhere: the checkout's package wins over any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness.args import description, positive_int
from bench.harness.limiters import write_rows
from bench.harness.report import load_average, table
from tests.support.clusters import LocalCluster, LocalSentinel
from tests.support.failover import (
    CAPACITY,
    PROCESSES,
    RATE,
    THREADS,
    URL,
    FailoverReport,
    SentinelTopology,
    cluster_topology,
    run_failover,
)

#: The replica's link is cut this long before the kill in the ``--cut-runs`` rows.
CUT_MS = 300.0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--quick", action="store_true", help="one Sentinel run (smoke)")
    parser.add_argument("--runs", type=int, default=3, help="Sentinel runs (default 3)")
    parser.add_argument("--cluster-runs", type=int, default=2, help="Cluster runs (default 2)")
    parser.add_argument(
        "--cut-runs",
        type=int,
        default=1,
        help="Sentinel runs with C = 10 x R and the replica's link cut 300 ms before the kill",
    )
    parser.add_argument(
        "--write-calls",
        type=positive_int,
        default=5000,
        help="calls per row of table 3 (default 5000)",
    )
    args = parser.parse_args(argv)
    for name in ("runs", "cluster_runs", "cut_runs"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: not >= 0")
    if args.quick:
        args.runs, args.cluster_runs, args.cut_runs, args.write_calls = 1, 0, 0, 500
    return args


def sentinel_run(
    database_url: str, capacity: int = CAPACITY, cut_ms: float = 0.0
) -> FailoverReport:
    """One run on a fresh Sentinel group."""
    group = LocalSentinel().start()
    try:
        prefix = f"bench{uuid.uuid4().hex[:8]}"
        name = "sentinel" if not cut_ms else f"sentinel, C = {capacity}, cut {cut_ms:.0f} ms"
        return run_failover(
            database_url,
            SentinelTopology(group),
            name,
            prefix,
            capacity=capacity,
            cut_ms=cut_ms,
        )
    finally:
        group.stop()


def cluster_run(database_url: str) -> FailoverReport:
    """One run on a fresh Cluster of 3 masters with a replica each."""
    cluster = LocalCluster(masters=3, replicas=1).start()
    try:
        prefix = f"bench{uuid.uuid4().hex[:8]}"
        return run_failover(database_url, cluster_topology(cluster, prefix), "cluster", prefix)
    finally:
        cluster.stop()


#: A write like a decision's: one script call that changes one key.
WRITE = "redis.call('INCR', KEYS[1]) return 1"


def write_cost(calls: int) -> list[list[str]]:
    """Round trip of one scripted write on a fresh Sentinel group's master: alone,
    followed by ``WAIT 1 100`` in the same pipeline (one round trip, held until the
    replica acknowledges), and alone under ``min-replicas-to-write 1`` /
    ``min-replicas-max-lag 1``. Rows: median and 99th percentile in µs, calls/s."""
    group = LocalSentinel().start()
    rows = []
    try:
        client = group.server_on(group.master_port()).client()

        def alone() -> None:
            client.eval(WRITE, 1, "gwl-bench:wait")

        missed = [0]  # WAITs that ran out (a loaded host can hold the replica 100 ms)

        def waited() -> None:
            pipe = client.pipeline(transaction=False)
            pipe.eval(WRITE, 1, "gwl-bench:wait")
            pipe.execute_command("WAIT", 1, 100)  # type: ignore[no-untyped-call]
            _, acked = pipe.execute()
            if int(acked) < 1:
                missed[0] += 1

        cases: list[tuple[str, Callable[[], None]]] = [
            ("decision alone", alone),
            ("decision + WAIT 1 100 (pipelined)", waited),
        ]
        for label, call in cases:
            rows.append(timed(label, call, calls))
        if missed[0]:  # timed: min(100, calls) warm-up calls, then calls
            rows[-1][0] += f" ({missed[0]} of {calls + min(100, calls)} not acked in 100 ms)"
        client.config_set("min-replicas-to-write", 1)
        client.config_set("min-replicas-max-lag", 1)
        rows.append(timed("decision, min-replicas-to-write 1", alone, calls))
    finally:
        group.stop()
    return rows


def timed(label: str, call: Callable[[], None], calls: int) -> list[str]:
    """``calls`` calls of ``call``: the row of ``write_cost``."""
    for _ in range(min(100, calls)):
        call()
    took = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        took.append(time.perf_counter() - t0)
    took.sort()
    median, p99 = took[len(took) // 2], took[int(len(took) * 0.99)]
    return [label, f"{median * 1e6:.0f}", f"{p99 * 1e6:.0f}", f"{len(took) / sum(took):,.0f}"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the failovers and print the tables."""
    args = parse_args(argv)
    reports: list[FailoverReport] = []
    with tempfile.TemporaryDirectory(prefix="gwl-bench-failover-") as workdir:
        database_url = f"sqlite:///{Path(workdir) / 'limits.db'}"
        write_rows(database_url, {URL: {"rate_limit": RATE, "cache": 0.0}})
        for _ in range(args.runs):
            reports.append(sentinel_run(database_url))
        for _ in range(args.cluster_runs):
            reports.append(cluster_run(database_url))
        if args.cut_runs:
            deep_url = f"sqlite:///{Path(workdir) / 'deep.db'}"
            deep = 10 * RATE
            write_rows(deep_url, {URL: {"rate_limit": RATE, "cache": 0.0, "max_permits": deep}})
            for _ in range(args.cut_runs):
                reports.append(sentinel_run(deep_url, capacity=deep, cut_ms=CUT_MS))
    print(
        f"Failover loss: {PROCESSES} processes x {THREADS} unpaced threads, R = {RATE}/s, "
        f"C = {CAPACITY}, master SIGKILLed (load average now {load_average()})"
    )
    rows = []
    for n, report in enumerate(reports, 1):
        f = report.figures()
        rows.append(
            [
                f"{n}. {f['topology']}",
                f"{f['calls']:,}",
                f"{f['promoted_s']:.2f} / {f['resumed_s']:.2f}",
                f"{f['period_s']:.2f}",
                f"{f['admitted_in_period']} ({f['bound_R_T_C']:.0f})",
                f"{f['excess']:+.0f}",
                f"{f['most_in_1s']}",
                f"{f['lag_bytes_median']:.0f} / {f['lag_bytes_max']}",
                f"{f['lag_decisions_median']:.2f} / {f['lag_decisions_max']:.2f}",
                f"{f['lag_ms_max']:.1f}",
                f"{f['lost_bytes']} ({f['lost_decisions']:.1f})",
                str(f["errors"]),
            ]
        )
    headers = [
        "run",
        "calls",
        "promoted / resumed s",
        "T s",
        "admitted in T (R T + C)",
        "excess",
        "most in 1 s",
        "lag bytes med / max",
        "lag decisions med / max",
        "lag ms max",
        "lost bytes (decisions)",
        "errors",
    ]
    print(table(headers, rows))
    print()
    print("Admitted per 1 s window, from 2 s before the kill (rule: R = 100 a second)")
    for n, report in enumerate(reports, 1):
        cells = " ".join(f"{count:4d}" for _, count in report.windows())
        print(f"  {n}. {cells}")
    print()
    print(f"Price of waiting for the replica: one client, {args.write_calls:,} calls each")
    print(table(["write", "median µs", "p99 µs", "calls/s"], write_cost(args.write_calls)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
