"""``gateway-limiter status --watch``: the report again every --interval seconds, in place
on a terminal (rich Live), one after another when piped; Ctrl-C or SIGTERM ends it
cleanly with exit status 0. Real MariaDB, real Redis; real processes on a real
pseudo-terminal where the terminal is the point."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from gateway_limiter.cli import main, status
from tests.support.limiting import limiter, write_row
from tests.support.services import RedisServer

WATCH = ("status", "--watch")
#: The command line in a process of its own.
CLI = (sys.executable, "-m", "gateway_limiter")
STAMP = re.compile(r"^\d\d:\d\d:\d\d: every [0-9.]+ s, Ctrl-C to stop$", re.MULTILINE)


@pytest.fixture
def settings(
    migrated_db: tuple[str, Engine],
    redis_server: RedisServer,
    key_prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Path]:
    """A settings file on a table with one limited interface, /w at 5/s."""
    for key in list(os.environ):
        if key.startswith("GATEWAY_LIMITER_"):
            monkeypatch.delenv(key)
    db, engine = migrated_db
    write_row(engine, "/w", rateLimit=5, cache=0.0, status=1)
    path = tmp_path / "settings.toml"
    path.write_text(
        f'database_url = "{db}"\nredis_url = "{redis_server.url}"\nkey_prefix = "{key_prefix}"\n'
    )
    yield path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def stored_permits(report: str) -> float:
    line = next(line for line in report.splitlines() if line.startswith("/w "))
    return float(line.split()[5])


def test_each_refresh_shows_the_buckets_live_state(
    capsys: pytest.CaptureFixture[str],
    settings: Path,
    migrated_db: tuple[str, Engine],
    redis_server: RedisServer,
    key_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lim = limiter(migrated_db[0], redis_server.url, key_prefix)
    shown = status.status_report
    drained: list[int] = []

    def drain_then_report(ctx: Any, limiter: Any) -> Any:
        # Drained right before the first report, in the watch's own thread: a loaded
        # host that takes a second to start the watch cannot refill the bucket first.
        if not drained:
            drained.append(sum(lim.try_acquire("/w") for _ in range(6)))
        return shown(ctx, limiter)

    monkeypatch.setattr(status, "status_report", drain_then_report)
    try:
        code, out, err = run(
            capsys, "--settings", str(settings), *WATCH, "--interval", "0.3", "--count", "3"
        )
    finally:
        lim.close()

    assert (code, err) == (0, "")
    assert drained == [5]
    reports = STAMP.split(out)[1:]
    assert len(reports) == 3  # piped: one report after another, each under its time stamp
    assert len(STAMP.findall(out)) == 3
    stored = [stored_permits(r) for r in reports]
    assert stored == sorted(stored) and stored[-1] > stored[0]  # refilling at 5/s, shown live
    assert all("next free ms" in r for r in reports)


def test_a_database_lost_while_watching_is_reported_and_the_watch_goes_on(
    capsys: pytest.CaptureFixture[str],
    settings: Path,
    migrated_db: tuple[str, Engine],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = migrated_db[1]
    shown = status.status_report

    def then_lose_the_table(ctx: Any, limiter: Any) -> Any:
        # Right after the first report is made, in the watch's own thread: every later
        # refresh finds the table gone, however slowly a loaded host runs the watch.
        report = shown(ctx, limiter)
        if renamed.is_set():
            return report
        renamed.set()
        with engine.begin() as conn:
            conn.execute(text("rename table t_ratelimite_conf to t_gone"))
        return report

    renamed = threading.Event()
    monkeypatch.setattr(status, "status_report", then_lose_the_table)
    try:
        code, out, err = run(
            capsys,
            *("--settings", str(settings), "status", "--watch"),
            *("--interval", "0.25", "--count", "3"),
        )
    finally:
        if renamed.is_set():
            with engine.begin() as conn:
                conn.execute(text("rename table t_gone to t_ratelimite_conf"))
    assert (code, err) == (0, "")
    reports = STAMP.split(out)[1:]
    assert len(reports) == 3
    assert "cannot reload" not in reports[0]
    for later in reports[1:]:
        assert "cannot reload" in later and "showing the last good rules" in later
        assert "/w " in later  # the last good rules, still with their live state


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["status", "--interval", "1"], "--interval and --count go with --watch"),
        (["status", "--count", "2"], "--interval and --count go with --watch"),
        (["status", "--watch", "--interval", "0"], "from 0.1 to 3600"),
        (["status", "--watch", "--interval", "soon"], "from 0.1 to 3600"),
        (["status", "--watch", "--count", "0"], "must be 1 or more"),
    ],
)
def test_bad_watch_options_are_usage_errors(
    capsys: pytest.CaptureFixture[str], settings: Path, argv: list[str], message: str
) -> None:
    code, _, err = run(capsys, "--settings", str(settings), *argv)
    assert code == 2
    assert message in err
    assert len(err.splitlines()) == 1


def _read_until(fd: int, done: float, enough: int) -> bytes:
    """Read a pseudo-terminal until ``enough`` reports showed or the deadline passed."""
    data = b""
    while time.monotonic() < done and data.count(b"Ctrl-C to stop") < enough:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                data += os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
    return data


def _drain(fd: int) -> bytes:
    data = b""
    while True:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            return data
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            return data
        if not chunk:
            return data
        data += chunk


def test_on_a_terminal_it_redraws_in_place_and_ctrl_c_ends_it_cleanly(
    settings: Path, tmp_path: Path
) -> None:
    leader, follower = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_LIMITER_")}
    env |= {"COLUMNS": "200", "LINES": "50", "TERM": "xterm"}
    proc = subprocess.Popen(
        [*CLI, "--settings", str(settings), *WATCH, "--interval", "0.2"],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        cwd=tmp_path,
        env=env,
    )
    os.close(follower)
    try:
        shown = _read_until(leader, time.monotonic() + 30, enough=3)
        assert shown.count(b"Ctrl-C to stop") >= 3, shown[-2000:]
        proc.send_signal(signal.SIGINT)
        code = proc.wait(30)
        shown += _drain(leader)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
    assert code == 0
    assert b"Traceback" not in shown and b"error" not in shown
    # rich Live redraws over the last report: the cursor goes up, lines are erased ...
    assert re.search(rb"\x1b\[\d*A", shown) and b"\x1b[2K" in shown
    # ... and the cursor, hidden while it draws, is shown again on the way out.
    assert shown.rstrip().endswith(b"\x1b[?25h")


def test_sigterm_ends_a_piped_watch_cleanly(settings: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_LIMITER_")}
    proc = subprocess.Popen(
        [*CLI, "--settings", str(settings), *WATCH, "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=env,
    )
    assert proc.stdout is not None
    try:
        first = _read_until(proc.stdout.fileno(), time.monotonic() + 30, enough=1)
        assert b"Ctrl-C to stop" in first
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert err == b""
    assert b"Traceback" not in first + out
