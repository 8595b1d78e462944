"""Real servers for the deployment recipes (examples/deploy/): start one on a free port,
ask it over loopback, find its worker processes, and read ``gateway-limiter fleet``."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "examples" / "deploy"
BIN = Path(sys.executable).parent


def limiter_env(database_url: str, redis_url: str, key_prefix: str, **more: str) -> dict[str, str]:
    """The environment a recipe reads its settings from (docs/design.md#settings): short
    reloads, and patient Redis reads on a loaded host."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_LIMITER_")}
    env.update(
        GATEWAY_LIMITER_DATABASE_URL=database_url,
        GATEWAY_LIMITER_REDIS_URL=redis_url,
        GATEWAY_LIMITER_KEY_PREFIX=key_prefix,
        GATEWAY_LIMITER_RELOAD_INTERVAL="1",
        # long enough that a member found gone left, rather than lapsed (3 beats)
        GATEWAY_LIMITER_FLEET_HEARTBEAT="5",
        GATEWAY_LIMITER_REDIS_TIMEOUT="2",
        GATEWAY_LIMITER_REDIS_TIMEOUT_CEILING="2",
        GATEWAY_LIMITER_METRICS="false",
        GATEWAY_LIMITER_SETTINGS=os.devnull,  # no settings.toml from the checkout
        PYTHONUNBUFFERED="1",
    )
    env.update(more)
    return env


@dataclass
class Answer:
    """One request's answer: its status, headers (lower-case names) and JSON body."""

    status: int
    headers: dict[str, str]
    body: dict[str, object] | None
    sent_at: float  # time.monotonic() when the request left

    @property
    def limit(self) -> int | None:
        value = self.headers.get("x-ratelimit-limit")
        return None if value is None else int(value)

    @property
    def pid(self) -> int | None:
        pid = None if self.body is None else self.body.get("pid")
        return pid if isinstance(pid, int) else None


def ask(port: int, path: str) -> Answer:
    """GET ``path`` on its own connection (so any worker may take it)."""
    sent_at = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        response = conn.getresponse()
        raw = response.read()
        headers = {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    return Answer(response.status, headers, body if isinstance(body, dict) else None, sent_at)


#: Processes a server may start beside its workers (multiprocessing's own).
HELPERS = ("resource_tracker", "multiprocessing.forkserver")


@dataclass
class Served:
    """A server process (its whole process group) listening on ``port``."""

    process: subprocess.Popen[str]
    port: int
    log: Path

    def workers(self) -> set[int]:
        """The pids of the server's worker processes: its children that serve (not a
        multiprocessing resource tracker)."""
        return {
            pid
            for pid in children(self.process.pid)
            if "resource_tracker" not in cmdline(pid)
            and "multiprocessing.forkserver" not in cmdline(pid)
        }

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def children(pid: int) -> list[int]:
    found: list[int] = []
    with suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with suppress(OSError):
                found += [int(p) for p in (task / "children").read_text().split()]
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


@contextmanager
def serve(
    argv: list[str], env: dict[str, str], port: int, log: Path, workers: int
) -> Iterator[Served]:
    """Run ``argv`` (in the recipes' folder) until it listens on ``port`` and has
    ``workers`` worker processes; stop it (SIGTERM, then SIGKILL) afterwards."""
    with log.open("w") as out:
        process = subprocess.Popen(
            argv, cwd=RECIPES, env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
    served = Served(process, port, log)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, f"{argv[0]} exited:\n{served.output()}"
            assert time.monotonic() < deadline, f"{argv[0]} did not come up:\n{served.output()}"
            if len(served.workers()) == workers and _listening(port):
                with suppress(OSError):
                    if ask(port, "/health").status < 500:
                        break
            time.sleep(0.1)
        yield served
    finally:
        stop(process)


def stop(process: subprocess.Popen[str]) -> None:
    """Stop a server as its operator would: SIGTERM to its main process, which stops its
    workers gracefully; whatever is left of its process group after 20 s is killed."""
    with suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def fleet_pids(env: dict[str, str]) -> set[int]:
    """The pids ``gateway-limiter fleet`` lists (its table's pid column)."""
    done = subprocess.run(
        [str(BIN / "gateway-limiter"), "fleet"], env={**env, "COLUMNS": "200"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    count = re.match(r"fleet: (\d+) live process", lines[0])
    assert count is not None, done.stdout
    host = socket.gethostname()
    pids = {
        int(m[1]) for line in lines[1:] if (m := re.search(rf"{re.escape(host)}\s+(\d+)", line))
    }
    assert len(pids) == int(count[1]), done.stdout
    return pids


def poll(check: object, timeout_s: float, every_s: float = 0.1) -> bool:
    """Call ``check`` until it returns True or ``timeout_s`` pass; its last answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check():  # type: ignore[operator]
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(every_s)


#: One answer from a worker: when its request left (monotonic s), the worker's pid
#: (None: not said) and the limit it decided by (None: not said).
Seen = tuple[float, int | None, int | None]


def reached_by(
    workers: set[int], new_limit: int, ask_batch: Callable[[], Iterable[Seen]], timeout_s: float
) -> float:
    """Ask batches until every worker has answered with ``new_limit``; how long after the
    start the last answer with another limit was asked for (0.0: none was). Fails the
    test when some worker has not followed within ``timeout_s``."""
    started = time.monotonic()
    followed: set[int] = set()
    last_old = started
    while followed != workers:
        assert time.monotonic() - started < timeout_s, (followed, workers)
        for sent_at, pid, limit in ask_batch():
            if limit == new_limit and pid is not None:
                followed.add(pid)
            elif limit is not None and limit != new_limit:
                last_old = max(last_old, sent_at)
    return last_old - started
