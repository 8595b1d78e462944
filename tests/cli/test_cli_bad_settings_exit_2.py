"""A bad setting is bad usage: exit status 2 and one line naming it, as the command-line
reference says (the file, the environment, or --database-url), before anything is touched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.commandline import cli

pytestmark = pytest.mark.usefixtures("no_local_settings")


def test_a_bad_value_in_settings_toml_exits_2_in_a_real_process(tmp_path: Path) -> None:
    (tmp_path / "settings.toml").write_text("default_cache = 12\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_LIMITER_")}
    done = subprocess.run(
        [sys.executable, "-m", "gateway_limiter", "switch", "status"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("gateway-limiter: error: ") and "default_cache" in line
    assert not (tmp_path / "gateway_limiter.db").exists()  # nothing touched


def test_a_bad_value_in_the_environment_exits_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_LIMITER_RELOAD_INTERVAL", "soon")
    ran = cli(capsys, "conf", "list")
    assert ran.code == 2
    assert len(ran.err.splitlines()) == 1 and "reload_interval" in ran.err
    assert "Traceback" not in ran.err


def test_a_database_url_no_driver_can_open_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    ran = cli(capsys, "--database-url", "nosuchdriver://u:pw@h/db", "switch", "status")
    assert ran.code == 2
    assert "nosuchdriver://u:***@h/db" in ran.err and "pw@" not in ran.err
