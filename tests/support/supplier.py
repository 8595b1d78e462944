"""A supplier for the integration tests: a real HTTP/1.1 server on a loopback port.

It answers from a script (``answer``: the next requests' status and headers; then 200)
and records each request it received (path, headers, arrival), so a test can tell a
request the limiter refused (never arrived) from one the supplier refused.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Self


@dataclass(frozen=True)
class Received:
    """One request as the supplier saw it."""

    path: str
    headers: dict[str, str]
    at: float  # time.monotonic() on arrival


class Supplier:
    """A ``ThreadingHTTPServer`` on 127.0.0.1 and a free port, in a daemon thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.script: deque[tuple[int, dict[str, str]]] = deque()
        self.received: list[Received] = []
        supplier = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as real suppliers do

            def do_GET(self) -> None:
                with supplier.lock:
                    supplier.received.append(
                        Received(self.path, dict(self.headers.items()), time.monotonic())
                    )
                    status, headers = supplier.script.popleft() if supplier.script else (200, {})
                body = f"{status} {self.path}\n".encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # the test reads ``received``, not stderr

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self.server.server_address[1])

    def url(self, path: str) -> str:
        """``http://127.0.0.1:<port><path>``."""
        return f"http://127.0.0.1:{self.port}{path}"

    def answer(self, status: int, headers: dict[str, str] | None = None, times: int = 1) -> None:
        """Answer the next ``times`` requests with ``status`` and ``headers``."""
        with self.lock:
            self.script.extend([(status, headers or {})] * times)

    def count(self, path: str | None = None) -> int:
        """Requests received (on ``path``, if given)."""
        with self.lock:
            return sum(1 for r in self.received if path is None or r.path == path)

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
