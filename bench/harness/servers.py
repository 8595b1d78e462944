"""Private ``redis-server`` processes for a run: one (``private_redis``) or a Redis
Cluster (``servers``), each on a free port with no persistence, stopped when the run
ends (Ctrl-C, ``kill`` and, on Linux, even SIGKILL of the run)."""

from __future__ import annotations

import ctypes
import os
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


def die_with_parent() -> None:
    """In the child, before exec: get SIGTERM if the run dies, even by SIGKILL (Linux)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@contextmanager
def private_redis(wrapper: Sequence[str] = (), start_s: float = 5.0) -> Iterator[str]:
    """A ``redis-server`` of this run's own on a free port; its URL. Stopped on exit.

    ``wrapper``: a command that runs the server (``valgrind ...``), which may take up to
    ``start_s`` seconds to answer."""
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
                [*wrapper, binary, *options],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches the run, which stops it
                preexec_fn=die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509
            )
            if _answers(port, proc, start_s):
                break
            stop(proc)
            proc = None
        if proc is None:
            tail = logfile.read_text(errors="replace")[-2000:] if logfile.exists() else ""
            raise SystemExit(f"could not start a private redis-server\n{tail}")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        if proc is not None:
            stop(proc)
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


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate ``proc`` and wait for it; kill it if it does not go within 5 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_server(workdir: Path, *extra: str) -> tuple[int, subprocess.Popen[bytes]]:
    """A redis-server on a free port in a directory of its own; (port, process)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH")
    port = free_port()
    node_dir = workdir / str(port)
    node_dir.mkdir()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(node_dir), *extra],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509
    )  # fmt: skip
    for _ in range(200):
        if (
            subprocess.run(
                ["redis-cli", "-p", str(port), "ping"], check=False, capture_output=True, text=True
            ).stdout.strip()
            == "PONG"
        ):
            return port, proc
        time.sleep(0.05)
    stop(proc)
    raise SystemExit(f"redis-server on {port} did not start")


@contextmanager
def servers(masters: int) -> Iterator[tuple[str, list[subprocess.Popen[bytes]]]]:
    """One plain Redis (masters=1) or a cluster of ``masters``; (redis_url, processes)."""
    workdir = Path(tempfile.mkdtemp(prefix="gwl-bench-cluster-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        if masters == 1:
            port, proc = start_server(workdir)
            procs.append(proc)
            yield f"redis://127.0.0.1:{port}/0", procs
            return
        ports = []
        for _ in range(masters):
            cluster = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
            cluster += ["--cluster-port", str(free_port())]
            port, proc = start_server(workdir, *cluster)
            ports.append(port)
            procs.append(proc)
        addresses = [f"127.0.0.1:{p}" for p in ports]
        subprocess.run(
            ["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", "0",
             "--cluster-yes"], check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        for port in ports:
            for _ in range(200):
                info = subprocess.run(
                    ["redis-cli", "-p", str(port), "cluster", "info"],
                    check=False,
                    capture_output=True,
                    text=True,
                ).stdout
                if "cluster_state:ok" in info:
                    break
                time.sleep(0.05)
        yield "redis+cluster://" + ",".join(addresses), procs
    finally:
        for proc in procs:
            stop(proc)
        shutil.rmtree(workdir, ignore_errors=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
