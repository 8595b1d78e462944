"""``examples/aiohttp_or_httpx_guard.py`` runs as written: no servers, no network."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "aiohttp_or_httpx_guard.py"


def test_the_asyncio_example_runs_as_written(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        cwd=tmp_path,  # no settings.toml, nothing of the checkout's state
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # 10 stored + 10 within the 1 s budget (one more if the host stalled the burst 0.1 s)
    counts = re.search(r"\{'supplier 200': (\d+), 'busy': (\d+)\}", done.stdout)
    assert counts, done.stdout
    assert 20 <= int(counts[1]) <= 21 and int(counts[1]) + int(counts[2]) == 60
    assert "then supplier answered 200" in done.stdout
