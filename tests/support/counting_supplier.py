"""A supplier on loopback, in a process of its own, that counts its own calls in flight.

``python -m tests.support.counting_supplier PORT DELAY_S`` serves:

- ``GET /call``: answers after ``DELAY_S`` seconds, counting the calls in flight;
- ``GET /stats``: JSON ``{"calls", "most_in_flight", "first_s", "last_s"}`` (the
  first call's arrival and the last call's end, on this process's monotonic clock);
- ``GET /reset``: starts the counts afresh.

``Supplier`` starts one on a free port and reads its stats, for a test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support.services import free_port


class _Counts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.in_flight = 0
        self.most = 0
        self.calls = 0
        self.first_s: float | None = None
        self.last_s: float | None = None


def serve(port: int, delay_s: float) -> None:
    """Serve until killed."""
    counts = _Counts()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # The headers and the body go out in two writes: on a kept-alive connection
        # Nagle would hold the body back until the client's delayed ACK (40 ms on
        # Linux), which no real supplier adds to a call.
        disable_nagle_algorithm = True

        def do_GET(self) -> None:
            if self.path == "/call":
                with counts.lock:
                    counts.in_flight += 1
                    counts.most = max(counts.most, counts.in_flight)
                    if counts.first_s is None:
                        counts.first_s = time.monotonic()
                # real time: the supplier's own latency
                time.sleep(delay_s)
                with counts.lock:
                    counts.in_flight -= 1
                    counts.calls += 1
                    counts.last_s = time.monotonic()
                body = b"ok"
            elif self.path == "/stats":
                with counts.lock:
                    body = json.dumps(
                        {
                            "calls": counts.calls,
                            "most_in_flight": counts.most,
                            "first_s": counts.first_s,
                            "last_s": counts.last_s,
                        }
                    ).encode()
            elif self.path == "/reset":
                with counts.lock:
                    counts.reset()
                body = b"reset"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.serve_forever()


class Supplier:
    """A supplier process on a free loopback port (``stop()`` kills it)."""

    def __init__(self, delay_s: float) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        checkout = Path(__file__).resolve().parents[2]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.counting_supplier", str(self.port), str(delay_s)],
            cwd=checkout,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                self.stats()
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise
                time.sleep(0.05)

    def stats(self) -> dict[str, Any]:
        """The supplier's own counts."""
        with urllib.request.urlopen(self.url + "/stats", timeout=5) as reply:
            stats: dict[str, Any] = json.loads(reply.read())
            return stats

    def stop(self) -> None:
        """Kill the process."""
        self.proc.kill()
        self.proc.wait(10)


if __name__ == "__main__":
    serve(int(sys.argv[1]), float(sys.argv[2]))
