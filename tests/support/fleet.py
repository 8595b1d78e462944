"""A fleet of real gateway processes for the fault and soak tests.

``Fleet`` starts N processes (``python -m tests.support.fleet CONFIG``), each with a
``GatewayLimiter`` and T threads calling ``try_acquire(url, timeout=0)`` in a loop,
releases them at one wall-clock instant, and collects what each saw. A worker
records which decisions the failure policy made (not Redis), so a test can bound
what Redis admitted and what the policy admitted separately.

Two kinds of report: ``calls`` (every call: start, latency, admitted, by the policy,
url), for short fault runs; ``totals`` (counts, the slowest call, RSS once a second),
for a soak, whose memory must not grow with what it records.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from gateway_limiter import GatewayLimiter
from gateway_limiter.backends.memory import MemoryBackend
from gateway_limiter.config.rules import Rule
from gateway_limiter.core.clock import Clock
from gateway_limiter.core.failure import Breaker, Policy
from gateway_limiter.model.bucket import Verdict

ROOT = Path(__file__).parents[2]


@dataclass
class WorkerConfig:
    """What one worker process does (JSON on its command line)."""

    database_url: str
    redis_url: str
    key_prefix: str
    urls: list[str]
    seconds: float
    threads: int = 4
    #: Seconds a thread sleeps between calls (0: as fast as it can).
    pause: float = 0.002
    #: Calls a thread starts per second, on a fixed schedule (0: ``pause`` instead);
    #: demand that does not depend on how fast the host runs the threads.
    paced: float = 0.0
    report: str = "calls"  # or "totals"
    settings: dict[str, Any] = field(default_factory=dict)


class RecordingPolicy(Policy):
    """The failure policy, noting in the calling thread that it decided."""

    __slots__ = ("mark",)

    def __init__(self, name: str) -> None:
        super().__init__(name, MemoryBackend)
        self.mark = threading.local()

    def reserve(
        self,
        rule: Rule,
        permits: int,
        timeout_s: float | None,
        key: str | None = None,
        whole: Rule | None = None,
    ) -> Verdict:
        """Decide as the policy does, and say so."""
        self.mark.decided = True
        return super().reserve(rule, permits, timeout_s, key, whole)


class RecordingBreaker(Breaker):
    """The breaker, noting why it opened: (time.time(), the error) at each failure."""

    __slots__ = ("failures",)

    def __init__(self, open_s: float, clock: Clock) -> None:
        super().__init__(open_s, clock)
        self.failures: list[tuple[float, str]] = []

    def failed(self, error: BaseException) -> None:
        """Note the failure, then open as the breaker does."""
        self.failures.append((time.time(), f"{type(error).__name__}: {error}"))
        super().failed(error)


def rss_bytes() -> int:
    """This process's resident set size now."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Totals:
    """Per URL: admitted by Redis, admitted by the policy, refused; the policy's
    decisions' first and last times (per outage); the slowest call; errors."""

    def __init__(self, urls: list[str]) -> None:
        self.lock = threading.Lock()
        self.by_url = {u: {"redis": 0, "policy": 0, "refused": 0, "calls": 0} for u in urls}
        #: url -> runs of the policy's admissions: [first, last] times
        self.policy_windows: dict[str, list[list[float]]] = {u: [] for u in urls}
        self.slowest = 0.0
        self.errors: list[str] = []

    def add(self, url: str, started: float, took: float, ok: bool, by_policy: bool) -> None:
        with self.lock:
            counts = self.by_url[url]
            counts["calls"] += 1
            counts["refused" if not ok else "policy" if by_policy else "redis"] += 1
            self.slowest = max(self.slowest, took)
            if by_policy and ok:
                # a run of admissions: [first start, last end]; decisions fall inside
                w = self.policy_windows[url]
                if w and started - w[-1][1] < 0.5:
                    w[-1][1] = max(w[-1][1], started + took)
                else:
                    w.append([started, started + took])


def work(config: WorkerConfig) -> dict[str, Any]:
    """Run the calls; the report as a dict."""
    settings = {"reload_interval": 3600.0} | config.settings
    lim = GatewayLimiter(
        database_url=config.database_url,
        redis_url=config.redis_url,
        key_prefix=config.key_prefix,
        **settings,
    )
    policy = RecordingPolicy(lim.settings.on_backend_error)
    lim.policy = policy
    breaker = RecordingBreaker(lim.settings.breaker_seconds, lim.clock)
    lim._breaker = breaker
    lim.start()
    print("ready", flush=True)
    start_at = float(sys.stdin.readline())
    # real time: the fleet's callers start at one moment
    time.sleep(max(0.0, start_at - time.time()))
    end_at = start_at + config.seconds
    calls: list[tuple[float, float, bool, bool, int]] = []
    totals = Totals(config.urls)
    rss: list[tuple[float, int]] = []
    #: (time, the fleet size this process knew), about once a second
    fleet_sizes: list[tuple[float, int]] = []
    stop = threading.Event()

    def caller(n: int) -> None:
        i = n
        mark = policy.mark
        # paced threads start spread over one interval, so a process's calls interleave
        next_at = start_at + (n / config.threads / config.paced if config.paced else 0.0)
        while True:
            if config.paced:
                time.sleep(max(0.0, next_at - time.time()))
                next_at += 1.0 / config.paced
            if time.time() >= end_at:
                return
            url_index = i % len(config.urls)
            url = config.urls[url_index]
            i += 1
            mark.decided = False
            # Both ends on one clock, read just around the call: the decision lies within
            # [started, started + took] however long the thread waits for the GIL or a
            # CPU. (A start read earlier, with the duration timed from later, shifted
            # that interval early on a loaded host, and counts of what a limit admitted
            # "within one second" saw calls decided after it.)
            started = time.time()
            try:
                ok = lim.try_acquire(url, timeout=0)
            except Exception as e:  # the failure these tests look for
                totals.errors.append(f"{type(e).__name__}: {e}")
                continue
            took = time.time() - started
            if config.report == "calls":
                calls.append((started, took, ok, mark.decided, url_index))  # list.append: atomic
            else:
                totals.add(url, started, took, ok, mark.decided)
            if config.pause and not config.paced:
                time.sleep(config.pause)

    def sampler() -> None:
        while True:
            fleet_sizes.append((time.time(), lim.fleet_size))
            if stop.wait(1.0):
                return
            rss.append((time.time(), rss_bytes()))

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(config.threads)]
    watcher = threading.Thread(target=sampler, daemon=True)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    lim.close()
    return {
        "pid": os.getpid(),
        "calls": calls,
        "totals": totals.by_url,
        "policy_windows": totals.policy_windows,
        "slowest": totals.slowest,
        "errors": totals.errors,
        "failures": breaker.failures,
        "fallbacks": lim.backend_fallbacks,
        "rss": rss,
        "fleet_sizes": fleet_sizes,
        "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }


class Fleet:
    """N worker processes, started together; ``results()`` waits for their reports.

    ``threads``: each process's own thread count (default: ``config.threads`` for all),
    for a fleet whose demand is uneven."""

    def __init__(
        self, config: WorkerConfig, processes: int, threads: list[int] | None = None
    ) -> None:
        self.config = config
        env = os.environ | {"PYTHONPATH": str(ROOT)}
        each = threads if threads is not None else [config.threads] * processes
        assert len(each) == processes, f"{len(each)} thread counts for {processes} processes"
        self.procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.support.fleet",
                    json.dumps(asdict(replace(config, threads=n))),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
                cwd=ROOT,
            )
            for n in each
        ]
        self.start_at = 0.0

    def start(self, delay: float = 0.3) -> float:
        """Wait until every process is ready, release them together; the start time."""
        for p in self.procs:  # imports and start() can take seconds on a loaded host
            assert p.stdout is not None
            line = p.stdout.readline().strip()
            assert line == "ready", f"worker {p.pid} said {line!r}"
        self.start_at = time.time() + delay
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(f"{self.start_at}\n")
            p.stdin.close()
        return self.start_at

    def results(self, timeout: float = 120) -> list[dict[str, Any]]:
        """Each process's report (all exited 0)."""
        outputs = []
        for p in self.procs:
            assert p.stdout is not None
            outputs.append(p.stdout.read())
            p.wait(timeout)
            assert p.returncode == 0, f"worker {p.pid} exited {p.returncode}"
        return [json.loads(out) for out in outputs]

    def kill(self) -> None:
        """Stop every process still running (a failed test's cleanup)."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


if __name__ == "__main__":
    report = work(WorkerConfig(**json.loads(sys.argv[1])))
    print(json.dumps(report), flush=True)
