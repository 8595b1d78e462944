"""The benchmark scripts still run to the end against the current code (smoke runs).

They measure, and no figure is asserted here: a loaded CI host gives any numbers. What
is asserted is that each script finishes and prints its tables, so a change to the
decision path (a reply of another shape, a renamed function) cannot leave the
documented commands broken until someone next measures.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.services import require

BENCH = Path(__file__).resolve().parents[2] / "bench"
#: Script runs at a time. Most of a smoke run is time-boxed phases and waits on Redis,
#: servers and child processes, so a few side by side take little longer than one.
AT_ONCE = 4
#: A smoke run's limit; a run of argument handling must end long before any
#: measurement could (all of those run in one process, each within its own limit).
SMOKE_TIMEOUT_S, QUICK_TIMEOUT_S = 300, 30

#: (script, arguments, headings its output must have): each script's smoke run.
SMOKE = [
    ("decision_cost.py", ["--quick"], ["1. Throughput", "2. Accuracy", "3. asyncio"]),
    ("where_time_goes.py", ["--quick"], ["1. Redis server time", "3. Python alone"]),
    ("overload.py", ["--quick"], ["1. 8 threads", "2. asyncio", "local refusals:"]),
    ("pushback_constants.py", [], ["decrease  recovery/s  success share"]),
    ("accuracy_shares.py", ["--quick"], ["1. Past the first second", "2. Decision cost"]),
    ("slot_cost.py", ["--quick"], ["Slot cost", "slot: take + give back"]),
    (
        "server_time.py",
        ["--calls", "200", "--repeats", "1"],
        [
            "1. Redis server time",
            "2. Redis server time",
            "limits.lua, fixed window",
            "token bucket with a reserve (sheddable)",
        ],
    ),
    ("reload_cost.py", ["--rows", "50", "--repeats", "2"], ["1. One reload of 50 rows"]),
    ("fleet_outage.py", ["--quick", "--only", "local"], ["Fleet outage:", "local, even demand"]),
    (
        "calendar_quota.py",
        ["--quick", "--day-calls", "3000"],
        ["1. A simulated day", "paced (burst 10)", "per-second + daily row (bucket.lua)"],
    ),
    ("fleet_membership.py", ["--quick"], ["Fleet membership:", "EVAL per heartbeat"]),
    ("console_tally_cost.py", ["--quick"], ["tally on (as shipped)", "Tallies.add alone"]),
    ("failover_loss.py", ["--quick"], ["Failover loss:", "1. sentinel", "lost bytes"]),
    (
        "lease_cost.py",
        ["--seconds", "1", "--processes", "2", "--threads", "2"],
        ["Lease cost:", "without leases", "leaseMs 20"],
    ),
    (
        "priority.py",
        ["--seconds", "1.5", "--rounds", "2", "--calls", "2000"],
        ["bookings 0.2x", "searches alone:", "Redis time"],
    ),
    (
        "rls.py",
        ["--quick"],
        ["ShouldRateLimit", "in-process, 2 descriptor(s)", "empty aio server", "gRPC layer"],
    ),
    (
        "redis_cpu.py",
        ["--seconds", "0.5", "--processes", "2"],
        ["Redis CPU per admitted decision", "2 processes x 1 thread", "asyncio tasks"],
    ),
]

#: Every script with a command line, and a phrase of its docstring's first paragraph.
SCRIPTS = [
    ("where_time_goes.py", "spends the time that a bare EVALSHA does not."),
    ("console_tally_cost.py", "same limiter whose tally is switched off."),
    ("pushback_constants.py", "a supplier that takes less than the row."),
    ("server_time.py", "the least a script of its contract must do, on a private"),
    ("decision_cost.py", "What one gateway-limiter decision costs"),
    ("lease_cost.py", ""),
    ("reload_cost.py", ""),
    ("overload.py", ""),
    ("slot_cost.py", ""),
    ("accuracy_shares.py", ""),
    ("accuracy.py", ""),
    ("fleet_outage.py", ""),
    ("fleet_membership.py", ""),
    ("failover_loss.py", ""),
    ("cluster_scale.py", ""),
    ("pushback_supplier.py", ""),
    ("redis_cpu.py", "Redis CPU per decision, by how the decisions reach Redis"),
]

#: (script, arguments, what it says on stderr): a count or duration that cannot run.
REFUSED = [
    ("server_time.py", ["--calls", "0"], "argument --calls: 0: must be >= 100"),
    ("server_time.py", ["--repeats", "0"], "argument --repeats: 0: must be >= 1"),
    ("decision_cost.py", ["--threads", "0"], "argument --threads: 0: must be >= 2"),
    ("decision_cost.py", ["--tasks", "0"], "argument --tasks: 0: must be >= 1"),
    ("lease_cost.py", ["--lease-ms", "-5"], "argument --lease-ms: -5: must be >= 1"),
    ("lease_cost.py", ["--lease-ms", "0"], "argument --lease-ms: 0: must be >= 1"),
    ("lease_cost.py", ["--seconds", "0"], "argument --seconds: 0: must be > 0"),
    ("lease_cost.py", ["--timeout", "nan"], "argument --timeout: nan: must be > 0"),
    ("reload_cost.py", ["--rows", "0"], "argument --rows: 0: must be >= 1"),
    ("cluster_scale.py", ["--seconds", "-1"], "argument --seconds: -1: must be > 0"),
    ("overload.py", ["--rate", "0"], "argument --rate: 0: must be >= 1"),
    ("failover_loss.py", ["--write-calls", "0"], "argument --write-calls: 0: must be >= 1"),
    ("pushback_supplier.py", ["--seconds", "0"], "argument --seconds: 0: must be > 0"),
    ("redis_cpu.py", ["--processes", "0"], "argument --processes: 0: must be >= 1"),
    ("calendar_quota.py", ["--day-calls", "10"], "argument --day-calls: 10: must be >= 1000"),
    ("priority.py", ["--rounds", "0"], "argument --rounds: 0: must be >= 1"),
    ("priority.py", ["--calls", "5", "--rounds", "10"], "argument --calls: 5: must be >= --rounds"),
    ("decision_cost.py", ["--threads", "two"], "argument --threads: 'two' is not an integer"),
]

UNREACHABLE = ["decision_cost.py", "server_time.py", "slot_cost.py", "accuracy_shares.py"]
UNREACHABLE_URL = ["--redis-url", "redis://user:s3cret@127.0.0.1:1/0"]
#: server_time.py's third table, counted by valgrind's callgrind.
UNDER_CALLGRIND = ["--calls", "200", "--repeats", "1", "--instructions"]


@dataclass(frozen=True)
class Ran:
    """A finished script run, and how long it took by itself (from its own start)."""

    done: subprocess.CompletedProcess[str]
    took_s: float


def run_script(script: str, args: Sequence[str], timeout: float) -> Ran:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return Ran(done, time.monotonic() - started)


def run_in_one(lines: Sequence[tuple[str, Sequence[str]]], timeout: float) -> list[Ran]:
    """Command lines that end before any measurement, one after another in one process
    (``tests/support/command_lines.py``): each as ``python <script> <args>`` would run."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.command_lines",
            json.dumps([[str(BENCH / script), list(args)] for script, args in lines]),
        ],
        cwd=BENCH.parent,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [
        Ran(
            subprocess.CompletedProcess(
                [script, *args], ran["returncode"], ran["stdout"], ran["stderr"]
            ),
            ran["took_s"],
        )
        for (script, args), ran in zip(lines, json.loads(done.stdout), strict=True)
    ]


class Runs:
    """Script runs started together, each test waiting for its own: the module's tests
    take about as long as its longest runs rather than as long as all of them in turn."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self.pool = pool
        self.started: dict[tuple[str, ...], Future[Ran]] = {}
        self.argument_checks: dict[tuple[str, ...], int] = {}
        self.checked: Future[list[Ran]] | None = None

    def start(self, script: str, args: Sequence[str], timeout: float) -> None:
        key = (script, *args)
        if key not in self.started:
            self.started[key] = self.pool.submit(run_script, script, args, timeout)

    def start_in_one(self, lines: Sequence[tuple[str, Sequence[str]]], timeout: float) -> None:
        """``lines`` in one process (``run_in_one``), beside the other runs."""
        for i, (script, args) in enumerate(lines):
            self.argument_checks.setdefault((script, *args), i)
        self.checked = self.pool.submit(run_in_one, lines, timeout)

    def result(self, script: str, *args: str) -> Ran:
        key = (script, *args)
        if key in self.started:
            return self.started[key].result()
        assert self.checked is not None
        return self.checked.result()[self.argument_checks[key]]


@pytest.fixture(scope="module")
def runs() -> Iterator[Runs]:
    """Every run this module checks, started at once (the longest first)."""
    with ThreadPoolExecutor(AT_ONCE) as pool:
        started = Runs(pool)
        for script, args, _ in SMOKE:
            started.start(script, args, SMOKE_TIMEOUT_S)
        if shutil.which("valgrind") and shutil.which("callgrind_control"):
            started.start("server_time.py", UNDER_CALLGRIND, SMOKE_TIMEOUT_S)
        lines: list[tuple[str, Sequence[str]]] = []
        for script, _ in SCRIPTS:
            lines += [(script, ["--help"]), (script, ["--no-such-option"])]
        lines += [(script, args) for script, args, _ in REFUSED]
        lines += [(script, UNREACHABLE_URL) for script in UNREACHABLE]
        started.start_in_one(lines, QUICK_TIMEOUT_S * len(lines))
        yield started
        for run in started.started.values():
            run.cancel()


@pytest.mark.parametrize(("script", "args", "expected"), SMOKE)
def test_benchmark_runs_to_its_tables(
    runs: Runs, script: str, args: list[str], expected: list[str]
) -> None:
    done = runs.result(script, *args).done
    assert done.returncode == 0, done.stderr[-3000:]
    for heading in expected:
        assert heading in done.stdout, done.stdout[-3000:]


def test_server_time_counts_instructions_under_callgrind(runs: Runs) -> None:
    """``--instructions``: a third table, with a count per call for every script."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        require("valgrind", "apt-get install -y valgrind")
    done = runs.result("server_time.py", *UNDER_CALLGRIND).done
    assert done.returncode == 0, done.stderr[-3000:]
    table = done.stdout.split("3. Instructions per call inside EVALSHA", 1)[1]
    counts = dict(
        re.findall(r"^(limits\.lua, [^\n]*?|bucket\.lua, [^\n]*?)\s{2,}([\d,]+)\s", table, re.M)
    )
    # bucket.lua four times, limits.lua four times (each with a reserve once)
    assert len(counts) == 8, table
    assert "bucket.lua, token bucket with a reserve (sheddable)" in counts, table
    # a script does at least what its minimal commands do: more than a thousand instructions
    assert all(int(n.replace(",", "")) > 1000 for n in counts.values()), table


@pytest.mark.parametrize(("script", "phrase"), SCRIPTS)
def test_help_describes_the_script_without_running_it(runs: Runs, script: str, phrase: str) -> None:
    """``--help`` exits 0 at once with the first paragraph of the docstring, whole."""
    ran = runs.result(script, "--help")
    done = ran.done
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("usage:"), done.stdout[-3000:]
    assert " ".join(phrase.split()) in " ".join(done.stdout.split()), done.stdout
    assert ran.took_s < 20  # no measurement ran (each takes longer)


@pytest.mark.parametrize(("script", "phrase"), SCRIPTS)
def test_an_unknown_option_is_an_error(runs: Runs, script: str, phrase: str) -> None:
    done = runs.result(script, "--no-such-option").done
    assert done.returncode == 2, (done.stdout[-3000:], done.stderr[-3000:])
    assert "unrecognized arguments: --no-such-option" in done.stderr, done.stderr


@pytest.mark.parametrize(("script", "args", "message"), REFUSED)
def test_a_count_or_duration_that_cannot_run_is_refused(
    runs: Runs, script: str, args: list[str], message: str
) -> None:
    """Refused before anything starts, with the option and the value given (exit 2)."""
    done = runs.result(script, *args).done
    assert done.returncode == 2, (done.stdout[-3000:], done.stderr[-3000:])
    assert message in done.stderr, done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize("script", UNREACHABLE)
def test_an_unreachable_redis_url_is_one_line_naming_it(runs: Runs, script: str) -> None:
    """No traceback: one line with the URL, its password masked, and exit 1."""
    done = runs.result(script, *UNREACHABLE_URL).done
    assert done.returncode == 1, (done.stdout[-3000:], done.stderr[-3000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{script}: error: --redis-url redis://user:***@127.0.0.1:1/0: "), (
        lines
    )
    assert "s3cret" not in done.stderr + done.stdout
