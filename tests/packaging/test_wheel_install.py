"""An installed wheel, not only a checkout, can migrate a database (``db upgrade``), and
a plain install of it decides through the hiredis parser (without it a decision
measured 0.56x the bare EVALSHA floor).

The migrations live at the top of the checkout and are mapped into the package by
pyproject.toml; these tests build the wheel, install it into a new virtualenv (its
dependencies come from the configured package index), and run the migrations from
there with the checkout out of reach.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.services import RedisServer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

#: Run inside the new virtualenv: migrate the database named in argv[1], report back.
PROBE = """
import json, sys
import sqlalchemy
import gateway_limiter
from gateway_limiter.config.migrate import current_revision, head_revision, upgrade
from gateway_limiter.config.table import make_engine

engine = make_engine(sys.argv[1])
if sys.argv[2] == "upgrade":
    upgrade(engine)
print(json.dumps({
    "module": gateway_limiter.__file__,
    "tables": sorted(sqlalchemy.inspect(engine).get_table_names()),
    "current": current_revision(engine),
    "head": head_revision(engine),
}))
"""


#: Run inside the new virtualenv: one decision on the Redis at argv[1], then which
#: parser the decision's pooled connection reads replies with.
PARSER_PROBE = """
import json, sys
from importlib.metadata import requires
import redis.utils
from gateway_limiter.backends.redis import RedisBackend
from gateway_limiter.config.rules import Rule
from gateway_limiter.config.settings import Settings

backend = RedisBackend(Settings(redis_url=sys.argv[1], key_prefix="wheelprobe"))
verdict = backend.reserve(Rule("/wheel/probe", 100, 0.0, 0), 1, 0.0)
pool = backend.client.connection_pool
connection = pool.get_connection()
try:
    parser = type(connection._parser)
finally:
    pool.release(connection)
backend.close()
print(json.dumps({
    "allowed": verdict.allowed,
    "hiredis_available": redis.utils.HIREDIS_AVAILABLE,
    "parser": f"{parser.__module__}.{parser.__qualname__}",
    "requires": requires("gateway-limiter"),
}))
"""


def _run(args: list[str | Path], cwd: Path, timeout: float = 600) -> str:
    """Run a command with the checkout out of reach; fail with its output if it fails."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "PYTHONPATH" and not k.startswith("GATEWAY_LIMITER_")
    }
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built from a copy of the checkout (no build/ left behind)."""
    source = tmp_path_factory.mktemp("source") / "gateway-limiter"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv*",
            "build",
            "dist",
            "*.egg-info",
            "__pycache__",
            ".*_cache",
            ".hypothesis",
            "*.db",
        ),
    )
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", out, source], cwd=out)
    (built,) = out.glob("gateway_limiter-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtualenv with the wheel installed, and nothing of the checkout."""
    venv = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", venv], cwd=venv)
    _run([venv / "bin" / "python", "-m", "pip", "install", "-q", wheel], cwd=venv)
    return venv


def test_wheel_ships_migrations_lua_script_and_type_marker(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    versions = {p.name for p in (ROOT / "migrations" / "versions").glob("[0-9]*.py")}

    for required in (
        "gateway_limiter/py.typed",
        "gateway_limiter/backends/bucket.lua",
        "gateway_limiter/migrations/env.py",
        "gateway_limiter/migrations/script.py.mako",
    ):
        assert required in names, required
    assert any(re.fullmatch(r"gateway_limiter/migrations/versions/0001_\w+\.py", n) for n in names)
    assert any(re.fullmatch(r"gateway_limiter/migrations/versions/0002_\w+\.py", n) for n in names)
    assert {f"gateway_limiter/migrations/versions/{v}" for v in versions} <= names
    assert {n.split("/", 1)[0] for n in names if "/" in n} == {
        "gateway_limiter",
        wheel.name.split("-py3")[0] + ".dist-info",
    }


def test_wheel_ships_the_consoles_page_and_assets(wheel: Path) -> None:
    """The console's page, script and style come from the wheel, never from a CDN."""
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "gateway_limiter/console/app.py",
        "gateway_limiter/console/templates/index.html",
        "gateway_limiter/console/static/console.js",
        "gateway_limiter/console/static/console.css",
    ):
        assert required in names, required
    page = zipfile.ZipFile(wheel).read("gateway_limiter/console/templates/index.html")
    assert b"http://" not in page
    assert b"https://" not in page


def test_installed_wheel_migrates_a_new_database_through_the_python_api(
    venv: Path, tmp_path: Path
) -> None:
    database = f"sqlite:///{tmp_path / 'limits.db'}"

    report = json.loads(
        _run([venv / "bin" / "python", "-c", PROBE, database, "upgrade"], cwd=tmp_path)
    )

    assert Path(report["module"]).is_relative_to(venv), report["module"]
    assert report["tables"] == [
        "gateway_limiter_alembic_version",
        "t_ratelimite_audit",
        "t_ratelimite_conf",
        "t_ratelimite_quota",
        "t_ratelimite_switch",
    ]
    assert report["head"] is not None
    assert report["current"] == report["head"]


def test_installed_wheel_migrates_a_new_database_with_db_upgrade(
    venv: Path, tmp_path: Path
) -> None:
    database = f"sqlite:///{tmp_path / 'limits.db'}"

    _run([venv / "bin" / "gateway-limiter", "--database-url", database, "db", "upgrade"], tmp_path)
    report = json.loads(
        _run([venv / "bin" / "python", "-c", PROBE, database, "inspect"], cwd=tmp_path)
    )

    assert Path(report["module"]).is_relative_to(venv), report["module"]
    assert "t_ratelimite_conf" in report["tables"]
    assert "t_ratelimite_switch" in report["tables"]
    assert report["head"] is not None
    assert report["current"] == report["head"]


def test_plain_install_of_the_wheel_decides_with_the_hiredis_parser(
    venv: Path, redis_server: RedisServer, tmp_path: Path
) -> None:
    report = json.loads(
        _run([venv / "bin" / "python", "-c", PARSER_PROBE, redis_server.url], cwd=tmp_path)
    )

    assert report["allowed"] is True
    assert report["hiredis_available"] is True
    assert "hiredis" in report["parser"].lower(), report["parser"]
    # a dependency, not an extra: no `; extra == ...` marker on either requirement
    plain = [r for r in report["requires"] if "extra ==" not in r]
    assert any(r.startswith("redis[hiredis]") for r in plain), report["requires"]
    assert any(r.startswith("hiredis") for r in plain), report["requires"]
