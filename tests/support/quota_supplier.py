"""A supplier that sells a daily quota and counts it itself: a real HTTP/1.1 server on a
loopback port, shared by the fleet and by callers outside it.

Every request it receives spends one call of its day (whoever sent it); past the quota
it answers 429. Every answer says what is left, as real suppliers do: by default
``X-RateLimit-Limit`` / ``X-RateLimit-Remaining`` / ``X-RateLimit-Reset`` (epoch seconds
of its next midnight), or the IETF ``RateLimit`` / ``RateLimit-Policy`` fields
(``ietf=True``: seconds to its midnight).
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Self

from gateway_limiter.model.calendar import Calendar


class QuotaSupplier:
    """A ``ThreadingHTTPServer`` on 127.0.0.1 selling ``quota`` calls a day in ``zone``."""

    def __init__(self, quota: int, zone: str, ietf: bool = False) -> None:
        self.quota = quota
        self.calendar = Calendar.of("day", zone)
        self.ietf = ietf
        self.lock = threading.Lock()
        #: calls received this day (every caller), and the 429s answered
        self.spent = 0
        self.refused = 0
        supplier = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                with supplier.lock:
                    if supplier.spent < supplier.quota:
                        supplier.spent += 1
                        status = 200
                    else:
                        supplier.refused += 1
                        status = 429
                    left = supplier.quota - supplier.spent
                midnight = supplier.calendar.period_at(time.time())[1]
                body = f"{status}\n".encode()
                self.send_response(status)
                if supplier.ietf:
                    self.send_header("RateLimit-Policy", f'"day";q={supplier.quota};w=86400')
                    ahead = max(0, int(midnight - time.time()))
                    self.send_header("RateLimit", f'"day";r={left};t={ahead}')
                else:
                    self.send_header("X-RateLimit-Limit", str(supplier.quota))
                    self.send_header("X-RateLimit-Remaining", str(left))
                    self.send_header("X-RateLimit-Reset", str(midnight))
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        """``http://127.0.0.1:<port><path>``."""
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

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
