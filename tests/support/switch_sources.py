"""Where the switch may live besides the table: a private etcd, a loopback Apollo.

``EtcdServer`` runs Debian's ``etcd`` (package ``etcd-server``) on free ports, with a
data directory of its own, so a test may stop and restart it; keys are written with
``etcdctl``, as an operator would, not through the code under test.

``ApolloServer`` is not Apollo (its Java distribution cannot run here): it is a loopback
HTTP server implementing the two calls of Apollo's documented config-service API the
limiter makes (docs/design.md, "The switch from etcd or Apollo"):

- ``GET /configs/{appId}/{cluster}/{namespace}``: 200 and ``{"appId", "cluster",
  "namespaceName", "configurations": {...}, "releaseKey"}``; 404 for a namespace that
  has never been released; 304 when the query's ``releaseKey`` is the current one.
- ``GET /notifications/v2?appId=&cluster=&notifications=[{"namespaceName",
  "notificationId"}]``: 200 and ``[{"namespaceName", "notificationId", "messages"}]`` at
  once for each namespace whose id is newer than the client's (-1: any), else held until
  a release, or 304 after ``hold_s`` (Apollo: 60 s).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import httpx

from tests.support.services import TlsFiles, free_port, require


class EtcdServer:
    """A private single-member etcd on 127.0.0.1, which a test may stop and restart."""

    def __init__(self, tls: TlsFiles | None = None) -> None:
        #: TLS only, with client certificates required (``tls.client_cert``)
        self.tls = tls
        self.port = free_port()
        self.peer_port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="gwl-etcd-"))
        self.log = self.dir / "etcd.log"
        self.proc: subprocess.Popen[bytes] | None = None
        #: "user:password" etcdctl logs in with, once ``enable_auth`` has run
        self.root = ""

    @property
    def endpoint(self) -> str:
        """Its client URL."""
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def url(self, key: str) -> str:
        """A ``switch_source`` naming ``key`` on this server (with TLS: the CA and the
        client certificate in its query)."""
        if self.tls is None:
            return f"etcd://127.0.0.1:{self.port}/{key}"
        t = self.tls
        query = f"ssl_ca_certs={t.ca}&ssl_certfile={t.client_cert}&ssl_keyfile={t.client_key}"
        return f"etcds://127.0.0.1:{self.port}/{key}?{query}"

    def _tls_arguments(self) -> list[str]:
        t = self.tls
        if t is None:
            return []
        return [
            f"--cert-file={t.server_cert}",
            f"--key-file={t.server_key}",
            f"--trusted-ca-file={t.ca}",
            "--client-cert-auth",
        ]

    def _tls_client(self) -> dict[str, Any]:
        t = self.tls
        if t is None:
            return {}
        context = ssl.create_default_context(cafile=str(t.ca))
        context.load_cert_chain(str(t.client_cert), str(t.client_key))
        return {"verify": context}

    def start(self) -> EtcdServer:
        """Start (or restart, on the same ports and data) and wait until it answers."""
        binary = shutil.which("etcd")
        if binary is None:
            require("etcd", "not on PATH (Debian package etcd-server)")
        peer = f"http://127.0.0.1:{self.peer_port}"
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    str(binary),
                    "--name=gwl",
                    f"--data-dir={self.dir / 'data'}",
                    f"--listen-client-urls={self.endpoint}",
                    f"--advertise-client-urls={self.endpoint}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=gwl={peer}",
                    "--log-level=error",
                    *self._tls_arguments(),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                answer = httpx.get(f"{self.endpoint}/health", timeout=1, **self._tls_client())
                if answer.status_code == 200:
                    return self
            except httpx.HTTPError:
                if self.proc.poll() is not None:
                    break
            time.sleep(0.05)
        said = self.log.read_text(errors="replace").strip().splitlines()[-3:]
        self.kill()
        raise RuntimeError(f"etcd on port {self.port} did not start: {said}")

    def kill(self) -> None:
        """SIGKILL: connections drop, the port refuses (the data stays on disk)."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            self.proc = None

    def stop(self) -> None:
        """Stop and remove its directory."""
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _etcdctl(self, *args: str) -> str:
        binary = shutil.which("etcdctl")
        if binary is None:
            require("etcdctl", "not on PATH (Debian package etcd-client)")
        login = [f"--user={self.root}"] if self.root else []
        if self.tls is not None:
            t = self.tls
            login += [f"--cacert={t.ca}", f"--cert={t.client_cert}", f"--key={t.client_key}"]
        done = subprocess.run(
            [str(binary), f"--endpoints={self.endpoint}", *login, *args],
            env={**os.environ, "ETCDCTL_API": "3"},
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return done.stdout

    def enable_auth(self, password: str) -> None:
        """Add the user ``root`` with ``password`` and turn authentication on: from now
        on every request must log in."""
        self._etcdctl("user", "add", f"root:{password}", "--interactive=false")
        self._etcdctl("auth", "enable")
        self.root = f"root:{password}"

    def put(self, key: str, value: str) -> None:
        """``etcdctl put key value``."""
        self._etcdctl("put", "--", key, value)

    def delete(self, key: str) -> None:
        """``etcdctl del key``."""
        self._etcdctl("del", "--", key)

    def get(self, key: str) -> str | None:
        """The key's value read through the v3 gateway (None: no such key)."""
        encoded = base64.b64encode(key.encode()).decode()
        body = httpx.post(f"{self.endpoint}/v3/kv/range", json={"key": encoded}).json()
        kvs = body.get("kvs")
        return None if not kvs else base64.b64decode(kvs[0]["value"]).decode()


class ApolloServer:
    """Apollo's config service as its open API documents it, on 127.0.0.1 (see above)."""

    def __init__(self, hold_s: float = 60.0) -> None:
        self.port = free_port()
        self.hold_s = hold_s
        #: (appId, cluster, namespace) -> configurations, releaseKey, notificationId
        self.namespaces: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._notification = 0
        self._changed = threading.Condition()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._down = False
        #: every request's path and query, for a test to check what the client asked
        self.requests: list[str] = []
        self.connections: set[socket.socket] = set()

    def url(self, app: str, namespace: str, key: str, cluster: str = "") -> str:
        """A ``switch_source`` naming ``key`` of ``namespace`` of ``app`` here."""
        tail = f"&cluster={cluster}" if cluster else ""
        return f"apollo://127.0.0.1:{self.port}/{app}/{namespace}?key={key}{tail}"

    def release(
        self, app: str, namespace: str, values: dict[str, str], cluster: str = "default"
    ) -> None:
        """Release ``values`` as the namespace's whole configuration (what the portal's
        "release" does): held notification polls answer at once."""
        with self._changed:
            self._notification += 1
            self.namespaces[(app, cluster, namespace)] = {
                "configurations": dict(values),
                "releaseKey": f"{time.strftime('%Y%m%d%H%M%S')}-{self._notification}",
                "notificationId": self._notification,
            }
            self._changed.notify_all()

    def start(self) -> ApolloServer:
        """Listen (again, on the same port)."""
        server = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        server.daemon_threads = True
        self._down = False
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening; held polls are dropped without an answer (a dead server)."""
        server, self._server = self._server, None
        with self._changed:
            self._down = True
            self._changed.notify_all()
        if server is not None:
            server.shutdown()
            server.server_close()
        for connection in list(self.connections):  # kept-alive ones too: it is dead
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    # -- what the handler calls --

    def configs(self, app: str, cluster: str, namespace: str, release_key: str) -> Any:
        with self._changed:
            found = self.namespaces.get((app, cluster, namespace))
            if found is None:
                return 404
            if release_key and release_key == found["releaseKey"]:
                return 304
            return {
                "appId": app,
                "cluster": cluster,
                "namespaceName": namespace,
                "configurations": dict(found["configurations"]),
                "releaseKey": found["releaseKey"],
            }

    def notifications(self, app: str, cluster: str, asked: list[dict[str, Any]]) -> Any:
        deadline = time.monotonic() + self.hold_s

        def newer() -> list[dict[str, Any]]:
            out = []
            for item in asked:
                namespace = str(item["namespaceName"])
                found = self.namespaces.get((app, cluster, namespace))
                if found is not None and found["notificationId"] > int(item["notificationId"]):
                    key = f"{app}+{cluster}+{namespace}"
                    out.append(
                        {
                            "namespaceName": namespace,
                            "notificationId": found["notificationId"],
                            "messages": {"details": {key: found["notificationId"]}},
                        }
                    )
            return out

        with self._changed:
            while True:
                if self._down:
                    return None  # drop the connection
                found = newer()
                if found:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    return 304
                self._changed.wait(left)


def _handler(apollo: ApolloServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def setup(self) -> None:
            super().setup()
            apollo.connections.add(self.connection)

        def finish(self) -> None:
            apollo.connections.discard(self.connection)
            with contextlib.suppress(OSError):
                super().finish()

        def do_GET(self) -> None:
            if apollo._down:
                self.close_connection = True
                return
            parts = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            apollo.requests.append(self.path)
            path = [unquote(p) for p in parts.path.strip("/").split("/")]
            if len(path) == 4 and path[0] == "configs":
                answer = apollo.configs(path[1], path[2], path[3], query.get("releaseKey", ""))
            elif path == ["notifications", "v2"]:
                try:
                    asked = json.loads(query["notifications"])
                    app, cluster = query["appId"], query["cluster"]
                except (KeyError, ValueError):
                    answer = 400
                else:
                    answer = apollo.notifications(app, cluster, asked)
            else:
                answer = 404
            if answer is None:
                self.close_connection = True
                return
            if isinstance(answer, int):
                self.send_response(answer)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json;charset=UTF-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


class Centre:
    """A configuration centre as a test drives it: one key, set, deleted, stopped."""

    kind = ""

    def url(self) -> str:
        raise NotImplementedError

    def set(self, value: str) -> None:
        raise NotImplementedError

    def delete(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError


class EtcdCentre(Centre):
    kind = "etcd"

    def __init__(self, server: EtcdServer) -> None:
        self.server = server
        self.key = f"gwl/{uuid.uuid4().hex[:8]}/switch"

    def url(self) -> str:
        return self.server.url(self.key)

    def set(self, value: str) -> None:
        self.server.put(self.key, value)

    def delete(self) -> None:
        self.server.delete(self.key)

    def stop(self) -> None:
        self.server.kill()

    def start(self) -> None:
        self.server.start()


class ApolloCentre(Centre):
    kind = "apollo"

    def __init__(self, server: ApolloServer) -> None:
        self.server = server
        self.app = f"gw{uuid.uuid4().hex[:8]}"

    def url(self) -> str:
        return self.server.url(self.app, "application", "limiter.switch")

    def set(self, value: str) -> None:
        self.server.release(self.app, "application", {"limiter.switch": value, "other": "x"})

    def delete(self) -> None:
        self.server.release(self.app, "application", {"other": "y"})

    def stop(self) -> None:
        self.server.stop()

    def start(self) -> None:
        self.server.start()


@contextmanager
def private_centre(kind: str) -> Iterator[Centre]:
    """A private etcd or Apollo (the test may stop it), removed afterwards."""
    if kind == "etcd":
        server = EtcdServer().start()
        try:
            yield EtcdCentre(server)
        finally:
            server.stop()
    else:
        apollo = ApolloServer().start()
        try:
            yield ApolloCentre(apollo)
        finally:
            apollo.stop()
