"""The command line starts fast: ``import gateway_limiter.cli`` and ``--help`` load none of
SQLAlchemy, Alembic, redis or rich; a command loads only what it uses; and the lazy
``gateway_limiter`` package still offers every public name.

Each check runs in a fresh interpreter: this test process has long since loaded them all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gateway_limiter
from gateway_limiter.config.migrate import upgrade
from gateway_limiter.config.table import CONF_TABLE, make_engine

HEAVY = ("sqlalchemy", "alembic", "redis", "rich", "apscheduler")


def loaded_after(code: str, cwd: Path) -> list[str]:
    """Which of HEAVY a fresh interpreter has loaded after running ``code``."""
    probe = (
        f"{code}\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_LIMITER_")}
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout.splitlines()[-1])
    return loaded


def test_importing_the_cli_and_help_load_no_database_redis_or_rich(tmp_path: Path) -> None:
    assert loaded_after("import gateway_limiter.cli", tmp_path) == []
    code = (
        "from gateway_limiter.cli import main\n"
        "assert main(['--help']) == 0\n"
        "assert main(['--version']) == 0\n"
        "assert main(['frobnicate']) == 2\n"
    )
    assert loaded_after(code, tmp_path) == []


def test_importing_the_package_loads_no_database_or_redis(tmp_path: Path) -> None:
    assert loaded_after("import gateway_limiter", tmp_path) == []


@pytest.mark.parametrize(
    ("argv", "needed"),
    [
        (["switch", "status"], ["sqlalchemy"]),
        (["conf", "enable", "/nowhere"], ["sqlalchemy"]),
        (["db", "current"], ["sqlalchemy", "alembic"]),
    ],
    ids=["switch-status", "conf-enable", "db-current"],
)
def test_a_command_loads_only_what_it_uses(
    tmp_path: Path, argv: list[str], needed: list[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'limits.db'}"
    engine = make_engine(url)
    try:
        upgrade(engine)
    finally:
        engine.dispose()
    code = f"from gateway_limiter.cli import main\nmain(['--database-url', {url!r}, *{argv!r}])"
    assert loaded_after(code, tmp_path) == needed


def test_the_lazy_package_still_offers_every_public_name() -> None:
    for name in gateway_limiter.__all__:
        assert getattr(gateway_limiter, name) is not None, name
        assert name in dir(gateway_limiter)
    from gateway_limiter import Decision, GatewayLimiter, Settings, try_acquire
    from gateway_limiter.core.decision import Decision as HomeDecision
    from gateway_limiter.limiter import GatewayLimiter as HomeLimiter

    assert GatewayLimiter is HomeLimiter and Decision is HomeDecision
    assert callable(try_acquire) and Settings().switch is True
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = gateway_limiter.no_such_name  # type: ignore[attr-defined]
    assert not hasattr(gateway_limiter, "no_such_name")


def test_the_help_names_the_limits_table_as_config_table_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gateway_limiter.cli import main

    assert main(["--help"]) == 0
    assert f"rows of {CONF_TABLE}" in capsys.readouterr().out
