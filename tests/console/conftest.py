"""A console served by a real uvicorn on loopback, over a fresh MariaDB database and the
session's private Redis."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from gateway_limiter.config.settings import Settings
from gateway_limiter.console.app import make_app
from gateway_limiter.console.serve import ConsoleServer, redis_sources
from tests.support.limiting import write_row
from tests.support.services import RedisServer

TOKEN = "console-token-for-tests-0123456789"


@dataclass
class Served:
    """A console being served, and where."""

    url: str
    engine: Engine
    settings: Settings

    def client(self, token: str | None = TOKEN) -> httpx.Client:
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=10)


def serve(
    db: str, engine: Engine, redis_url: str, prefix: str, token: str, **more: Any
) -> Iterator[Served]:
    settings = Settings(
        database_url=db, redis_url=redis_url, key_prefix=prefix, console_token=token, **more
    )
    sources, view = redis_sources(settings, "console-test")
    server = ConsoleServer(make_app(sources), "127.0.0.1", 0).start()
    try:
        yield Served(f"http://127.0.0.1:{server.port}", engine, settings)
    finally:
        server.stop()
        view.registry.close()
        view.backend.close()
        sources.engine.dispose()


@pytest.fixture
def console(
    migrated_db: tuple[str, Engine], redis_server: RedisServer, key_prefix: str
) -> Iterator[Served]:
    """A read-write console (console_token set)."""
    db, engine = migrated_db
    yield from serve(db, engine, redis_server.url, key_prefix, TOKEN)


@pytest.fixture
def read_only_console(
    migrated_db: tuple[str, Engine], redis_server: RedisServer, key_prefix: str
) -> Iterator[Served]:
    """A console without console_token."""
    db, engine = migrated_db
    yield from serve(db, engine, redis_server.url, key_prefix, "")


LIVE_URL = "/ibe/live"

#: A gateway process: asks for LIVE_URL as fast as it can for ``seconds``, beating every 0.2 s.
WORKER = f"""
import sys, time
from gateway_limiter import GatewayLimiter
db, redis_url, prefix, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
with GatewayLimiter(database_url=db, redis_url=redis_url, key_prefix=prefix,
                    fleet_heartbeat=0.2, metrics=False) as lim:
    print("ready", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        lim.try_acquire({LIVE_URL!r}, timeout=0)
        time.sleep(0.002)
"""


def wait_until(what: str, check: Callable[[], Any], seconds: float = 30.0) -> Any:
    """Poll ``check`` until it answers something true (that answer), or fail."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    pytest.fail(f"not within {seconds} s: {what}")


@pytest.fixture
def workers(console: Served) -> Iterator[list[subprocess.Popen[str]]]:
    """Two gateway processes sending traffic to LIVE_URL (20/s for the fleet, no waiting)."""
    write_row(console.engine, LIVE_URL, rateLimit=20, cache=0)
    s = console.settings
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, s.database_url, s.redis_url, s.key_prefix, "60"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready"
        yield procs
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
            if p.stdout is not None:
                p.stdout.close()
