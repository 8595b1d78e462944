"""``examples/threaded_http_guard.py`` runs as written (no servers, no network) and,
like the asyncio example, leaves no file behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run one example in an empty folder, with a temporary folder of its own."""
    cwd, temp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_LIMITER_")}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        cwd=cwd,  # no settings.toml, nothing of the checkout's state
        env=env | {"TMPDIR": str(temp)},  # where tempfile puts the example's database
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done, tmp_path


def test_the_threaded_example_admits_the_burst_and_the_budget_and_refuses_the_rest(
    tmp_path: Path,
) -> None:
    done, _ = run_example("threaded_http_guard.py", tmp_path)

    assert re.search(r"supplier on http://127\.0\.0\.1:\d+, limited to 10/s", done.stdout)
    counts = re.search(r"admitted (\d+), refused (\d+)", done.stdout)
    assert counts, done.stdout
    admitted, refused = int(counts[1]), int(counts[2])
    assert admitted + refused == 40
    # 10 stored + 5 within the 0.5 s budget; a host that stalls the burst admits more
    assert 15 <= admitted <= 18, done.stdout
    calls = re.search(r"supplier saw calls at \(s\): ([\d. ]+)", done.stdout)
    assert calls and len(calls[1].split()) == admitted  # every admitted call got there
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("name", ["threaded_http_guard.py", "aiohttp_or_httpx_guard.py"])
def test_an_example_leaves_no_file_behind(tmp_path: Path, name: str) -> None:
    _, root = run_example(name, tmp_path)

    left = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    assert left == ["cwd", "tmp"]
