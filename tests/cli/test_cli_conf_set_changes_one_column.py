"""``conf set`` changes only the columns given: an existing row's cache, status or label
changes without repeating --rate; a new row still needs --rate (exit 2, nothing written)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from gateway_limiter.config.table import find_rows, make_engine
from tests.support.commandline import cli

pytestmark = pytest.mark.usefixtures("no_local_settings")


@pytest.fixture
def db(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'limits.db'}"
    assert cli(capsys, "--database-url", url, "db", "upgrade").code == 0
    return url


def rows(url: str, interface: str) -> list[tuple[int | None, float | None, int]]:
    engine: Engine = make_engine(url)
    try:
        return [(r.rate_limit, r.cache, r.status) for r in find_rows(engine, interface)]
    finally:
        engine.dispose()


def test_an_existing_row_changes_its_cache_alone(
    capsys: pytest.CaptureFixture[str], db: str
) -> None:
    assert cli(capsys, "--database-url", db, "conf", "set", "/x", "--rate", "7").code == 0
    ran = cli(capsys, "--database-url", db, "conf", "set", "/x", "--cache", "0.3", "--enable")
    assert ran.code == 0, ran.err
    assert "cache" in ran.out
    [(rate, cache, status)] = rows(db, "/x")
    assert (rate, status) == (7, 1)
    assert cache == pytest.approx(0.3)


def test_a_new_row_without_rate_is_refused_and_nothing_written(
    capsys: pytest.CaptureFixture[str], db: str
) -> None:
    ran = cli(capsys, "--database-url", db, "conf", "set", "/new", "--cache", "0.3")
    assert ran.code == 2
    [line] = ran.err.splitlines()
    assert "a new row needs --rate" in line
    assert rows(db, "/new") == []
