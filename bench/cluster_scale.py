#!/usr/bin/env python
"""Decisions per second on one Redis master against a 3-master Redis Cluster.

Run from the checkout, with the venv's Python::

    python bench/cluster_scale.py                 # 4 processes x 4 threads, 8 s a cell
    python bench/cluster_scale.py --processes 6 --threads 8 --seconds 10

It starts its own servers on free ports (no persistence; stopped on exit, Ctrl-C
included): one ``redis-server`` (``redis://``), and three ``redis-server
--cluster-enabled yes`` joined with ``redis-cli --cluster create`` (``redis+cluster://``,
no replicas). For each, P worker processes (each a ``GatewayLimiter`` with T threads)
call ``try_acquire(url, timeout=0)`` round-robin over N interfaces (default 256 rows of
a temporary SQLite table, rateLimit 10,000,000: every call admitted, every call one
``bucket.lua`` EVALSHA), start together after a warm-up, and count for a fixed time.
The table shows the calls per second summed over the processes, and how busy each
Redis process was (its CPU seconds over the run, from /proc: 1.00 = one core saturated).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# Run as a script from anywhere: the checkout's package wins over any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness.args import description, positive_float, positive_int
from bench.harness.limiters import write_rows
from bench.harness.servers import cpu_seconds, servers
from gateway_limiter import GatewayLimiter

RATE = 10_000_000


def worker(config: dict[str, object], queue: mp.Queue[int]) -> None:
    """One gateway process: T threads, round-robin over the interfaces, counting."""
    urls = [str(u) for u in config["urls"]]  # type: ignore[attr-defined]
    threads, start_at, seconds = (
        int(config["threads"]),  # type: ignore[call-overload]
        float(config["start_at"]),  # type: ignore[arg-type]
        float(config["seconds"]),  # type: ignore[arg-type]
    )
    counts = [0] * threads
    with GatewayLimiter(
        database_url=str(config["database_url"]),
        redis_url=str(config["redis_url"]),
        key_prefix="bench",
        reload_interval=3600,
        on_backend_error="deny",
        redis_timeout=1.0,
    ) as lim:
        for url in urls:  # warm: every node's connection and every Rule's plan
            lim.try_acquire(url, timeout=0)

        def run(n: int) -> None:
            i = n * 7
            time.sleep(max(0.0, start_at - time.time()))
            end = start_at + seconds
            while time.time() < end:
                if lim.try_acquire(urls[i % len(urls)], timeout=0):
                    counts[n] += 1
                i += 1

        pool = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        if lim.backend_fallbacks:
            raise SystemExit(f"{lim.backend_fallbacks} decisions fell back: Redis failed")
    queue.put(sum(counts))


def measure(
    masters: int, args: argparse.Namespace, database_url: str, urls: list[str]
) -> dict[str, Any]:
    """Calls/s over all processes, and each Redis process's CPU share, for one setup."""
    with servers(masters) as (redis_url, procs):
        ctx = mp.get_context("spawn")
        queue: mp.Queue[int] = ctx.Queue()
        start_at = time.time() + 4.0  # spawn, import, warm up
        config = {
            "urls": urls, "threads": args.threads, "start_at": start_at,
            "seconds": args.seconds, "database_url": database_url, "redis_url": redis_url,
        }  # fmt: skip
        workers = [ctx.Process(target=worker, args=(config, queue)) for _ in range(args.processes)]
        for w in workers:
            w.start()
        time.sleep(max(0.0, start_at - time.time()))
        cpu_before = [cpu_seconds(p.pid) for p in procs]
        time.sleep(args.seconds)
        cpu = [cpu_seconds(p.pid) - b for p, b in zip(procs, cpu_before, strict=True)]
        totals = [queue.get(timeout=120) for _ in workers]
        for w in workers:
            w.join(60)
            if w.exitcode != 0:
                raise SystemExit(f"a worker exited with {w.exitcode}")
    return {
        "masters": masters,
        "per_second": sum(totals) / args.seconds,
        "redis_cpu": [c / args.seconds for c in cpu],
    }


def main() -> None:
    """Measure one Redis and a 3-master cluster; print the table."""
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--processes", type=positive_int, default=4)
    parser.add_argument("--threads", type=positive_int, default=4)
    parser.add_argument("--interfaces", type=positive_int, default=256)
    parser.add_argument("--seconds", type=positive_float, default=8.0)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="gwl-bench-db-"))
    try:
        database_url = f"sqlite:///{workdir / 'limits.db'}"
        urls = [f"/bench/supplier/{i}" for i in range(args.interfaces)]
        write_rows(database_url, {url: {"rate_limit": RATE, "cache": 0.0} for url in urls})
        rows = [measure(m, args, database_url, urls) for m in (1, 3)]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"{args.processes} processes x {args.threads} threads, {args.interfaces} interfaces, "
        f"{args.seconds:g} s a cell, {os.cpu_count()} CPUs"
    )
    print("| Redis | decisions/s | Redis CPU per process (1.00 = one core) |")
    print("| --- | ---: | --- |")
    for row in rows:
        name = "1 master (redis://)" if row["masters"] == 1 else "3-master cluster"
        cpu = ", ".join(f"{c:.2f}" for c in row["redis_cpu"])
        print(f"| {name} | {row['per_second']:,.0f} | {cpu} |")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
