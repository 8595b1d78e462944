"""Real services for the tests: a private redis-server per use, a fresh MariaDB database.

Nothing here fakes a server. Under CI=true a service that cannot be reached fails the
test run (``require``); on a developer's machine it skips with the reason.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pymysql
import pytest
import redis

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
MARIADB_HOST = os.environ.get("GWL_TEST_MARIADB_HOST", "127.0.0.1")
MARIADB_PORT = int(os.environ.get("GWL_TEST_MARIADB_PORT", "3306"))
MARIADB_USER = os.environ.get("GWL_TEST_MARIADB_USER", "root")


def require(what: str, why: str) -> None:
    """A missing service: a failure in CI, a skip elsewhere."""
    message = f"{what} is not available: {why}"
    if IN_CI:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


#: The lowest port ``free_port`` hands out; it stays below the kernel's ephemeral range.
PORTS_FROM = 20000
_handed_out: set[int] = set()
_ports_lock = threading.Lock()
_pick = random.Random(os.getpid() ^ time.time_ns())


def _ephemeral_from() -> int:
    """The first port of the kernel's ephemeral range (where outgoing connections get
    their local port), 32768 when it cannot be read."""
    try:
        low = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]
        return int(low)
    except (OSError, ValueError, IndexError):
        return 32768


def _port_range() -> tuple[int, int]:
    """The ports ``free_port`` picks from: below the kernel's ephemeral range, and when
    the suite runs in several workers (pytest-xdist), only this worker's share of them,
    so that two workers never pick the same port between checking it and binding it."""
    low, top = PORTS_FROM, _ephemeral_from()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or "1")
    if worker.startswith("gw") and worker[2:].isdigit() and count > 1:
        share = (top - low) // count
        low += int(worker[2:]) % count * share
        top = low + share
    return low, top


def free_port() -> int:
    """A TCP port nobody listens on right now, and none handed out before in this
    process.

    Ports are picked below the kernel's ephemeral range: a port picked there (bind to
    port 0) is free when picked, but the tests' own client connections take local ports
    from that range, and one of them can hold it by the time a server binds it (a
    cluster's six nodes pick their ports before the first starts: one node once failed
    to start that way)."""
    low, top = _port_range()
    with _ports_lock:
        for _ in range(200):
            port = _pick.randrange(low, top) if top > low + 1000 else 0
            if port in _handed_out:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                port = int(s.getsockname()[1])
            _handed_out.add(port)
            return port
    raise RuntimeError("no free TCP port found on 127.0.0.1")


@dataclass(frozen=True)
class TlsFiles:
    """A throw-away CA, and a server and a client certificate it signed (for 127.0.0.1)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    @classmethod
    def make(cls, directory: Path) -> TlsFiles:
        """Generate them with ``openssl`` in ``directory`` (EC keys: fast)."""
        if shutil.which("openssl") is None:
            require("openssl", "not on PATH")
        d = directory
        key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

        def run(*args: str) -> None:
            subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

        run("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
            "-subj", "/CN=gateway-limiter test CA")  # fmt: skip
        (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        for name in ("server", "client"):
            run("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN=gateway-limiter test {name}")  # fmt: skip
            run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.crt", "-days", "2",
                "-extfile", "san.cnf")  # fmt: skip
        return cls(d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt",
                   d / "client.key")  # fmt: skip


@dataclass(frozen=True)
class AclUser:
    """A Redis ACL user the server is started with; the default user is then off."""

    name: str
    password: str
    #: ACL rules after the password, e.g. key patterns: ("~gwl:*", "+@all")
    rules: tuple[str, ...] = ("~*", "+@all")


#: The user a test's own client() logs in as on a server with an ACL user.
ADMIN = AclUser("test-admin", "test-admin-password", ("~*", "&*", "+@all"))


class RedisServer:
    """A private ``redis-server`` on a free port, which a test may kill, restart or pause.

    ``tls``: it speaks TLS only (``rediss://``), clients need not show a certificate
    unless ``client_certs``; ``user``: an ACL user, and the default user is off
    (``client()`` then logs in as ``ADMIN``, allowed everything).
    """

    def __init__(
        self,
        *extra: str,
        tls: TlsFiles | None = None,
        client_certs: bool = False,
        user: AclUser | None = None,
    ) -> None:
        self.port = free_port()
        self.extra = extra
        self.tls = tls
        self.client_certs = client_certs
        self.user = user
        self.dir = Path(tempfile.mkdtemp(prefix="gwl-redis-"))
        #: what the server printed (a failed start's error is raised with its end)
        self.log = self.dir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """redis:// (rediss:// with TLS) URL of this server, with the ACL user if any."""
        scheme = "rediss" if self.tls else "redis"
        auth = f"{self.user.name}:{quote(self.user.password, safe='')}@" if self.user else ""
        return f"{scheme}://{auth}127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        """A plain client (generous timeouts) for a test's own checks."""
        options: dict[str, Any] = {}
        if self.user:
            options |= {"username": ADMIN.name, "password": ADMIN.password}
        if self.tls:
            options |= {"ssl": True, "ssl_ca_certs": str(self.tls.ca)}
            if self.client_certs:
                options |= {
                    "ssl_certfile": str(self.tls.client_cert),
                    "ssl_keyfile": str(self.tls.client_key),
                }
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, **options)

    def _arguments(self) -> list[str]:
        port = ["--port", str(self.port)]
        if self.tls:
            port = ["--port", "0", "--tls-port", str(self.port)]
            port += ["--tls-cert-file", str(self.tls.server_cert)]
            port += ["--tls-key-file", str(self.tls.server_key)]
            port += ["--tls-ca-cert-file", str(self.tls.ca)]
            port += ["--tls-auth-clients", "yes" if self.client_certs else "no"]
        if self.user:
            u = self.user
            port += ["--user", u.name, "on", f">{u.password}", *u.rules, "--user", "default", "off"]
            port += ["--user", ADMIN.name, "on", f">{ADMIN.password}", *ADMIN.rules]
        return port

    def _spawn(self, binary: str, log: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                binary,
                *self._arguments(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
                *self.extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def start(self) -> RedisServer:
        """Start (or restart, on the same port) and wait until it answers PING."""
        binary = shutil.which("redis-server")
        if binary is None:
            require("redis-server", "not on PATH")
        with self.log.open("ab") as log:  # the server keeps its own copy of the file
            self.proc = self._spawn(str(binary), log)
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    if self.client().ping():
                        return self
                except redis.ConnectionError:
                    if self.proc.poll() is not None:
                        break  # it exited: its log says why
                    time.sleep(0.02)
            said = self.log.read_text(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"redis-server on port {self.port} did not start: {said}")
        except BaseException:
            self.kill()  # a server that does not answer as expected is no orphan
            raise

    def kill(self) -> None:
        """SIGKILL: the state is lost, connections drop, the port refuses."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            self.proc = None

    def stop(self) -> None:
        """Stop and remove its directory."""
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextmanager
def redis_server(*extra: str) -> Iterator[RedisServer]:
    """A private Redis for the duration of the block."""
    server = RedisServer(*extra).start()
    try:
        yield server
    finally:
        server.stop()


def mariadb_connection(
    database: str | None = None, *, multi_statements: bool = False
) -> pymysql.connections.Connection:
    """A raw connection to the test MariaDB (root, no password)."""
    return pymysql.connect(
        host=MARIADB_HOST,
        port=MARIADB_PORT,
        user=MARIADB_USER,
        password="",
        database=database,
        connect_timeout=3,
        autocommit=True,
        client_flag=pymysql.constants.CLIENT.MULTI_STATEMENTS if multi_statements else 0,
    )


#: The tables as plain MySQL DDL, for sites that create them by hand.
DDL_FILE = Path(__file__).resolve().parents[2] / "sql" / "t_ratelimite_conf.sql"


def run_ddl_file(database: str) -> None:
    """Run sql/t_ratelimite_conf.sql as is in ``database`` (a name or a SQLAlchemy URL),
    the way an operator would feed it to a client."""
    name = database.rsplit("/", 1)[-1].split("?", maxsplit=1)[0]
    conn = mariadb_connection(name, multi_statements=True)
    try:
        with conn.cursor() as cur:
            cur.execute(DDL_FILE.read_text(encoding="utf-8"))
            while cur.nextset():
                pass
    finally:
        conn.close()


def mariadb_url(database: str) -> str:
    """SQLAlchemy URL of ``database`` on the test MariaDB."""
    return f"mysql+pymysql://{MARIADB_USER}@{MARIADB_HOST}:{MARIADB_PORT}/{database}"


@contextmanager
def fresh_mariadb_database() -> Iterator[str]:
    """A new, empty database for one test; dropped afterwards. Yields its name."""
    try:
        conn = mariadb_connection()
    except pymysql.err.OperationalError as e:
        require("MariaDB", f"{MARIADB_HOST}:{MARIADB_PORT}: {e}")
        raise  # not reached: require() fails or skips
    name = f"gwl_t_{uuid.uuid4().hex[:12]}"
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{name}`")
    try:
        yield name
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        conn.close()


def copy_mariadb_database(source: str, target: str) -> None:
    """Every table of database ``source`` (definition and rows) into the empty database
    ``target``: a migrated database for one test in a tenth of the time of migrating
    it (the schema has no foreign keys, triggers or views for ``LIKE`` to leave out)."""
    conn = mariadb_connection()
    try:
        with conn.cursor() as cur:
            cur.execute(
                "select table_name from information_schema.tables where table_schema = %s",
                (source,),
            )
            tables = [row[0] for row in cur.fetchall()]
            for table in tables:
                cur.execute(f"CREATE TABLE `{target}`.`{table}` LIKE `{source}`.`{table}`")
                cur.execute(f"INSERT INTO `{target}`.`{table}` SELECT * FROM `{source}`.`{table}`")
        conn.commit()
    finally:
        conn.close()


class TcpProxy:
    """A TCP relay in front of a real server, which a test can cut or hang.

    ``cut()``: every connection closed and new ones refused (the server is down, or a
    network partition with resets); ``hang()``: connections accepted, nothing relayed
    either way (a server that stopped answering); ``restore()``: relaying again.
    """

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.port = free_port()
        self.mode = "relay"
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> TcpProxy:
        """Listen (again) on the same port."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        self.mode = "relay"
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by cut()
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        src.settimeout(0.05)
        while True:
            if self.mode == "hang":
                time.sleep(0.02)
                if src.fileno() < 0:
                    return
                continue
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                data = b""
            if not data:
                for s in (src, dst):
                    with suppress(OSError):
                        s.close()
                return
            try:
                dst.sendall(data)
            except OSError:
                return

    def hang(self) -> None:
        """Accept and hold every connection; relay nothing."""
        self.mode = "hang"

    def cut(self) -> None:
        """Close everything; connecting is refused until ``restore()``."""
        if self._listener is not None:
            # shutdown() wakes the thread blocked in accept(); close() alone would not,
            # and the kernel would go on accepting on the old socket.
            with suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            with suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with suppress(OSError):
                s.close()

    def restore(self) -> None:
        """Relay again (listening anew if cut)."""
        if self._listener is None:
            self.start()
        self.mode = "relay"
