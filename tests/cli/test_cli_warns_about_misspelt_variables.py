"""The command line says when a GATEWAY_LIMITER_* variable names no setting: without
--verbose the library's log is quiet, so the CLI prints the warning itself, once."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from tests.support.commandline import cli

pytestmark = pytest.mark.usefixtures("no_local_settings")


def test_a_misspelt_variable_is_one_warning_line_naming_the_nearest(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    migrated_db: tuple[str, Engine],
) -> None:
    db, _ = migrated_db
    monkeypatch.setenv("GATEWAY_LIMITER_REDIS_ULR", "redis://127.0.0.1:6379/0")
    ran = cli(capsys, "--database-url", db, "switch", "status")
    assert ran.code == 0, ran.err
    [line] = [x for x in ran.err.splitlines() if "GATEWAY_LIMITER_REDIS_ULR" in x]
    assert line.startswith("gateway-limiter: warning: ")
    assert "did you mean GATEWAY_LIMITER_REDIS_URL?" in line


def test_no_warning_when_every_variable_is_a_setting(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    migrated_db: tuple[str, Engine],
) -> None:
    db, _ = migrated_db
    monkeypatch.setenv("GATEWAY_LIMITER_KEY_PREFIX", "gwl")
    ran = cli(capsys, "--database-url", db, "switch", "status")
    assert ran.code == 0, ran.err
    assert "warning" not in ran.err
