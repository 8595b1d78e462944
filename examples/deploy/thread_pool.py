"""A plain thread-pool service: one limiter, shared by every thread of the process.

    printf '/ibe/flight/search /ibe/fare/quote\n' | python thread_pool.py

Each line on stdin is a batch of jobs (interfaces, separated by spaces), run on a
``ThreadPoolExecutor``; each job's decision is printed as a line of JSON, in order. A
``GatewayLimiter`` is safe to share between threads: build and start one per process
(``with`` closes it, and leaves the fleet, when the service ends). Jobs that may wait
for a permit simply pass a ``timeout`` (or none: the row's ``cache``); the wait is the
calling thread's. Settings come from ``settings.toml`` or ``GATEWAY_LIMITER_*``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gateway_limiter import GatewayLimiter

THREADS = int(os.environ.get("THREADS", "8"))


def main() -> None:
    with GatewayLimiter.from_settings() as limiter, ThreadPoolExecutor(THREADS) as pool:

        def job(url: str) -> dict[str, Any]:
            decision = limiter.decide(url, timeout=0)
            # ... call the supplier when decision.allowed ...
            return {
                "pid": os.getpid(),
                "thread": threading.get_ident(),
                "url": url,
                "allowed": decision.allowed,
                "limit": decision.limit,
            }

        print(json.dumps({"workers": [os.getpid()]}), flush=True)
        for line in sys.stdin:
            for result in pool.map(job, line.split()):
                print(json.dumps(result))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
