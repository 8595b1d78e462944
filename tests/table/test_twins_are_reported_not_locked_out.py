"""Rows told apart only by case, accents or trailing spaces ("twins") are reported by the
reload's warning and by ``db check``, each naming both configIds; no command is locked
out by them; a row whose interfaceUrl has surrounding spaces is skipped by the reload
with a warning naming it, as the command line and the console refuse to write one. On
MariaDB (the collation that folds them), before and after revision 0008."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import Engine, text

from gateway_limiter.config.reload import Registry
from gateway_limiter.config.settings import Settings
from gateway_limiter.config.table import make_engine
from tests.support.commandline import cli
from tests.support.limiting import write_row

pytestmark = pytest.mark.usefixtures("no_local_settings")


def test_the_reload_skips_a_url_with_trailing_spaces_and_names_the_twins(
    collated_db: tuple[str, Engine], caplog: pytest.LogCaptureFixture
) -> None:
    db, engine = collated_db
    padded = write_row(engine, "/pay ", rateLimit=5)
    plain = write_row(engine, "/pay", add=True, rateLimit=9)
    lower = write_row(engine, "/api/x", rateLimit=100)
    upper = write_row(engine, "/API/x", add=True, rateLimit=7)
    registry = Registry(Settings(database_url=db, audit_sql_changes=False), make_engine(db))
    try:
        with caplog.at_level(logging.WARNING, logger="gateway_limiter"):
            summary = registry.reload()
        assert summary.ok
        snapshot = registry.snapshot
    finally:
        registry.close()
    assert [s.config_id for s in snapshot.skipped] == [padded]
    assert "whitespace" in snapshot.skipped[0].reason
    assert set(snapshot.rules) == {"/pay", "/api/x", "/API/x"}
    twins = [w for w in snapshot.warnings if "differ only in case" in w]
    assert len(twins) == 2, snapshot.warnings
    assert f"configId {padded}" in twins[0] and f"configId {plain}" in twins[0]
    assert f"configId {lower}" in twins[1] and f"configId {upper}" in twins[1]
    logged = caplog.text
    assert f"configId {lower}" in logged and f"configId {upper}" in logged


def test_db_check_lists_each_pair_of_twins(
    capsys: pytest.CaptureFixture[str], collated_db: tuple[str, Engine]
) -> None:
    db, engine = collated_db
    ran = cli(capsys, "--database-url", db, "db", "check")
    assert ran.code == 0, ran.err
    assert "no rows told apart" in ran.out
    cap = write_row(engine, "*", rateLimit=100, channelType="IBE+")
    other = write_row(engine, "*", add=True, rateLimit=500, channelType="ibe+")
    partner = write_row(engine, "/fare", perCaller=1, callerKey="Partner", rateLimit=1)
    accented = write_row(engine, "/fare", add=True, perCaller=1, callerKey="pärtner", rateLimit=2)
    ran = cli(capsys, "--database-url", db, "db", "check")
    assert ran.code == 1
    lines = [line for line in ran.out.splitlines() if line.startswith("twins: ")]
    assert len(lines) == 2, ran.out
    assert f"configId {cap}" in lines[0] and f"configId {other}" in lines[0]
    assert "channelType" in lines[0]
    assert f"configId {partner}" in lines[1] and f"configId {accented}" in lines[1]
    assert "callerKey" in lines[1]
    # the channel twins are each their own row to every command
    ran = cli(capsys, "--database-url", db, "conf", "set", "*", "--channel", "ibe+", "--rate", "7")
    assert ran.code == 0, ran.err
    assert f"updated configId {other}" in ran.out
    folding = "compare text ignoring case" in cli(capsys, "--database-url", db, "db", "check").out
    with engine.connect() as conn:
        collation = conn.execute(
            text(
                "select COLLATION_NAME from information_schema.COLUMNS where "
                "TABLE_SCHEMA = database() and TABLE_NAME = 't_ratelimite_conf' "
                "and COLUMN_NAME = 'interfaceUrl'"
            )
        ).scalar_one()
    assert folding == collation.endswith("_ci"), collation


def test_conf_set_on_a_url_with_a_padded_twin_writes_the_url_itself(
    capsys: pytest.CaptureFixture[str], collated_db: tuple[str, Engine]
) -> None:
    db, engine = collated_db
    padded = write_row(engine, "/pay ", rateLimit=5)
    ran = cli(capsys, "--database-url", db, "conf", "set", "/pay", "--rate", "9", "--enable")
    assert ran.code == 0, ran.err
    assert f"created configId {padded + 1}" in ran.out
