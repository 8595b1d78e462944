"""Revision 0008 gives the text that identifies a row a binary collation, and refuses,
changing nothing, while rows would still collide under the collation it picks, listing
them; ``db stamp`` never records a revision over a database without the tables. MariaDB."""

from __future__ import annotations

import re

import pytest
from alembic import command
from sqlalchemy import Connection, Engine, text

from gateway_limiter.config import table
from gateway_limiter.config.migrate import alembic_config, current_revision, upgrade
from gateway_limiter.config.table import make_engine
from tests.support.commandline import cli
from tests.support.limiting import write_row

pytestmark = pytest.mark.usefixtures("no_local_settings")


def _collation(engine: Engine, column: str) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(
                text(
                    "select COLLATION_NAME from information_schema.COLUMNS where TABLE_SCHEMA = "
                    "database() and TABLE_NAME = 't_ratelimite_conf' and COLUMN_NAME = :c"
                ),
                {"c": column},
            ).scalar_one()
        )


def test_upgrade_keeps_twins_apart_and_rows_as_they_were(mariadb_db: str) -> None:
    engine = make_engine(mariadb_db)
    try:
        upgrade(engine, "0007")
        write_row(engine, "/api/x", rateLimit=100, callerKey=None)
        write_row(engine, "/API/x", add=True, rateLimit=7, channelType="IBE+")
        upgrade(engine, "0008")
        assert current_revision(engine) == "0008"
        for column in ("interfaceUrl", "channelType", "callerKey"):
            assert _collation(engine, column) == "utf8mb4_nopad_bin"
        with engine.connect() as conn:
            found = conn.execute(
                text("select configId from t_ratelimite_conf where interfaceUrl = '/api/x'")
            ).all()
        assert len(found) == 1  # the database now tells them apart as the limiter does
        command.downgrade(alembic_config(engine), "0007")  # and back
        assert _collation(engine, "interfaceUrl").endswith("_ci")
    finally:
        engine.dispose()


def test_upgrade_refuses_rows_a_padding_collation_would_still_collide(
    mariadb_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A server whose only binary collation pads spaces (MySQL 5.7's utf8mb4_bin)
    def padding(conn: Connection, charset: str) -> str:
        return f"{charset}_bin"

    monkeypatch.setattr(table, "binary_collation", padding)
    engine = make_engine(mariadb_db)
    try:
        upgrade(engine, "0007")
        plain = write_row(engine, "/pay", rateLimit=5)
        padded = write_row(engine, "/pay ", add=True, rateLimit=9)
        with pytest.raises(RuntimeError) as refused:
            upgrade(engine, "0008")
        message = str(refused.value)
        assert f"configId {plain} '/pay' and configId {padded} '/pay '" in message
        assert current_revision(engine) == "0007"
        assert _collation(engine, "interfaceUrl").endswith("_ci")  # nothing changed
        with engine.begin() as conn:
            conn.execute(text("delete from t_ratelimite_conf where configId = :i"), {"i": padded})
        upgrade(engine, "0008")
        assert current_revision(engine) == "0008"
        assert _collation(engine, "interfaceUrl") == "utf8mb4_bin"
    finally:
        engine.dispose()


def test_db_stamp_over_no_tables_is_refused(
    capsys: pytest.CaptureFixture[str], mariadb_db: str
) -> None:
    ran = cli(capsys, "--database-url", mariadb_db, "db", "stamp", "head")
    assert ran.code == 1
    assert "has no t_ratelimite_conf" in ran.err and "db upgrade" in ran.err
    engine = make_engine(mariadb_db)
    try:
        assert current_revision(engine) is None
    finally:
        engine.dispose()
    # so 'db upgrade' still creates them
    ran = cli(capsys, "--database-url", mariadb_db, "db", "upgrade")
    assert ran.code == 0, ran.err
    assert re.search(r"to revision \d{4} \(head\)", ran.out), ran.out
