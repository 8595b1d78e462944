"""A multiprocessing pool with the fork start method: the limiter starts before the fork.

    printf '/ibe/flight/search /ibe/fare/quote\n' | python fork_pool.py

Each line on stdin is a batch of jobs (interfaces, separated by spaces), spread over the
pool's workers; each job's decision is printed as a line of JSON, in order. The limiter
is started in the parent, before the pool forks its workers, so that a bad setting
fails the service at once, before any work is taken. Each
worker then runs a limiter of its own (its connections, reloads and fleet membership:
gateway_limiter/lifecycle.py); the parent, which only hands out jobs, leaves the fleet.
Settings come from ``settings.toml`` or ``GATEWAY_LIMITER_*`` variables.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from typing import Any

from gateway_limiter import GatewayLimiter

WORKERS = int(os.environ.get("WORKERS", "2"))

limiter = GatewayLimiter.from_settings()


def job(url: str) -> dict[str, Any]:
    """One job, in a worker: decide without waiting, then (here) say what was decided."""
    decision = limiter.decide(url, timeout=0)
    # ... call the supplier when decision.allowed ...
    return {"pid": os.getpid(), "url": url, "allowed": decision.allowed, "limit": decision.limit}


def main() -> None:
    limiter.start()
    try:
        with multiprocessing.get_context("fork").Pool(WORKERS) as pool:
            print(json.dumps({"workers": [p.pid for p in multiprocessing.active_children()]}))
            sys.stdout.flush()
            for line in sys.stdin:
                for result in pool.map(job, line.split(), chunksize=1):
                    print(json.dumps(result))
                sys.stdout.flush()
    finally:
        limiter.close()


if __name__ == "__main__":
    main()
