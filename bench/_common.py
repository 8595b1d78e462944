"""What the benchmarks share: a private ``redis-server`` for a run (a free port, no
persistence, stopped when the run ends: Ctrl-C, ``kill`` and, on Linux, even SIGKILL of
the run), and the statistics they report."""

from __future__ import annotations

import ctypes
import math
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import redis


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM if the run dies, even by SIGKILL (Linux)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@contextmanager
def private_redis() -> Iterator[str]:
    """A ``redis-server`` of this run's own on a free port; its URL. Stopped on exit."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH (or pass --redis-url)")
    workdir = Path(tempfile.mkdtemp(prefix="gwl-bench-redis-"))
    logfile = workdir / "redis.log"
    proc: subprocess.Popen[bytes] | None = None
    try:
        for _attempt in range(5):  # a free port can be taken between probe and bind
            port = free_port()
            options = ["--port", str(port), "--bind", "127.0.0.1", "--save", ""]
            options += ["--appendonly", "no", "--daemonize", "no"]
            options += ["--dir", str(workdir), "--logfile", str(logfile)]
            proc = subprocess.Popen(
                [binary, *options],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches the run, which stops it
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509
            )
            if _answers(port, proc):
                break
            _stop(proc)
            proc = None
        if proc is None:
            tail = logfile.read_text(errors="replace")[-2000:] if logfile.exists() else ""
            raise SystemExit(f"could not start a private redis-server\n{tail}")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(workdir, ignore_errors=True)


def _answers(port: int, proc: subprocess.Popen[bytes], seconds: float = 5.0) -> bool:
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=0.5)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if client.ping():
                    return True
            except (redis.ConnectionError, redis.TimeoutError):
                time.sleep(0.02)
        return False
    finally:
        client.close()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def max_in_window(times: Sequence[float], window: float = 1.0) -> int:
    """The most timestamps (sorted) inside any half-open window of ``window`` seconds."""
    best = lo = 0
    for hi, t in enumerate(times):
        while times[lo] <= t - window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) by nearest rank; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
