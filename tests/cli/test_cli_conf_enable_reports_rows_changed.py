"""``conf enable`` / ``conf disable`` say which rows they changed: only the rows that
``--period`` / ``--per-caller`` / ``--shared`` picked and whose status was the other one;
a row already so is named as such, and nothing else is claimed. MariaDB and SQLite,
checked with plain SQL."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text

from tests.support.commandline import Ran, cli

URL = "/ibe/x"

pytestmark = pytest.mark.usefixtures("no_local_settings")


def statuses(engine: Engine) -> dict[int, int]:
    with engine.connect() as conn:
        rows = conn.execute(text("select configId, status from t_ratelimite_conf")).all()
    return {int(config_id): int(status) for config_id, status in rows}


def three_rows(capsys: pytest.CaptureFixture[str], db: str) -> None:
    """Rows of URL per 1 s, per 10 s and per caller, all enabled; their configIds."""
    for argv in ([], ["--period", "10"], ["--per-caller"]):
        ran = cli(
            capsys, "--database-url", db, "conf", "set", URL, "--rate", "9", "--enable", *argv
        )
        assert ran.code == 0, ran.err


def first_line(ran: Ran) -> str:
    assert ran.code == 0, ran.err
    return ran.out.splitlines()[0]


def test_disable_by_period_reports_only_the_row_it_picked(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_any_db
    three_rows(capsys, db)
    ran = cli(capsys, "--database-url", db, "conf", "disable", URL, "--period", "10")
    assert first_line(ran) == f"disabled 1 row for {URL} (configId 2)"
    assert statuses(engine) == {1: 1, 2: 0, 3: 1}


def test_enable_on_an_enabled_row_says_so_and_changes_nothing(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_any_db
    three_rows(capsys, db)
    ran = cli(capsys, "--database-url", db, "conf", "enable", URL, "--period", "10")
    line = first_line(ran)
    assert "enabled 1 row" not in line
    assert line == f"configId 2 was already enabled; 0 rows changed for {URL}"
    assert statuses(engine) == {1: 1, 2: 1, 3: 1}


def test_enable_of_every_row_names_the_changed_and_the_unchanged_apart(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_any_db
    three_rows(capsys, db)
    assert cli(capsys, "--database-url", db, "conf", "disable", URL, "--shared").code == 0
    assert statuses(engine) == {1: 0, 2: 0, 3: 1}
    ran = cli(capsys, "--database-url", db, "conf", "enable", URL)
    assert first_line(ran) == (
        f"enabled 2 rows for {URL} (configId 1, 2); configId 3 was already enabled"
    )
    assert statuses(engine) == {1: 1, 2: 1, 3: 1}
