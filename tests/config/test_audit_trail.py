"""Every change through the command line writes an audit row in the same transaction
(actor user@host or ``--actor``, source cli, the row before and after); a refused change
writes neither; changes made with plain SQL are recorded once as reloads find them,
however many processes reload at the same moment. MariaDB and SQLite."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import Engine, text

from gateway_limiter.config.audit import (
    audit_lock_name,
    local_actor,
    read_audit,
    record_sql_changes,
)
from gateway_limiter.config.reload import Registry
from gateway_limiter.config.settings import Settings
from gateway_limiter.config.table import make_engine
from tests.support.commandline import cli
from tests.support.limiting import write_row

pytestmark = pytest.mark.usefixtures("no_local_settings")

URL = "/ibe/audit"


def audit_rows(engine: Engine) -> list[dict[str, Any]]:
    """The audit oldest first."""
    return list(reversed(read_audit(engine, limit=1000)))


def test_each_cli_change_is_recorded_with_before_and_after(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_any_db
    steps = [
        ("conf", "set", URL, "--rate", "5"),
        ("conf", "set", URL, "--rate", "7", "--cache", "0.3"),
        ("conf", "enable", URL),
        ("conf", "disable", URL),
        ("switch", "off"),
        ("conf", "delete", URL),
    ]
    for argv in steps:
        ran = cli(capsys, "--database-url", db, *argv)
        assert ran.code == 0, ran.err
    got = audit_rows(engine)
    assert [(e["action"], e["source"], e["actor"]) for e in got] == [
        (action, "cli", local_actor())
        for action in ("insert", "update", "update", "update", "switch", "delete")
    ]
    insert, rate, enable, disable, switch, delete = got
    assert insert["beforeRow"] is None
    assert insert["afterRow"]["rateLimit"] == 5
    assert insert["afterRow"]["interfaceUrl"] == URL
    assert (rate["beforeRow"]["rateLimit"], rate["afterRow"]["rateLimit"]) == (5, 7)
    assert (rate["beforeRow"]["cache"], rate["afterRow"]["cache"]) == (None, 0.3)
    assert (enable["beforeRow"]["status"], enable["afterRow"]["status"]) == (0, 1)
    assert (disable["beforeRow"]["status"], disable["afterRow"]["status"]) == (1, 0)
    assert switch["configId"] is None
    assert (switch["beforeRow"], switch["afterRow"]) == ({"enabled": None}, {"enabled": False})
    assert delete["afterRow"] is None
    assert delete["beforeRow"]["configId"] == insert["configId"]


def test_actor_can_be_named_and_no_change_records_nothing(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_any_db
    assert (
        cli(
            capsys, "--database-url", db, "--actor", "ops-bot", "conf", "set", URL, "--rate", "5"
        ).code
        == 0
    )
    # The same value again and an enable of an enabled row are no change: no audit row.
    assert cli(capsys, "--database-url", db, "conf", "set", URL, "--rate", "5").code == 0
    assert cli(capsys, "--database-url", db, "switch", "default").code == 0
    got = audit_rows(engine)
    assert [(e["actor"], e["action"]) for e in got] == [("ops-bot", "insert")]


def test_a_refused_change_writes_neither_row_nor_audit(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_any_db
    ran = cli(capsys, "--database-url", db, "conf", "set", URL, "--rate", "5", "--warmup", "3")
    assert ran.code == 2
    assert audit_rows(engine) == []
    with engine.connect() as conn:
        assert conn.execute(text("select count(*) from t_ratelimite_conf")).scalar_one() == 0


def test_plain_sql_changes_are_recorded_by_the_reload(
    migrated_any_db: tuple[str, Engine],
) -> None:
    db, engine = migrated_any_db
    registry = Registry(Settings(database_url=db), engine=make_engine(db))
    try:
        config_id = write_row(engine, URL, rateLimit=10)
        for change in (
            lambda: None,
            lambda: write_row(engine, URL, rateLimit=20),
            lambda: None,  # nothing changed since: nothing recorded
            lambda: _delete_all(engine),
        ):
            change()
            assert registry.reload().ok
            assert registry.wait_for_audit()
    finally:
        registry.close()
    got = audit_rows(engine)
    assert [(e["action"], e["source"], e["configId"]) for e in got] == [
        ("insert", "sql", config_id),
        ("update", "sql", config_id),
        ("delete", "sql", config_id),
    ]
    assert (got[1]["beforeRow"]["rateLimit"], got[1]["afterRow"]["rateLimit"]) == (10, 20)


def _delete_all(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("delete from t_ratelimite_conf"))


def test_a_cli_change_is_not_recorded_again_by_the_reload(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_any_db
    assert cli(capsys, "--database-url", db, "conf", "set", URL, "--rate", "5").code == 0
    assert cli(capsys, "--database-url", db, "switch", "on").code == 0
    assert record_sql_changes(engine) == 0
    assert [e["source"] for e in audit_rows(engine)] == ["cli", "cli"]


def test_many_processes_reloading_at_once_record_each_sql_change_once(
    migrated_db: tuple[str, Engine],
) -> None:
    """40 engines (each its own MariaDB session, as 40 processes have) race to record the
    same two plain-SQL changes; the lock and the comparison leave one entry each."""
    db, engine = migrated_db
    write_row(engine, URL, rateLimit=10)
    write_row(engine, "/ibe/other", rateLimit=3)
    engines = [make_engine(db) for _ in range(40)]
    start = threading.Barrier(len(engines))
    written: list[int | None] = []
    errors: list[BaseException] = []

    def race(e: Engine) -> None:
        try:
            start.wait(timeout=30)
            written.append(record_sql_changes(e))
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=race, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for e in engines:
        e.dispose()
    assert not errors
    # One records both; the others find them recorded (0) or the lock taken (None:
    # they compare again at their next reload, and find them recorded then).
    assert sorted(w for w in written if w) == [2]
    assert record_sql_changes(engine) == 0
    got = audit_rows(engine)
    assert sorted(e["afterRow"]["interfaceUrl"] for e in got) == ["/ibe/audit", "/ibe/other"]


def test_the_audit_command_lists_the_changes(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, _ = migrated_any_db
    assert (
        cli(capsys, "--database-url", db, "--actor", "bob", "conf", "set", URL, "--rate", "5").code
        == 0
    )
    assert (
        cli(capsys, "--database-url", db, "--actor", "bob", "conf", "set", URL, "--rate", "9").code
        == 0
    )
    ran = cli(capsys, "--database-url", db, "audit", "--limit", "1")
    assert ran.code == 0, ran.err
    lines = ran.out.splitlines()
    assert len(lines) == 2  # the header and the newest change
    assert "bob" in lines[1]
    assert "rateLimit 5 -> 9" in lines[1]


def test_the_audit_command_names_a_channel_cap_and_a_named_caller(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, _ = migrated_any_db
    for argv in (
        ("*", "--rate", "30", "--channel", "IBE+"),
        (URL, "--rate", "50", "--per-caller", "--caller", "partner-a"),
    ):
        assert cli(capsys, "--database-url", db, "conf", "set", *argv).code == 0
    ran = cli(capsys, "--database-url", db, "audit")
    assert ran.code == 0, ran.err
    assert "* (channel IBE+) rateLimit 30" in ran.out
    assert f"{URL} (caller partner-a) rateLimit 50" in ran.out


def test_a_reload_that_finds_the_lock_taken_records_at_its_next_reload(
    migrated_db: tuple[str, Engine],
) -> None:
    db, engine = migrated_db
    registry = Registry(Settings(database_url=db), engine=make_engine(db))
    holder = engine.connect()
    lock = audit_lock_name(db.rsplit("/", 1)[1])
    try:
        got = holder.execute(text("SELECT GET_LOCK(:n, 0)"), {"n": lock}).scalar()
        assert got == 1
        write_row(engine, URL, rateLimit=10)
        assert registry.reload().ok
        assert registry.wait_for_audit()
        assert audit_rows(engine) == []  # another process (the holder) is at it
        holder.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": lock})
        assert registry.reload().ok  # the rows are as before: compared again all the same
        assert registry.wait_for_audit()
        assert [(e["action"], e["source"]) for e in audit_rows(engine)] == [("insert", "sql")]
    finally:
        holder.close()
        registry.close()


def test_a_reload_on_a_schema_before_the_audit_table_records_nothing_and_works(
    sqlite_db: str,
) -> None:
    """Code newer than the schema (deployed before ``db upgrade``): the reload reads its
    limits as ever, and leaves the audit to a database that has the table."""
    from gateway_limiter.config.migrate import upgrade

    engine = make_engine(sqlite_db)
    try:
        upgrade(engine, "0005")
        write_row(engine, URL, rateLimit=5)
        registry = Registry(Settings(database_url=sqlite_db), engine=make_engine(sqlite_db))
        try:
            summary = registry.reload()
            assert registry.wait_for_audit()
        finally:
            registry.close()
        assert summary.ok
        assert summary.rules == 1
        assert record_sql_changes(engine) == 0
    finally:
        engine.dispose()
