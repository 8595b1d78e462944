"""``gateway-limiter demo`` runs on a bare machine: no database server, no Redis.

It is run as a real process with stdout a pipe (not a terminal), so it prints plain
blocks, one per second, which the assertions read.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway_limiter.cli.demo import INTERFACES

SECONDS = 4


@pytest.fixture(scope="module")
def demo_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], tuple[float, float], Path]:
    """One demo run shared by the tests below: its result, (wall time, of which seconds
    spent waiting for a CPU) and temp dir."""
    workdir = tmp_path_factory.mktemp("demo-cwd")
    tmpdir = tmp_path_factory.mktemp("demo-tmp")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_LIMITER_")}
    # Nothing to reach: any server the demo tried would refuse.
    env["GATEWAY_LIMITER_DATABASE_URL"] = "mysql+pymysql://root@127.0.0.1:1/none"
    env["GATEWAY_LIMITER_REDIS_URL"] = "redis://127.0.0.1:1/0"
    env["TMPDIR"] = str(tmpdir)
    started = time.monotonic()
    argv = [sys.executable, "-m", "gateway_limiter", "demo", "--seconds", str(SECONDS)]
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=workdir, env=env
    ) as demo:
        waited = run_queue_waits(demo.pid)
        out, err = demo.communicate(timeout=30)
    took = time.monotonic() - started
    done = subprocess.CompletedProcess(argv, demo.returncode, out, err)
    return done, (took, waited()), tmpdir


def run_queue_waits(pid: int) -> Callable[[], float]:
    """Seconds the threads of process ``pid`` have waited for a CPU, as last read: a
    thread reads /proc/<pid>/task/*/schedstat (second field) until the process ends,
    and the function returned gives the sum (0.0 where the files do not exist)."""
    seen: dict[str, float] = {}

    def watch() -> None:
        tasks = Path(f"/proc/{pid}/task")
        while True:
            try:
                tids = os.listdir(tasks)
            except OSError:
                return  # it ended
            for tid in tids:
                with contextlib.suppress(OSError, IndexError, ValueError):
                    seen[tid] = int((tasks / tid / "schedstat").read_text().split()[1]) / 1e9
            if not tids:
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()

    def total() -> float:
        watcher.join(5)
        return sum(seen.values(), 0.0)

    return total


def test_the_demo_exits_0_in_about_its_seconds_and_cleans_up(
    demo_run: tuple[subprocess.CompletedProcess[str], tuple[float, float], Path],
) -> None:
    done, (took, waited), tmpdir = demo_run
    assert done.returncode == 0, done.stderr
    # What a loaded host took from it, waiting for a CPU, is not the demo's own time.
    assert took >= SECONDS
    assert took - waited < 10, (took, waited)
    assert done.stderr == ""  # no warnings, no tracebacks
    assert "\x1b" not in done.stdout  # not a terminal: no ANSI codes
    assert list(tmpdir.iterdir()) == []  # its temporary SQLite file is gone


def test_the_demo_explains_itself_and_shows_every_interface_each_second(
    demo_run: tuple[subprocess.CompletedProcess[str], tuple[float, float], Path],
) -> None:
    out = demo_run[0].stdout
    assert "memory://" in out
    for second in range(1, SECONDS + 1):
        assert f"second {second} ({second - 1}-{second} s)" in out
    for iface in INTERFACES:
        assert out.count(iface.url) >= SECONDS + 2  # header, every block, totals
    assert "gateway-limiter db upgrade" in out  # the footer says what to try next
    assert "gateway-limiter conf list" in out


def _block_lines(out: str, url: str) -> list[tuple[str, int, int, int]]:
    """(rule in force, admitted, waited, refused) of ``url`` in each per-second block."""
    pattern = re.compile(rf"^  {re.escape(url)}\s+(.+?)\s+(\d+)\s+(\d+)\s+(\d+)$", re.MULTILINE)
    return [(m[1], int(m[2]), int(m[3]), int(m[4])) for m in pattern.finditer(out)]


def test_the_closed_interface_is_refused_and_the_limited_one_admits_about_its_rate(
    demo_run: tuple[subprocess.CompletedProcess[str], tuple[float, float], Path],
) -> None:
    out = demo_run[0].stdout
    closed = _block_lines(out, "/ibe/fare/quote")
    assert len(closed) == SECONDS
    first_rule, admitted, _, refused = closed[0]
    assert (first_rule, admitted) == ("closed", 0)
    assert refused > 0
    # The first second: one second's refill on top of a full bucket of 20, no more.
    search = _block_lines(out, "/ibe/flight/search")
    assert search[0][0] == "20/s (0.2 s)"
    assert 20 <= search[0][1] <= 45
    # The disabled row: never limited, never refused.
    assert all(r == 0 for *_, r in _block_lines(out, "/ibe/order/cancel"))


def test_the_rate_change_and_the_switch_show_up_through_the_reload(
    demo_run: tuple[subprocess.CompletedProcess[str], tuple[float, float], Path],
) -> None:
    out = demo_run[0].stdout
    assert re.search(
        r"event: lower /ibe/flight/search .*UPDATE t_ratelimite_conf SET rateLimit = 8", out
    )
    assert re.search(r"event: switch off: UPDATE t_ratelimite_switch SET enabled = 0", out)
    assert re.search(r"event: switch on: UPDATE t_ratelimite_switch SET enabled = 1", out)
    # Reloads every second: each change is in force within about a second.
    for effect in ("now limited to 8/s", "switch off: every call is admitted"):
        found = re.search(rf"reload, (\d+\.\d) s later: .*{re.escape(effect)}", out)
        assert found, effect
        assert float(found[1]) <= 2.0  # 1 s interval, 10 % jitter, slack for a busy machine
    assert any("switch off" in rule for rule, *_ in _block_lines(out, "/ibe/fare/quote"))


class _Clock:
    """The demo's ``time`` module on a driven clock: ``sleep`` moves it on."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def strftime(self, fmt: str) -> str:
        return time.strftime(fmt)


def test_a_line_of_a_later_moment_never_comes_before_an_earlier_seconds_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reload seen 0.05 s into second 5 is printed after the block of second 4 (printed
    0.1 s after it ends): the block never follows a line that says its rule is gone."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from gateway_limiter.cli import demo

    clock = _Clock()
    monkeypatch.setattr(demo, "time", clock)
    out = io.StringIO()
    limiter = SimpleNamespace(
        registry=SimpleNamespace(snapshot=SimpleNamespace(switch=True, rules={}))
    )

    class Run(demo.DemoRun):
        said = False

        def tick(self) -> list[tuple[float, str]]:
            now = self.elapsed()
            if not self.said and now >= 4.05:
                self.said = True
                return [(now, f"[{now:4.1f} s] reload, 0.5 s later: now 8/s")]
            return []

    run = Run(limiter, None, Console(file=out, width=200), 6)  # type: ignore[arg-type]
    run.start = clock.monotonic()
    run._show_plain([])
    lines = out.getvalue().splitlines()
    said = next(i for i, line in enumerate(lines) if "reload, 0.5 s later" in line)
    blocks = [
        (i, int(m[1]))
        for i, line in enumerate(lines)
        if (m := re.match(r"second \d+ \(\d+-(\d+) s\)", line))
    ]
    assert [end for _, end in blocks] == [1, 2, 3, 4, 5, 6]
    # every block printed after the line is of a second that ended after it happened
    assert all(end > 4.05 for i, end in blocks if i > said), lines
    assert any(i < said and end == 4 for i, end in blocks), lines


def test_getting_started_says_how_long_the_demo_runs_by_default() -> None:
    """The guide's "for N seconds" is the ``--seconds`` default that ``demo --help``
    states and the demo runs."""
    import argparse

    from gateway_limiter.cli.demo import register

    parser = argparse.ArgumentParser()
    register(parser)
    default = parser.parse_args([]).seconds
    assert f"(default {default})" in parser.format_help()
    guide = Path(__file__).parents[2] / "docs" / "getting-started.md"
    said = re.findall(r"live, for (\d+) seconds", " ".join(guide.read_text().split()))
    assert said == [str(default)]
