#!/usr/bin/env python
"""A threaded gateway whose upstream HTTP calls are guarded by ``GatewayLimiter``.

Runs as written, with no servers and no network: the "supplier" is an HTTP server from
the standard library that this script starts on a free loopback port, the limits live
in a SQLite file in a temporary folder (removed at the end), and the bucket is
in-process (``memory://``). Point ``database_url`` at MySQL and ``redis_url`` at Redis
and the same code keeps a whole fleet within the supplier's rate.

    python examples/threaded_http_guard.py

What it shows: 40 requests arrive at once, one per worker thread, for an interface
limited to 10 calls/s with a wait budget (``cache``) of 0.5 s. The limiter lets 10
through at once (the permits a full bucket has saved up), makes the next 5 wait their
turn within the budget (one every 100 ms), and refuses the other 25 at once, without
waiting. The supplier sees the token-bucket envelope and no more: the k-th call no
sooner than (k - 10) / 10 s after the burst.
"""

from __future__ import annotations

import collections
import logging
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from gateway_limiter import GatewayLimiter, admin

INTERFACE = "/ibe/flight/search"
RATE = 10  # calls per second the supplier's contract allows
BUDGET = 0.5  # seconds a request may wait for a permit (the row's cache)
REQUESTS = 40


# --- the supplier: a local HTTP server that remembers when each call arrived ----------


def start_supplier(arrivals: list[float]) -> ThreadingHTTPServer:
    """An HTTP server on a free loopback port, answering every GET with a small JSON body."""

    class Supplier(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the name http.server calls
            arrivals.append(time.monotonic())  # list.append is atomic: no lock needed
            body = b'{"flights": ["MU5101", "CA1501"]}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per request on stderr would drown the example's output

    class Server(ThreadingHTTPServer):
        # The default listen backlog (5) drops the SYNs of a burst of 10 connections,
        # and the kernel retries them a second later: the supplier would look slow.
        request_queue_size = 128

    server = Server(("127.0.0.1", 0), Supplier)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# --- the gateway ---------------------------------------------------------------------


def search_flights(limiter: GatewayLimiter, base: str) -> str:
    """One gateway request: call the supplier only with a permit, else answer busy."""
    if not limiter.try_acquire(INTERFACE):  # waits up to the row's cache, or refuses
        return "busy"  # or degrade: answer from a cache, queue the booking, ...
    with urllib.request.urlopen(base + INTERFACE, timeout=5) as response:
        return f"supplier {response.status}"


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="gateway-limiter-example-") as folder:
        # The limits table, as operations staff would fill it (``gateway-limiter db
        # upgrade`` and ``conf set`` do the same from the command line).
        database_url = f"sqlite:///{Path(folder) / 'limits.db'}"
        admin.upgrade(database_url)
        admin.set_limit(database_url, INTERFACE, rate=RATE, cache=BUDGET)

        arrivals: list[float] = []
        supplier = start_supplier(arrivals)
        base = f"http://127.0.0.1:{supplier.server_address[1]}"
        print(f"supplier on {base}, limited to {RATE}/s; {REQUESTS} worker threads")

        try:
            with (
                GatewayLimiter(database_url=database_url, redis_url="memory://") as limiter,
                ThreadPoolExecutor(max_workers=REQUESTS) as pool,
            ):
                start = threading.Barrier(REQUESTS)  # every request arrives at once

                def request() -> str:
                    start.wait()
                    return search_flights(limiter, base)

                started = time.monotonic()
                answers = list(pool.map(lambda _: request(), range(REQUESTS)))
                took = time.monotonic() - started
        finally:
            supplier.shutdown()
            supplier.server_close()

    counted = collections.Counter(answers)
    print(f"{REQUESTS} requests at once -> {dict(counted)} in {took:.2f} s")
    print(f"admitted {counted['supplier 200']}, refused {counted['busy']}")
    offsets = sorted(t - started for t in arrivals)
    print("supplier saw calls at (s):", " ".join(f"{t:.1f}" for t in offsets))
    for k, t in enumerate(offsets, start=1):  # the k-th call: at least (k - C) / r in
        assert t >= (k - RATE) / RATE - 0.01, f"call {k} came {t:.3f} s in: too early"


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    main()
