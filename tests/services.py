"""Real services for the tests: a private redis-server per use, a fresh MariaDB database.

Nothing here fakes a server. Under CI=true a service that cannot be reached fails the
test run (``require``); on a developer's machine it skips with the reason.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A private ``redis-server`` on a free port, which a test may kill, restart or pause."""

    def __init__(self, *extra: str) -> None:
        self.port = free_port()
        self.extra = extra
        self.dir = Path(tempfile.mkdtemp(prefix="gwl-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """redis:// URL of this server."""
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        """A plain client (generous timeouts) for a test's own checks."""
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def start(self) -> RedisServer:
        """Start (or restart, on the same port) and wait until it answers PING."""
        binary = shutil.which("redis-server")
        if binary is None:
            require("redis-server", "not on PATH")
        self.proc = subprocess.Popen(
            [
                str(binary),
                "--port",
                str(self.port),
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
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if self.client().ping():
                    return self
            except redis.ConnectionError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

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


def mariadb_connection(database: str | None = None) -> pymysql.connections.Connection:
    """A raw connection to the test MariaDB (root, no password)."""
    return pymysql.connect(
        host=MARIADB_HOST,
        port=MARIADB_PORT,
        user=MARIADB_USER,
        password="",
        database=database,
        connect_timeout=3,
        autocommit=True,
    )


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
