"""Pushback's targets, end to end: real gateway processes calling a real HTTP supplier on
loopback through ``LimiterTransport``, one Redis, one MariaDB table. Each test runs
``bench/pushback_supplier.py`` (the documented command, docs/pushback.md) and asserts
on the figures it writes.

- A supplier that takes 30/s (429 above, no Retry-After) behind a row of 60/s, 3
  processes x 3 threads for 16 s: from 5 s on, >= 90 % of the calls that reach the
  supplier succeed, and the successes come near the supplier's rate (the target is
  0.8 x 30/s; measured 0.87 on this box, asserted at 0.75 so that a loaded 2-core host
  starving a gateway process of CPU for a moment does not fail it).
- One 429 with ``Retry-After: 2``: no process sends a call for those 2 s (but the ones
  already in flight, within a round trip), then traffic resumes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.services import RedisServer, fresh_mariadb_database, mariadb_url

BENCH = Path(__file__).resolve().parents[2] / "bench" / "pushback_supplier.py"
#: Calls admitted before the pushback reached Redis may still arrive after the 429: the
#: 429's way back to its gateway, and the pushback's round trip. Generous for a loaded box.
ROUND_TRIP_S = 0.3

pytestmark = pytest.mark.slow


@pytest.fixture
def services() -> Iterator[tuple[str, str]]:
    """(database URL, Redis URL): a fresh MariaDB database and a private redis-server."""
    server = RedisServer().start()
    try:
        with fresh_mariadb_database() as name:
            yield mariadb_url(name), server.url
    finally:
        server.stop()


def run_bench(services: tuple[str, str], tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "figures.json"
    database_url, redis_url = services
    done = subprocess.run(
        [sys.executable, str(BENCH), "--database-url", database_url, "--redis-url", redis_url,
         "--json", str(out), *args],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    print(done.stdout)  # the per-second table, for -s or -rP
    figures: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))["figures"]
    return figures


def test_the_fleet_settles_near_a_supplier_that_takes_half_the_row(
    services: tuple[str, str], tmp_path: Path, figures: Any
) -> None:
    got = run_bench(services, tmp_path, "--seconds", "16", "--from-s", "5")
    figures("pushback against a 30/s supplier, row 60/s, 3x3, from 5 s", **got)
    assert got["sent"] > 0
    assert got["success_share"] >= 0.90
    assert got["of_supplier_rate"] >= 0.75


def test_one_retry_after_holds_every_process_then_traffic_resumes(
    services: tuple[str, str], tmp_path: Path, figures: Any
) -> None:
    got = run_bench(
        services, tmp_path, "--retry-after-at", "4", "--seconds", "9", "--from-s", "1",
        "--cache", "0",
    )  # fmt: skip
    after = got.pop("arrivals_after_429")
    figures("one Retry-After: 2 across 3 processes", **got)
    assert 3.9 <= got["pushed_at"] < 5.0
    in_hold = [a for a in after if a < 2.0]
    assert all(a < ROUND_TRIP_S for a in in_hold), in_hold  # only calls already in flight
    resumed = [a for a in after if 2.0 <= a < 4.0]
    assert resumed and resumed[0] < 2.5, after[:20]  # it resumes at once...
    assert len(resumed) >= 30  # ...and at more than a trickle (the row is 60/s)
