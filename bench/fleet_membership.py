#!/usr/bin/env python
"""Fleet membership: what one heartbeat costs the Redis server, by the size of the fleet.

Run from the checkout, with the venv's Python::

    python bench/fleet_membership.py            # full run, a few seconds
    python bench/fleet_membership.py --quick    # smoke run

One private ``redis-server`` (free port, no persistence). For each fleet size M and
number of interfaces I each member reports demand on, M members join (one heartbeat
each, as ``backends/fleet.py`` sends it); the server's statistics are then reset and
HEARTBEATS heartbeats are sent round-robin by members of that fleet (each with fresh
demand figures, so the claims move), and ``INFO commandstats`` gives the server's own
time per ``EVAL`` (``usec_per_call``): the cost of one heartbeat on the server,
whatever the network and this client add. Also counted: ``EVAL`` calls per
heartbeat, i.e. round trips (must be 1).
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence
from pathlib import Path

import redis

# Run as a script from anywhere: the checkout's package wins over any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness.report import load_average, machine_facts, table
from bench.harness.servers import private_redis
from gateway_limiter.backends.fleet import encode_demand, encode_member, heartbeat_args

TTL_MS = 60_000


def member(n: int) -> str:
    """A member's text as a real process would write it."""
    return encode_member(f"host-{n % 50}.example", 10_000 + n, 1.7e9, "1.0", 3000)


def demand(interfaces: int) -> str:
    """Fresh demand figures on ``interfaces`` interfaces."""
    return encode_demand({f"/api/v1/i{i}": random.uniform(0.01, 100.0) for i in range(interfaces)})


def measure(
    client: redis.Redis, prefix: str, members: int, interfaces: int, beats: int
) -> tuple[float, float]:
    """(server µs per heartbeat, EVAL calls per heartbeat) in a fleet of ``members``."""
    for n in range(members):
        client.eval(*heartbeat_args(prefix, member(n), TTL_MS, demand(interfaces)))
    client.config_resetstat()
    for i in range(beats):
        n = i % members
        client.eval(*heartbeat_args(prefix, member(n), TTL_MS, demand(interfaces)))
    stats = client.info("commandstats")["cmdstat_eval"]
    return float(stats["usec_per_call"]), int(stats["calls"]) / beats


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer heartbeats (a smoke run)")
    args = parser.parse_args(argv)
    beats = 200 if args.quick else 2000
    rows = []
    with private_redis() as url:
        client = redis.Redis.from_url(url, socket_timeout=30)
        for line in machine_facts(client, url, private=True):
            print(line)
        print()
        for members in (1, 10, 100, 1000):
            for interfaces in (0, 1, 20, 50):
                prefix = f"m{members}i{interfaces}"
                usec, per_beat = measure(client, prefix, members, interfaces, beats)
                rows.append([f"{members:,}", str(interfaces), f"{usec:.1f}", f"{per_beat:.2f}"])
        client.close()
    print(
        f"Fleet membership: server time per heartbeat, {beats} heartbeats a cell "
        f"(load average now {load_average()})"
    )
    headers = ["members", "interfaces each", "server us per heartbeat", "EVAL per heartbeat"]
    print(table(headers, rows, left=0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
