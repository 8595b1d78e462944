#!/usr/bin/env python
"""A gateway's calls to its supplier through httpx and requests, limited fleet-wide.

Runs as written: the supplier is a small HTTP server this script starts on a free
loopback port, the limits live in a SQLite file in a temporary folder and the buckets
in this process (``memory://``); pass ``--database-url`` (MySQL/MariaDB) and
``--redis-url`` and the same code keeps a whole fleet within the supplier's rate.

    pip install 'gateway-limiter[httpx,requests]'
    python examples/http_client_integrations.py

What it shows:

1. httpx, ``LimiterTransport``: an interface limited to 3 calls a minute. Three calls
   reach the supplier; the fourth raises ``Refused`` (carrying the Decision: why, and
   when to retry) and never leaves the process.
2. requests, ``LimiterAdapter``: the supplier answers 429 with ``Retry-After: 2``. The
   adapter tells the fleet (``limiter.pushback``), so for the next 2 s every process
   refuses the interface without calling the supplier; then calls go again.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import requests

from gateway_limiter import GatewayLimiter, Refused, admin
from gateway_limiter.integrations.httpx import LimiterTransport
from gateway_limiter.integrations.requests import LimiterAdapter

SEARCH = "/ibe/flight/search"  # 3 a minute
QUOTE = "/ibe/fare/quote"  # 50 a second; the supplier pushes back once


def start_supplier() -> ThreadingHTTPServer:
    """The supplier: 200 to everything, except a 429 with Retry-After: 2 to the first
    fare quote."""
    pushed = threading.Event()

    class Supplier(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            busy = self.path == QUOTE and not pushed.is_set()
            if busy:
                pushed.set()
            body = b"slow down\n" if busy else b'{"fares": [420, 515]}\n'
            self.send_response(429 if busy else 200)
            if busy:
                self.send_header("Retry-After", "2")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Supplier)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description="httpx and requests through the limiter")
    parser.add_argument("--database-url", help="default: a SQLite file in a temporary folder")
    parser.add_argument("--redis-url", default="memory://", help="default: memory://")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gateway-limiter-example-") as folder:
        database_url = args.database_url or f"sqlite:///{Path(folder) / 'limits.db'}"
        admin.upgrade(database_url)
        admin.set_limit(database_url, SEARCH, rate=3, period_seconds=60, cache=0)
        admin.set_limit(database_url, QUOTE, rate=50, cache=0)
        supplier = start_supplier()
        base = f"http://127.0.0.1:{supplier.server_address[1]}"
        with GatewayLimiter(database_url=database_url, redis_url=args.redis_url) as limiter:
            # 1. httpx: the transport decides before each request.
            with httpx.Client(transport=LimiterTransport(limiter), base_url=base) as client:
                answers = []
                for _ in range(4):
                    try:
                        answers.append(str(client.get(SEARCH).status_code))
                    except Refused as refused:
                        answers.append(f"refused ({refused.decision.reason})")
                print(f"httpx    {SEARCH}: {', '.join(answers)}")

            # 2. requests: a 429 with Retry-After holds the interface for the fleet.
            with requests.Session() as session:
                session.mount(base, LimiterAdapter(limiter))
                first = session.get(base + QUOTE, timeout=5)
                said = first.headers["Retry-After"]
                print(f"requests {QUOTE}: {first.status_code} Retry-After: {said}")
                pushed, refusals = time.monotonic(), 0
                while True:
                    try:
                        answer = session.get(base + QUOTE, timeout=5)
                        break
                    except Refused:
                        refusals += 1
                        time.sleep(0.1)
                held = time.monotonic() - pushed
                print(f"requests {QUOTE}: refused {refusals} times without a call, "
                      f"then {answer.status_code} after {held:.1f} s")  # fmt: skip
        supplier.shutdown()
        supplier.server_close()


if __name__ == "__main__":
    main()
