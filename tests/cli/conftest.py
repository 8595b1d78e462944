"""What the command line tests share."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from sqlalchemy import Engine

from tests.support.commandline import Command, Ran, Refuses, conf_columns, db_cli


@pytest.fixture
def command(capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]) -> Command:
    """``command(*argv)``: ``gateway-limiter *argv`` on the test's config store (each
    kind, newest revision), with what it printed."""
    db = migrated_any_db[0]

    def run(*argv: str) -> Ran:
        return db_cli(capsys, db, *argv)

    return run


@pytest.fixture
def refuses(command: Command, migrated_any_db: tuple[str, Engine]) -> Refuses:
    """``refuses(argv, *says)``: ``gateway-limiter *argv`` on an empty limits table exits
    2, its error saying each of ``says``, and writes no row."""

    def check(argv: Sequence[str], *says: str) -> None:
        ran = command(*argv)
        assert ran.code == 2, ran
        assert all(said in ran.err for said in says), ran.err
        assert conf_columns(migrated_any_db[1]) == []  # nothing written

    return check
