"""Fixtures on real services: MariaDB databases, SQLite files, private Redis servers."""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import Engine

from gateway_limiter.config.migrate import upgrade
from gateway_limiter.config.table import make_engine
from tests.support.clusters import LocalCluster, LocalSentinel
from tests.support.services import RedisServer, fresh_mariadb_database, mariadb_url


@pytest.fixture(autouse=True)
def _quiet_scheduler_logs() -> None:
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One private redis-server for the whole session (tests isolate by key prefix)."""
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[LocalCluster]:
    """A Redis Cluster of 3 masters with a replica each, for one test module (which may
    fail masters over or move slots: each module gets a fresh one)."""
    cluster = LocalCluster(masters=3, replicas=1).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def redis_sentinel() -> Iterator[LocalSentinel]:
    """A master, a replica and a sentinel watching them, for one test module."""
    group = LocalSentinel().start()
    yield group
    group.stop()


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own, which it may kill and restart."""
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A plain client on the session's Redis."""
    client = redis_server.client()
    yield client
    client.close()


@pytest.fixture
def key_prefix() -> str:
    """A key prefix no other test uses."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def mariadb_db() -> Iterator[str]:
    """URL of a new, empty MariaDB database (dropped afterwards)."""
    with fresh_mariadb_database() as name:
        yield mariadb_url(name)


@pytest.fixture
def sqlite_db(tmp_path: Path) -> str:
    """URL of a new SQLite file."""
    return f"sqlite:///{tmp_path / 'limits.db'}"


@pytest.fixture(params=["mariadb", "sqlite"])
def any_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Each supported config store in turn: a new MariaDB database, then a SQLite file."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'limits.db'}"
    else:
        with fresh_mariadb_database() as name:
            yield mariadb_url(name)


@pytest.fixture
def migrated_db(mariadb_db: str) -> Iterator[tuple[str, Engine]]:
    """A MariaDB database at the newest revision, with an engine on it."""
    engine = make_engine(mariadb_db)
    upgrade(engine)
    yield mariadb_db, engine
    engine.dispose()


@pytest.fixture
def migrated_any_db(any_db: str) -> Iterator[tuple[str, Engine]]:
    """Each config store at the newest revision, with an engine on it."""
    engine = make_engine(any_db)
    upgrade(engine)
    yield any_db, engine
    engine.dispose()


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Callable[..., None]:
    """Report what a test measured: printed (see it with -s or -rP), and appended as a
    JSON line to $GWL_FIGURES when set (docs/reliability.md quotes them)."""

    def report(title: str, **values: object) -> None:
        line = json.dumps({"test": request.node.nodeid, "title": title, **values})
        print(f"FIGURES {line}")
        path = os.environ.get("GWL_FIGURES")
        if path:
            with open(path, "a", encoding="utf-8") as f:
                f.write(line + "\n")

    return report


@pytest.fixture
def no_local_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No settings.toml or GATEWAY_LIMITER_* from the developer's machine leak in (the
    command line tests: ``pytestmark = pytest.mark.usefixtures("no_local_settings")``)."""
    monkeypatch.chdir(tmp_path)
    for key in list(os.environ):
        if key.startswith("GATEWAY_LIMITER_"):
            monkeypatch.delenv(key)
