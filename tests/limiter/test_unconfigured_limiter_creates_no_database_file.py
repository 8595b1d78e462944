"""``gateway_limiter.try_acquire`` where nothing is configured: no limits, one warning
that says how to configure them, and no empty ``gateway_limiter.db`` left behind
(connecting to a SQLite file that does not exist creates it)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway_limiter.config.migrate import upgrade
from gateway_limiter.config.reload import Registry
from gateway_limiter.config.settings import Settings
from gateway_limiter.config.table import make_engine, missing_sqlite_file, upsert_conf
from gateway_limiter.observe.logs import LOGGER_NAME

SCRIPT = """
import logging
logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
import gateway_limiter
print(gateway_limiter.try_acquire("/ibe/flight/search"))
"""


def test_the_module_level_limiter_in_an_empty_folder_creates_no_file(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_LIMITER_")}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"  # no limits: admitted
    assert list(tmp_path.iterdir()) == []
    lines = done.stderr.splitlines()
    assert not [line for line in lines if line.startswith("ERROR")], done.stderr
    (warning,) = [line for line in lines if "database" in line]
    assert warning.startswith("WARNING gateway_limiter: database file gateway_limiter.db")
    for how in ("GATEWAY_LIMITER_SETTINGS", "./settings.toml", "GATEWAY_LIMITER_DATABASE_URL"):
        assert how in warning
    assert "gateway-limiter db upgrade" in warning


@pytest.fixture
def registry_on_missing_file(tmp_path: Path) -> tuple[Registry, Path]:
    path = tmp_path / "limits.db"
    return Registry(Settings(database_url=f"sqlite:///{path}", reload_interval=60)), path


def test_every_reload_leaves_the_file_uncreated_and_warns_once(
    registry_on_missing_file: tuple[Registry, Path], caplog: pytest.LogCaptureFixture
) -> None:
    registry, path = registry_on_missing_file
    caplog.set_level(logging.DEBUG, logger=LOGGER_NAME)
    summaries = [registry.reload() for _ in range(3)]
    registry.close()

    assert not path.exists()
    assert [s.ok for s in summaries] == [False] * 3
    assert summaries[0].error == f"database file {path} does not exist"
    assert registry.snapshot.rules == {}
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert "no limits in force" in warnings[0].getMessage()


def test_the_limits_load_once_the_file_is_made(
    registry_on_missing_file: tuple[Registry, Path], caplog: pytest.LogCaptureFixture
) -> None:
    registry, path = registry_on_missing_file
    assert not registry.reload().ok

    engine = make_engine(f"sqlite:///{path}")  # as 'gateway-limiter db upgrade' would
    upgrade(engine)
    upsert_conf(engine, "/m", rate_limit=5, status=1)
    engine.dispose()
    caplog.set_level(logging.WARNING, logger=LOGGER_NAME)
    caplog.clear()
    summary = registry.reload()
    registry.close()

    assert summary.ok and summary.added == ("/m",)
    assert [r.getMessage() for r in caplog.records] == ["database reachable again; limits reloaded"]


def test_a_file_gone_after_a_good_load_keeps_the_last_good_limits(
    registry_on_missing_file: tuple[Registry, Path], caplog: pytest.LogCaptureFixture
) -> None:
    registry, path = registry_on_missing_file
    engine = make_engine(f"sqlite:///{path}")
    upgrade(engine)
    upsert_conf(engine, "/m", rate_limit=5, status=1)
    engine.dispose()
    assert registry.reload().ok
    # The reload has the rows it found recorded in the audit on a thread of its own:
    # let it finish before the file goes, or it fails to write and says so.
    assert registry.wait_for_audit()
    registry.engine.dispose()  # no pooled connection keeps the deleted file open

    path.unlink()
    caplog.set_level(logging.WARNING, logger=LOGGER_NAME)
    caplog.clear()
    summary = registry.reload()
    registry.close()

    assert not summary.ok and not path.exists()
    assert set(registry.snapshot.rules) == {"/m"}
    (record,) = caplog.records
    assert record.levelno == logging.ERROR
    assert "keeping the last good limits" in record.getMessage()
    assert "does not exist" in record.getMessage()


@pytest.mark.parametrize(
    ("url", "missing"),
    [
        ("sqlite:///{tmp}/nothing.db", True),
        ("sqlite:///{tmp}/there.db", False),
        ("sqlite://", False),  # in memory
        ("sqlite:///:memory:", False),
        ("sqlite:///file:{tmp}/nothing.db?mode=ro&uri=true", False),  # SQLite decides
        ("mysql+pymysql://root@127.0.0.1:3306/x", False),
    ],
)
def test_which_urls_name_a_missing_sqlite_file(tmp_path: Path, url: str, missing: bool) -> None:
    (tmp_path / "there.db").touch()
    found = missing_sqlite_file(url.format(tmp=tmp_path))
    assert (found == tmp_path / "nothing.db") if missing else found is None
