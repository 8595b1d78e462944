"""The benchmark scripts still run to the end against the current code (smoke runs).

They measure, and no figure is asserted here: a loaded CI host gives any numbers. What
is asserted is that each script finishes and prints its tables, so a change to the
decision path (a reply of another shape, a renamed function) cannot leave the
documented commands broken until someone next measures.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.services import require

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize(
    ("script", "args", "expected"),
    [
        ("decision_cost.py", ["--quick"], ["1. Throughput", "2. Accuracy", "3. asyncio"]),
        ("where_time_goes.py", [], ["1. Redis server time", "3. Python alone"]),
        ("overload.py", ["--quick"], ["1. 8 threads", "2. asyncio", "local refusals:"]),
        ("pushback_constants.py", [], ["decrease  recovery/s  success share"]),
        ("accuracy_shares.py", ["--quick"], ["1. Past the first second", "2. Decision cost"]),
        ("slot_cost.py", ["--quick"], ["Slot cost", "slot: take + give back"]),
        (
            "server_time.py",
            ["--calls", "200", "--repeats", "1"],
            ["1. Redis server time", "2. Redis server time", "limits.lua, fixed window"],
        ),
        ("reload_cost.py", ["--rows", "50", "--repeats", "2"], ["1. One reload of 50 rows"]),
        ("fleet_outage.py", ["--quick"], ["Fleet outage:", "local, even demand"]),
        ("fleet_membership.py", ["--quick"], ["Fleet membership:", "EVAL per heartbeat"]),
        ("console_tally_cost.py", [], ["tally on (as shipped)", "Tallies.add alone"]),
        ("failover_loss.py", ["--quick"], ["Failover loss:", "1. sentinel", "lost bytes"]),
        ("lease_cost.py", ["--quick"], ["Lease cost:", "without leases", "leaseMs 20"]),
        (
            "redis_cpu.py",
            ["--seconds", "0.5", "--processes", "2"],
            ["Redis CPU per admitted decision", "2 processes x 1 thread", "asyncio tasks"],
        ),
    ],
)
def test_benchmark_runs_to_its_tables(script: str, args: list[str], expected: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for heading in expected:
        assert heading in done.stdout, done.stdout[-3000:]


def test_server_time_counts_instructions_under_callgrind() -> None:
    """``--instructions``: a third table, with a count per call for every script."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        require("valgrind", "apt-get install -y valgrind")
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH / "server_time.py"),
            "--calls",
            "200",
            "--repeats",
            "1",
            "--instructions",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    table = done.stdout.split("3. Instructions per call inside EVALSHA", 1)[1]
    counts = dict(
        re.findall(r"^(limits\.lua, [^\n]*?|bucket\.lua, [^\n]*?)\s{2,}([\d,]+)\s", table, re.M)
    )
    assert len(counts) == 5, table  # bucket.lua twice, limits.lua three times
    # a script does at least what its minimal commands do: more than a thousand instructions
    assert all(int(n.replace(",", "")) > 1000 for n in counts.values()), table
