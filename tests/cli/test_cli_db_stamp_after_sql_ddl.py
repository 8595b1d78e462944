"""Tables made by hand from ``sql/t_ratelimite_conf.sql`` have no Alembic revision:
``db current`` points to ``db stamp head`` (``db upgrade`` would fail creating them
again), and after ``db stamp head`` both say the schema is up to date. Real MariaDB, the
file fed to it as an operator's client would."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway_limiter.config.migrate import current_revision, head_revision
from gateway_limiter.config.table import make_engine
from tests.support.commandline import cli
from tests.support.services import run_ddl_file

pytestmark = pytest.mark.usefixtures("no_local_settings")


def test_db_current_on_tables_from_sql_says_stamp_and_stamp_records_head(
    capsys: pytest.CaptureFixture[str], mariadb_db: str
) -> None:
    run_ddl_file(mariadb_db)
    ran = cli(capsys, "--database-url", mariadb_db, "db", "current")
    assert ran.code == 0, ran.err
    assert "db stamp" in ran.out and "db upgrade" not in ran.out, ran.out
    # what it used to advise fails, and says to stamp too
    ran = cli(capsys, "--database-url", mariadb_db, "db", "upgrade")
    assert ran.code == 1 and "db stamp REVISION" in ran.err

    ran = cli(capsys, "--database-url", mariadb_db, "db", "stamp", "head")
    assert ran.code == 0, ran.err
    engine = make_engine(mariadb_db)
    try:
        assert current_revision(engine) == head_revision(engine)
    finally:
        engine.dispose()
    ran = cli(capsys, "--database-url", mariadb_db, "db", "current")
    assert ran.code == 0 and "(head, up to date)" in ran.out, ran.out
    ran = cli(capsys, "--database-url", mariadb_db, "db", "upgrade")
    assert ran.code == 0 and "nothing to do" in ran.out


def test_db_current_on_an_empty_database_still_says_upgrade(
    capsys: pytest.CaptureFixture[str], mariadb_db: str
) -> None:
    ran = cli(capsys, "--database-url", mariadb_db, "db", "current")
    assert ran.code == 0, ran.err
    assert "never migrated" in ran.out and "db upgrade" in ran.out


def test_db_stamp_of_an_unknown_revision_is_bad_usage_naming_the_known_ones(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'limits.db'}"
    assert cli(capsys, "--database-url", db, "db", "upgrade").code == 0
    ran = cli(capsys, "--database-url", db, "db", "stamp", "bogus")
    assert ran.code == 2
    [line] = ran.err.splitlines()
    assert "unknown revision 'bogus'" in line
    assert "head, base, 0001" in line
