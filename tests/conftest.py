"""Fixtures on real services: MariaDB databases, SQLite files, private Redis servers."""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.config.migrate import upgrade
from gateway_limiter.config.table import make_engine
from tests.support.clusters import LocalCluster, LocalSentinel
from tests.support.limiting import limiter
from tests.support.services import (
    RedisServer,
    copy_mariadb_database,
    fresh_mariadb_database,
    mariadb_url,
)
from tests.support.switch_sources import Centre, private_centre

#: What a terminal's size is read from. Workers of a parallel run (pytest-xdist) start
#: with COLUMNS=80 and LINES=24 set; the command line's output follows COLUMNS, so each
#: worker gets the environment the run was started with instead.
TERMINAL_SIZE = ("COLUMNS", "LINES")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """(pytest-xdist, in the controller) Hand each worker the run's terminal size."""
    node.workerinput["gwl_terminal_size"] = {k: os.environ.get(k) for k in TERMINAL_SIZE}


def pytest_configure(config: pytest.Config) -> None:
    """In a worker of a parallel run: the run's COLUMNS and LINES, set or not."""
    workerinput: dict[str, Any] = getattr(config, "workerinput", {})
    for key, value in workerinput.get("gwl_terminal_size", {}).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


#: Test files that take longest, longest first (each file's summed ``--durations`` in a
#: CI run). A parallel run (``-n 2 --dist loadfile``, with ``--no-loadscope-reorder`` in
#: pyproject.toml) hands files out in collection order, so these start first and the
#: many short files fill in behind them: no worker is left with a minute-long file
#: when the other has finished.
LONGEST_FIRST = (
    "tests/bench/test_benchmarks_still_run.py",
    "tests/sim/test_simulated_fleet.py",
    "tests/deploy/test_pre_forked_workers_follow_the_table.py",
    "tests/faults/test_fault_fleet_rides_redis_faults.py",
    "tests/faults/test_fault_database.py",
    "tests/cli/test_cli_algorithms.py",
    "tests/packaging/test_wheel_install.py",
    "tests/integrations/test_a_fleet_of_gateways_obeys_its_supplier.py",
    "tests/faults/test_fault_fleet_shares_the_rule.py",
    "tests/faults/test_fault_failover_loses_little.py",
    "tests/security/test_hostile_rows.py",
    "tests/priority/test_bookings_first_across_processes.py",
    "tests/deploy/test_worker_pools_follow_the_table.py",
    "tests/rls/test_envoy_egress.py",
    "tests/faults/test_fault_slow_host_is_not_an_outage.py",
    "tests/console/test_console_in_a_browser.py",
    "tests/deploy/test_a_started_limiter_survives_a_fork.py",
    "tests/slots/test_fleet_targets.py",
    "tests/shares/test_shares_hold_across_processes.py",
    "tests/faults/test_fault_soak.py",
    "tests/priority/test_leases_keep_the_class_order.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first (``LONGEST_FIRST``), every other file in its usual order
    behind them; the tests of a file keep their order."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


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


@pytest.fixture(scope="session")
def migrated_mariadb_template() -> Iterator[str]:
    """A MariaDB database migrated to the newest revision once per test process: each
    migrated database of a test is a copy of it (``copy_mariadb_database``), which
    takes a tenth of the time of running every revision again. The tests of the
    migrations themselves (tests/table, tests/config) run ``upgrade`` on their own."""
    with fresh_mariadb_database() as name:
        engine = make_engine(mariadb_url(name))
        upgrade(engine)
        engine.dispose()
        yield name


@pytest.fixture(scope="session")
def migrated_sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file at the newest revision, made once per test process, to copy."""
    path = tmp_path_factory.mktemp("migrated") / "limits.db"
    engine = make_engine(f"sqlite:///{path}")
    upgrade(engine)
    engine.dispose()
    return path


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
def migrated_db(migrated_mariadb_template: str) -> Iterator[tuple[str, Engine]]:
    """A new MariaDB database at the newest revision, with an engine on it."""
    with fresh_mariadb_database() as name:
        copy_mariadb_database(migrated_mariadb_template, name)
        url = mariadb_url(name)
        engine = make_engine(url)
        yield url, engine
        engine.dispose()


@pytest.fixture(params=["mariadb", "sqlite"])
def migrated_any_db(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    migrated_mariadb_template: str,
    migrated_sqlite_template: Path,
) -> Iterator[tuple[str, Engine]]:
    """Each config store at the newest revision, with an engine on it: a new MariaDB
    database, then a new SQLite file."""
    if request.param == "sqlite":
        path = tmp_path / "limits.db"
        shutil.copyfile(migrated_sqlite_template, path)
        url = f"sqlite:///{path}"
        engine = make_engine(url)
        yield url, engine
        engine.dispose()
    else:
        with fresh_mariadb_database() as name:
            copy_mariadb_database(migrated_mariadb_template, name)
            url = mariadb_url(name)
            engine = make_engine(url)
            yield url, engine
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


# The limiter under test. ``lim`` (threaded) and ``alim`` (asyncio) are built from three
# fixtures a test module overrides, or a test parametrises by name, to change one thing:
#
#   limiter_db          the config store, (url, engine): a module writes its rows here
#   limiter_redis_url   where buckets live: the session's Redis, a private one, memory://
#   limiter_settings    any other setting, e.g. {"reload_interval": 3600}
#
# e.g. in a module:
#
#   @pytest.fixture
#   def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
#       write_row(limiter_db[1], "/x", rateLimit=5, cache=0.0)
#       return limiter_db


@pytest.fixture
def limiter_db(migrated_db: tuple[str, Engine]) -> tuple[str, Engine]:
    """The config store ``lim`` and ``alim`` read: this test's migrated MariaDB database.

    A module overrides it to write its rows before the limiter starts (asking for
    ``limiter_db`` itself), or to read another store (``migrated_any_db``)."""
    return migrated_db


@pytest.fixture
def limiter_redis_url(redis_server: RedisServer) -> str:
    """Where ``lim`` and ``alim`` keep their buckets: the session's Redis (a module
    overrides it for a private server, a cluster or ``memory://``)."""
    return redis_server.url


@pytest.fixture
def limiter_settings() -> dict[str, Any]:
    """Settings of ``lim`` and ``alim`` beyond database, Redis and key prefix: none (a
    module overrides it, e.g. ``{"reload_interval": 3600}``)."""
    return {}


@pytest.fixture
def lim(
    limiter_db: tuple[str, Engine],
    limiter_redis_url: str,
    limiter_settings: dict[str, Any],
    key_prefix: str,
) -> Iterator[GatewayLimiter]:
    """A started ``GatewayLimiter`` on ``limiter_db`` and ``limiter_redis_url``, under this
    test's key prefix, with ``limiter_settings``; closed afterwards."""
    started = limiter(limiter_db[0], limiter_redis_url, key_prefix, **limiter_settings)
    yield started
    started.close()


@pytest.fixture
async def alim(
    limiter_db: tuple[str, Engine],
    limiter_redis_url: str,
    limiter_settings: dict[str, Any],
    key_prefix: str,
) -> AsyncIterator[AsyncGatewayLimiter]:
    """The asyncio twin of ``lim``: a started ``AsyncGatewayLimiter`` built alike."""
    async with AsyncGatewayLimiter(
        database_url=limiter_db[0],
        redis_url=limiter_redis_url,
        key_prefix=key_prefix,
        **limiter_settings,
    ) as started:
        yield started


@pytest.fixture(params=["etcd", "apollo"])
def centre(request: pytest.FixtureRequest) -> Iterator[Centre]:
    """Where the switch is kept besides the table: a private etcd, then a loopback Apollo
    (tests/support/switch_sources.py), each the test's own (it may stop it)."""
    with private_centre(request.param) as found:
        yield found
