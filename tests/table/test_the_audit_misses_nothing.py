"""The audit misses no change: a change of any column made with plain SQL (interfaceNo
too) is recorded by the reload; one followed by a command's change before the next
reload is recorded before it; a recording that fails is made at the next reload; and
the recording of SQL changes, racing a command's change, records neither stale nor
twice. MariaDB (and SQLite for what does not race)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import Engine, text

from gateway_limiter.config.audit import read_audit, record_sql_changes
from gateway_limiter.config.reload import Registry
from gateway_limiter.config.settings import Settings
from gateway_limiter.config.table import make_engine
from tests.support.commandline import cli
from tests.support.limiting import write_row
from tests.table.conftest import wait_for_lock_wait

pytestmark = pytest.mark.usefixtures("no_local_settings")

URL = "/ibe/audit"


def history(engine: Engine) -> list[tuple[Any, ...]]:
    """(action, source, before rateLimit/interfaceNo, after) oldest first."""

    def shown(row: dict[str, Any] | None) -> Any:
        return None if row is None else (row["rateLimit"], row["interfaceNo"])

    return [
        (e["action"], e["source"], shown(e["beforeRow"]), shown(e["afterRow"]))
        for e in reversed(read_audit(engine, limit=1000))
    ]


def _reload(registry: Registry) -> None:
    assert registry.reload().ok
    assert registry.wait_for_audit()


def test_a_change_of_interface_no_alone_is_recorded(
    migrated_any_db: tuple[str, Engine],
) -> None:
    db, engine = migrated_any_db
    registry = Registry(Settings(database_url=db), engine=make_engine(db))
    try:
        write_row(engine, URL, rateLimit=10, interfaceNo="1001")
        _reload(registry)
        write_row(engine, URL, interfaceNo="1002")
        _reload(registry)
    finally:
        registry.close()
    assert history(engine) == [
        ("insert", "sql", None, (10, "1001")),
        ("update", "sql", (10, "1001"), (10, "1002")),
    ]


def test_an_sql_change_is_recorded_before_the_command_change_that_follows_it(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_any_db
    assert cli(capsys, "--database-url", db, "conf", "set", URL, "--rate", "10").code == 0
    write_row(engine, URL, rateLimit=15)  # plain SQL, no reload since
    assert cli(capsys, "--database-url", db, "conf", "set", URL, "--rate", "20").code == 0
    assert history(engine) == [
        ("insert", "cli", None, (10, None)),
        ("update", "sql", (10, None), (15, None)),
        ("update", "cli", (15, None), (20, None)),
    ]
    # and the console's: the same rule (plain SQL, then a delete through the console
    # path, which the command line shares)
    write_row(engine, URL, rateLimit=25)
    assert cli(capsys, "--database-url", db, "conf", "delete", URL).code == 0
    assert history(engine)[-2:] == [
        ("update", "sql", (20, None), (25, None)),
        ("delete", "cli", (25, None), None),
    ]


def test_a_failed_recording_is_made_at_the_next_reload(migrated_db: tuple[str, Engine]) -> None:
    db, engine = migrated_db
    registry = Registry(Settings(database_url=db), engine=make_engine(db))

    def audit_table(column: str, to: str) -> None:
        with engine.begin() as conn:
            conn.execute(text(f"alter table t_ratelimite_audit change {column} {to} TEXT NULL"))

    try:
        write_row(engine, URL, rateLimit=10)
        audit_table("afterRow", "afterRowGone")  # every recording fails
        try:
            _reload(registry)
        finally:
            audit_table("afterRowGone", "afterRow")
        assert history(engine) == []
        _reload(registry)  # the rows are as the failed recording saw them
    finally:
        registry.close()
    assert history(engine) == [("insert", "sql", None, (10, None))]


def test_recording_sql_changes_waits_for_a_command_writing_and_records_nothing_stale(
    migrated_db: tuple[str, Engine],
) -> None:
    db, engine = migrated_db
    config_id = write_row(engine, URL, rateLimit=10)
    assert record_sql_changes(engine) == 1  # the insert
    write_row(engine, URL, rateLimit=15)  # plain SQL, not yet recorded
    done = threading.Event()
    recorded: list[int | None] = []

    def record() -> None:
        try:
            recorded.append(record_sql_changes(engine))
        finally:
            done.set()

    rows = {rate: _full_row(engine, config_id, rate) for rate in (10, 15, 20)}
    with engine.connect() as command:
        # A command's change, as the command line and the console make it: the table
        # locked, the SQL change found first, then its own change and entry.
        command.execute(text("select configId from t_ratelimite_conf for update")).all()
        command.execute(
            text("update t_ratelimite_conf set rateLimit = 20 where configId = :i"),
            {"i": config_id},
        )
        for source, was, now in (("sql", 10, 15), ("cli", 15, 20)):
            command.execute(
                text(
                    "insert into t_ratelimite_audit (actor, source, configId, action, "
                    "beforeRow, afterRow) values ('t', :s, :i, 'update', :b, :a)"
                ),
                {
                    "s": source,
                    "i": config_id,
                    "b": rows[was],
                    "a": rows[now],
                },
            )
        recorder = threading.Thread(target=record)
        recorder.start()
        wait_for_lock_wait(engine, db.rsplit("/", 1)[1], done)
        command.commit()
    recorder.join(30)
    assert recorded == [0]  # found the command's entries: nothing to add
    assert record_sql_changes(engine) == 0
    assert [(a, s, b[0] if b else None, n[0]) for a, s, b, n in history(engine)] == [
        ("insert", "sql", None, 10),
        ("update", "sql", 10, 15),
        ("update", "cli", 15, 20),
    ]


def _full_row(engine: Engine, config_id: int, rate: int) -> str:
    """The afterRow the audit records for the row with ``rate``."""
    import json

    from gateway_limiter.config.audit import row_record
    from gateway_limiter.config.table import read_rows

    (row,) = [r for r in read_rows(engine) if r.config_id == config_id]
    record = row_record(row) | {"rateLimit": rate}
    return json.dumps(record, sort_keys=True, default=str)


def test_an_sql_change_of_the_switch_is_recorded_before_the_command_that_follows_it(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_any_db
    assert cli(capsys, "--database-url", db, "switch", "off").code == 0
    with engine.begin() as conn:
        conn.execute(text("update t_ratelimite_switch set enabled = 1"))
    assert cli(capsys, "--database-url", db, "switch", "default").code == 0
    entries = [
        (e["source"], e["beforeRow"], e["afterRow"]) for e in reversed(read_audit(engine, limit=10))
    ]
    assert entries == [
        ("cli", {"enabled": None}, {"enabled": False}),
        ("sql", {"enabled": False}, {"enabled": True}),
        ("cli", {"enabled": True}, {"enabled": None}),
    ]
