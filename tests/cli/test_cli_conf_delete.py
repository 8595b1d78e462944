"""``conf delete URL [--period S] [--per-caller|--shared]`` removes the rows it picks (the
same selection as ``conf enable/disable``), says which configIds went, and with nothing
to delete exits 1 with one line, as ``conf enable`` does. MariaDB and SQLite, checked
with plain SQL."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text

from tests.support.commandline import Ran, cli

URL = "/ibe/x"

pytestmark = pytest.mark.usefixtures("no_local_settings")


def rows(engine: Engine) -> list[tuple[int, str, int, int]]:
    with engine.connect() as conn:
        found = conn.execute(
            text(
                "select configId, interfaceUrl, periodSeconds, perCaller "
                "from t_ratelimite_conf order by configId"
            )
        ).all()
    return [(int(i), str(u), int(p), int(c)) for i, u, p, c in found]


def conf(capsys: pytest.CaptureFixture[str], db: str, *argv: str) -> Ran:
    return cli(capsys, "--database-url", db, "conf", *argv)


def write_four_rows(capsys: pytest.CaptureFixture[str], db: str, engine: Engine) -> None:
    """URL per 1 s, per 60 s and per caller (configId 1-3), and another URL (4)."""
    for argv in ([URL], [URL, "--period", "60"], [URL, "--per-caller"], ["/ibe/other"]):
        ran = conf(capsys, db, "set", *argv, "--rate", "5", "--enable")
        assert ran.code == 0, ran.err
    assert [r[0] for r in rows(engine)] == [1, 2, 3, 4]


@pytest.fixture
def four_rows(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> tuple[str, Engine]:
    """Four rows (``write_four_rows``) on each config store."""
    db, engine = migrated_any_db
    write_four_rows(capsys, db, engine)
    return db, engine


def test_delete_by_period_removes_only_that_row(
    capsys: pytest.CaptureFixture[str], four_rows: tuple[str, Engine]
) -> None:
    db, engine = four_rows
    ran = conf(capsys, db, "delete", URL, "--period", "60")
    assert ran.code == 0, ran.err
    assert ran.out.splitlines()[0] == f"deleted 1 row for {URL} (configId 2)"
    assert [r[0] for r in rows(engine)] == [1, 3, 4]


def test_delete_per_caller_then_every_row_of_the_url(
    capsys: pytest.CaptureFixture[str], four_rows: tuple[str, Engine]
) -> None:
    db, engine = four_rows
    ran = conf(capsys, db, "delete", URL, "--per-caller")
    assert ran.code == 0, ran.err
    assert "configId 3" in ran.out.splitlines()[0]
    assert [r[0] for r in rows(engine)] == [1, 2, 4]
    ran = conf(capsys, db, "delete", URL)
    assert ran.code == 0, ran.err
    assert ran.out.splitlines()[0] == f"deleted 2 rows for {URL} (configId 1, 2)"
    assert f"{URL} is not limited: no row" in ran.out
    assert rows(engine) == [(4, "/ibe/other", 1, 0)]


def test_delete_with_no_match_exits_1_with_one_line_and_deletes_nothing(
    capsys: pytest.CaptureFixture[str], four_rows: tuple[str, Engine]
) -> None:
    db, engine = four_rows
    before = rows(engine)
    for argv in (["/ibe/none"], [URL, "--period", "7"]):
        ran = conf(capsys, db, "delete", *argv)
        assert ran.code == 1
        assert ran.out == ""
        [line] = ran.err.splitlines()
        assert line.startswith("gateway-limiter: error: no row for URL ")
        assert "nothing deleted" in line
    # the same code and form as conf enable on no match
    assert conf(capsys, db, "enable", "/ibe/none").code == 1
    assert rows(engine) == before


def test_delete_of_another_spelling_leaves_the_rows_of_the_url(
    capsys: pytest.CaptureFixture[str], migrated_db: tuple[str, Engine]
) -> None:
    # '/IBE/X' is another interface than '/ibe/x', whatever a collation says
    db, engine = migrated_db
    write_four_rows(capsys, db, engine)
    ran = conf(capsys, db, "delete", URL.upper())
    assert ran.code == 1
    assert "no row for URL /IBE/X" in ran.err
    assert len(rows(engine)) == 4
