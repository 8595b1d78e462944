"""A console served by a real uvicorn on loopback, over a fresh MariaDB database and the
session's private Redis."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from sqlalchemy import Engine

from gateway_limiter.config.settings import Settings
from gateway_limiter.console.app import make_app
from gateway_limiter.console.serve import ConsoleServer, redis_sources
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


def serve(db: str, engine: Engine, redis_url: str, prefix: str, token: str) -> Iterator[Served]:
    settings = Settings(
        database_url=db, redis_url=redis_url, key_prefix=prefix, console_token=token
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
