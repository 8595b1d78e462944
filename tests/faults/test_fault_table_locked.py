"""A table the reload cannot read (locked past the read timeout, permission denied, its
connection killed mid-read) keeps the last good snapshot, rows and switch together; only
a missing table means the setting. One error per outage, the scheduler's own included.
Against MariaDB.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator

import pymysql
import pytest
from sqlalchemy import Engine

from gateway_limiter.config.reload import Registry, ReloadSummary
from gateway_limiter.config.settings import Settings
from gateway_limiter.config.table import make_engine, write_switch
from tests.support.limiting import write_row
from tests.support.services import mariadb_connection

#: The registry's read timeout here (whole seconds: pymysql's unit).
READ_TIMEOUT_S = 1


@pytest.fixture
def locker(migrated_db: tuple[str, Engine]) -> Iterator[pymysql.connections.Connection]:
    """Another session on the test's database, which takes table locks."""
    name = migrated_db[0].rsplit("/", 1)[-1]
    conn = mariadb_connection(name)
    yield conn
    with conn.cursor() as cur:
        cur.execute("UNLOCK TABLES")
    conn.close()


def registry(url: str, **settings: object) -> Registry:
    chosen = Settings(database_url=url, audit_sql_changes=False, **settings)  # type: ignore[arg-type]
    return Registry(chosen, make_engine(url, timeout=READ_TIMEOUT_S))


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_locked_switch_table_keeps_the_switch_and_the_rows_of_the_last_good_reload(
    migrated_db: tuple[str, Engine],
    locker: pymysql.connections.Connection,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url, engine = migrated_db
    write_row(engine, "/x", rateLimit=5, cache=0.0)
    write_switch(engine, True)
    reg = registry(url, switch=False)  # the row says on, the setting off
    try:
        assert reg.reload().ok
        assert (reg.snapshot.switch, reg.snapshot.switch_source) == (True, "database")
        write_row(engine, "/x", rateLimit=7)  # read by the next reload, with the switch
        with locker.cursor() as cur:
            cur.execute("LOCK TABLES t_ratelimite_switch WRITE")
        with caplog.at_level(logging.DEBUG, logger="gateway_limiter"):
            for _ in range(2):
                summary = reg.reload()
                assert not summary.ok
                assert (reg.snapshot.switch, reg.snapshot.switch_source) == (True, "database")
                assert reg.snapshot.rules["/x"].rate == 5  # not half a reload
        assert len(errors(caplog)) == 1, errors(caplog)
        assert "keeping the last good limits" in errors(caplog)[0]
        assert not any("switch setting" in r.getMessage() for r in caplog.records)
        with locker.cursor() as cur:
            cur.execute("UNLOCK TABLES")
        assert reg.reload().ok
        assert reg.snapshot.rules["/x"].rate == 7
        assert reg.snapshot.switch is True
    finally:
        reg.close()


def test_a_switch_table_it_may_no_longer_read_keeps_the_last_good_switch(
    migrated_db: tuple[str, Engine], locker: pymysql.connections.Connection
) -> None:
    url, engine = migrated_db
    name = url.rsplit("/", 1)[-1]
    user = f"gwl_{uuid.uuid4().hex[:8]}"
    with locker.cursor() as cur:
        cur.execute(f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw-{user}'")
        # Table privileges: a REVOKE of one applies to the next statement of a session
        # already open (a database privilege would wait for its next USE).
        for table in ("t_ratelimite_conf", "t_ratelimite_switch"):
            cur.execute(f"GRANT SELECT ON `{name}`.{table} TO '{user}'@'%'")
    try:
        write_switch(engine, True)
        limited = url.replace("root@", f"{user}:pw-{user}@")
        reg = registry(limited, switch=False)
        try:
            assert reg.reload().ok and reg.snapshot.switch is True
            with locker.cursor() as cur:
                cur.execute(f"REVOKE SELECT ON `{name}`.t_ratelimite_switch FROM '{user}'@'%'")
            summary = reg.reload()
            assert not summary.ok and "denied" in (summary.error or "")
            assert (reg.snapshot.switch, reg.snapshot.switch_source) == (True, "database")
        finally:
            reg.close()
    finally:
        with locker.cursor() as cur:
            cur.execute(f"DROP USER '{user}'@'%'")


def test_only_a_missing_switch_table_means_the_switch_setting(
    migrated_db: tuple[str, Engine], locker: pymysql.connections.Connection
) -> None:
    url, engine = migrated_db
    write_switch(engine, True)
    reg = registry(url, switch=False)
    try:
        assert reg.reload().ok and reg.snapshot.switch is True
        with locker.cursor() as cur:
            cur.execute("DROP TABLE t_ratelimite_switch")
        assert reg.reload().ok
        assert (reg.snapshot.switch, reg.snapshot.switch_source) == (False, "settings")
    finally:
        reg.close()


def test_a_reload_stuck_on_the_database_is_one_error_not_a_warning_each_tick(
    migrated_db: tuple[str, Engine],
    locker: pymysql.connections.Connection,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url, engine = migrated_db
    write_row(engine, "/x", rateLimit=5, cache=0.0)
    reg = registry(url, reload_interval=0.1)
    # (The conftest has APScheduler's own logger at WARNING, where "skipped" shows.)
    caplog.set_level(logging.DEBUG, logger="gateway_limiter")
    try:
        assert reg.start().ok
        with locker.cursor() as cur:
            cur.execute("LOCK TABLES t_ratelimite_conf WRITE")
        # Each reload waits out the read timeout while the scheduler ticks 10 times a
        # second: about 25 ticks find a reload running within these 2.5 s.
        # real time: the driver's read timeout, waited out 2.5 times
        time.sleep(2.5 * READ_TIMEOUT_S)
        skipped = [r for r in caplog.records if "maximum number" in r.getMessage()]
        stuck = [r for r in caplog.records if "reload still running" in r.getMessage()]
        assert not skipped, skipped[0].getMessage()
        assert stuck, "the scheduler never found a reload running: the test proves nothing"
        assert len(errors(caplog)) == 1, errors(caplog)
        assert reg.snapshot.rules["/x"].rate == 5
        with locker.cursor() as cur:
            cur.execute("UNLOCK TABLES")
        deadline = time.monotonic() + 10
        while "database reachable again" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "database reachable again" in caplog.text
        assert len(errors(caplog)) == 1
    finally:
        reg.close()


def test_a_reload_whose_connection_is_killed_mid_read_keeps_the_last_good_snapshot(
    migrated_db: tuple[str, Engine],
    locker: pymysql.connections.Connection,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The server ends the reload's session (``KILL``: an operator, a failover, a proxy)
    while it reads: the reload fails as a whole, and the next one recovers."""
    url, engine = migrated_db
    write_row(engine, "/x", rateLimit=5, cache=0.0)
    write_switch(engine, True)
    reg = Registry(  # a read timeout far longer than the test: only the KILL ends the read
        Settings(database_url=url, audit_sql_changes=False, switch=False),
        make_engine(url, timeout=60),
    )
    try:
        assert reg.reload().ok
        write_row(engine, "/x", rateLimit=7)  # what the killed reload was about to read
        with locker.cursor() as cur:
            cur.execute("LOCK TABLES t_ratelimite_conf WRITE")  # the reload's read waits
        summaries: list[ReloadSummary] = []
        with caplog.at_level(logging.DEBUG, logger="gateway_limiter"):
            reloading = threading.Thread(target=lambda: summaries.append(reg.reload()))
            reloading.start()
            blocked = (
                "select id from information_schema.processlist where db = database()"
                " and id <> connection_id() and state like '%lock%'"
            )
            victim = None
            for _ in range(1000):  # the reload's session, waiting for the table
                with locker.cursor() as cur:
                    cur.execute(blocked)
                    row = cur.fetchone()
                if row is not None:
                    victim = int(row[0])
                    break
                reloading.join(0.01)
            assert victim is not None, "the reload never waited for the table"
            with locker.cursor() as cur:
                cur.execute(f"KILL {victim}")
            reloading.join(30)
            assert not reloading.is_alive()
        [summary] = summaries
        assert not summary.ok
        assert reg.snapshot.rules["/x"].rate == 5  # the last good rows
        assert (reg.snapshot.switch, reg.snapshot.switch_source) == (True, "database")
        assert len(errors(caplog)) == 1, errors(caplog)
        assert "keeping the last good limits" in errors(caplog)[0]
        with locker.cursor() as cur:
            cur.execute("UNLOCK TABLES")
        assert reg.reload().ok  # on a new connection: the pool let the killed one go
        assert reg.snapshot.rules["/x"].rate == 7
        assert reg.snapshot.switch is True
    finally:
        reg.close()
