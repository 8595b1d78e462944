#!/usr/bin/env python
"""How exactly each algorithm keeps an interface to its rate, under overload and after idle.

Run from the checkout (``bench/accuracy`` runs this with the venv's Python)::

    bench/accuracy                      # full run, about 90 s; writes docs/accuracy.png
    bench/accuracy --quick              # smoke run, about 30 s; plot to a temporary file
    bench/accuracy --redis-url redis://127.0.0.1:6379/0   # an existing Redis
    python bench/accuracy.py ...        # the same, with any Python that has the package

The plot needs matplotlib (``pip install matplotlib``); without it the tables are
printed and the plot is skipped with a message.

One interface per algorithm, each a row of a temporary SQLite table: ``rateLimit`` 50,
``cache`` 0.2 s; ``token_bucket`` with the default capacity (maxPermits NULL: 50),
``warm_up`` with ``warmupPeriod`` 3 s, ``sliding_window``. Bucket state lives in one
Redis: by default a private ``redis-server`` this script starts on a free port and
stops on exit, Ctrl-C included.

For each algorithm in turn, 4 processes x 8 threads (``--quick``: 2 x 8) call
``GatewayLimiter.try_acquire(url)``, which waits up to the row's cache for a permit:

- overload, 10 s: demand is exactly 5 x the rate (250 arrivals/s), as evenly spaced
  arrivals (one every 4 ms, the processes' arrivals interleaved). Each process's
  threads are its worker pool: the next free thread takes the next arrival, sleeps
  until it is due and calls ``try_acquire``. While every thread of a process is waiting
  for a permit, its arrivals queue and are attempted late, at once; an arrival still
  waiting for a thread when the phase ends is counted as unsent, never attempted;
- idle, 5 s: nobody calls (a token bucket refills, a warm-up bucket goes cold: it
  needs ``warmupPeriod`` = 3 s; a sliding window empties after 1 s);
- overload again, 10 s.

Every process records, with ``time.time()`` (one host: one clock for all processes),
when each attempt started and when it returned, after the wait. Admitted calls count
at the time they returned: the moment the supplier would see them.
"""

from __future__ import annotations

import argparse
import bisect
import datetime as dt
import itertools
import logging
import math
import multiprocessing as mp
import os
import platform
import queue
import shlex
import signal
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Sequence
from contextlib import ExitStack, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import redis

# Run as a script from anywhere: the checkout's package wins over any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import report as text
from bench.harness.args import description, reachable_redis
from bench.harness.limiters import write_rows
from bench.harness.report import cpu_model, load_average
from bench.harness.runs import ErrorLog, delete_keys, raise_interrupt
from bench.harness.servers import private_redis
from bench.harness.stats import max_in_window, percentile
from gateway_limiter import GatewayLimiter
from gateway_limiter.config.rules import Algorithm

#: The algorithms this run measures and docs/algorithms.md reports (fixed_window's
#: per-window count needs no overload run to show; its boundary is in the docs).
ALGORITHMS = (Algorithm.TOKEN_BUCKET, Algorithm.WARM_UP, Algorithm.SLIDING_WINDOW)

CHECKOUT = Path(__file__).resolve().parent.parent
RATE = 50
CACHE = 0.2
WARMUP = 3.0
#: Attempts per second offered in all, as a multiple of the rate.
DEMAND = 5.0
BIN = 0.1  # seconds per bar of the plot
DEFAULT_PLOT = CHECKOUT / "docs" / "accuracy.png"
#: How long children may take to start (spawn, import, connect) before the run gives up.
START_TIMEOUT = 60.0
#: Between the end of one algorithm's run and the next (late waiters finish).
GAP = 1.0


def url_of(algorithm: str) -> str:
    """The benchmark's interface for ``algorithm``."""
    return f"/bench/accuracy/{algorithm}"


@dataclass(frozen=True)
class Plan:
    """Phase lengths and the fleet's size."""

    busy: float  # seconds of each overload phase
    idle: float  # seconds of idle between them
    processes: int
    threads: int  # per process

    @property
    def span(self) -> float:
        """Seconds one algorithm's run takes."""
        return 2 * self.busy + self.idle

    def phases(self, start: float) -> list[tuple[float, float]]:
        """The two overload phases of a run starting at ``start`` (wall time)."""
        second = start + self.busy + self.idle
        return [(start, start + self.busy), (second, second + self.busy)]


FULL = Plan(busy=10.0, idle=5.0, processes=4, threads=8)
# idle = warmupPeriod: just long enough for the warm-up bucket to be cold again.
QUICK = Plan(busy=2.0, idle=3.0, processes=2, threads=8)


# --------------------------------------------------------------------------- the table


def make_table(workdir: Path) -> str:
    """A SQLite table with one enabled row per algorithm; its URL."""
    database_url = f"sqlite:///{workdir / 'limits.db'}"
    rows = {
        url_of(algorithm): {
            "rate_limit": RATE,
            "cache": CACHE,
            "algorithm": algorithm,
            "warmup_period": WARMUP if algorithm == Algorithm.WARM_UP else None,
        }
        for algorithm in ALGORITHMS
    }
    write_rows(database_url, rows)
    return database_url


# --------------------------------------------------------------------------- one process


@dataclass(frozen=True)
class Job:
    """What one child process does: its place in the fleet, and where things are."""

    index: int
    plan: Plan
    database_url: str
    redis_url: str
    key_prefix: str


#: One attempt: (algorithm index, phase 0/1, started, returned, admitted), wall times.
Attempt = tuple[int, int, float, float, bool]


def child(job: Job, ready: Any, go: Any, start: Any, results: Any) -> None:
    """A gateway process: a limiter of its own, ``plan.threads`` threads on a schedule."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    try:
        errors = ErrorLog()
        logging.getLogger("gateway_limiter").addHandler(errors)
        limiter = GatewayLimiter(
            database_url=job.database_url,
            redis_url=job.redis_url,
            key_prefix=job.key_prefix,
            reload_interval=3600,  # no reload may land inside the run
            on_backend_error="deny",  # a Redis error is a refusal, counted, never hidden
        )
        summary = limiter.start()
        if summary.rules != len(ALGORITHMS):
            raise RuntimeError(f"loaded {summary} instead of the benchmark's rows")
        ready.put(job.index)
        if not go.wait(START_TIMEOUT):
            return
        attempts, unsent = run_schedule(limiter, job, start.value)
        limiter.close()
        results.put((job.index, attempts, unsent, errors.count, None))
    except BaseException:
        results.put((job.index, [], {}, 0, traceback.format_exc()))


#: Arrivals that found every thread busy until their phase ended, per (algorithm, phase).
Unsent = dict[tuple[int, int], int]


def run_schedule(limiter: GatewayLimiter, job: Job, start: float) -> tuple[list[Attempt], Unsent]:
    """This process's share of the arrivals, for every algorithm in turn."""
    attempts: list[Attempt] = []
    unsent: Unsent = {}
    for a, algorithm in enumerate(ALGORITHMS):
        for p, (begin, end) in enumerate(job.plan.phases(run_start(start, job.plan, a))):
            made, unsent[a, p] = run_phase(limiter, job, url_of(algorithm), begin, end)
            attempts.extend((a, p, *x) for x in made)
    return attempts, unsent


def run_phase(
    limiter: GatewayLimiter, job: Job, url: str, begin: float, end: float
) -> tuple[list[tuple[float, float, bool]], int]:
    """One overload phase: arrivals at DEMAND x rate over the fleet, taken by free threads.

    Arrival k of this process is due at ``begin + (k x processes + index) / (DEMAND x
    rate)``, so the processes' arrivals interleave evenly. The next free thread takes
    the next arrival, sleeps until it is due (at once if late), and calls try_acquire.
    Returns (started, returned, admitted) per attempt, and how many arrivals were never
    attempted because every thread was busy until the phase ended.
    """
    plan = job.plan
    step = plan.processes / (DEMAND * RATE)
    arrivals = itertools.count(job.index / plan.processes)  # the interleave, in steps
    take = threading.Lock()
    made: list[tuple[float, float, bool]] = []
    unsent = [0]

    def worker() -> None:
        while True:
            with take:
                due = begin + next(arrivals) * step
            if due >= end:
                return
            if (ahead := due - time.time()) > 0:
                time.sleep(ahead)
            elif time.time() >= end:
                with take:
                    unsent[0] += 1
                continue
            started = time.time()
            admitted = limiter.try_acquire(url)
            made.append((started, time.time(), admitted))  # list.append is atomic

    threads = [
        threading.Thread(target=worker, name=f"caller-{t}", daemon=True)
        for t in range(plan.threads)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return made, unsent[0]


def run_start(start: float, plan: Plan, a: int) -> float:
    """Wall time at which algorithm number ``a`` starts."""
    return start + a * (plan.span + GAP)


# --------------------------------------------------------------------------- the fleet


def run_fleet(job: Job, stack: ExitStack) -> tuple[float, list[Attempt], Unsent, int]:
    """Start the children, start them together, collect what they saw."""
    ctx = mp.get_context("spawn")  # children share nothing with this process
    ready, results = ctx.Queue(), ctx.Queue()
    go, start = ctx.Event(), ctx.Value("d", 0.0)
    procs = []
    for i in range(job.plan.processes):
        p = ctx.Process(
            target=child,
            args=(replace(job, index=i), ready, go, start, results),
            name=f"gateway-{i}",
            daemon=True,
        )
        p.start()
        procs.append(p)
    stack.callback(_reap, procs)
    waiting = set(range(job.plan.processes))
    deadline = time.monotonic() + START_TIMEOUT
    while waiting:
        try:
            waiting.discard(ready.get(timeout=0.2))
        except queue.Empty:
            _check_alive(procs, results)
            if time.monotonic() > deadline:
                raise SystemExit("gateway processes did not start in time") from None
    begin = math.ceil(time.time()) + 1.0  # a whole second: easier to read the plot
    start.value = begin
    go.set()
    total = len(ALGORITHMS) * (job.plan.span + GAP)
    print(f"running {total:.0f} s ...", flush=True)
    attempts: list[Attempt] = []
    unsent: Unsent = {}
    errors = 0
    for _ in procs:
        _index, mine, lost, errs, failure = results.get(timeout=total + START_TIMEOUT)
        if failure:
            raise SystemExit(f"a gateway process failed:\n{failure}")
        attempts.extend(mine)
        for key, n in lost.items():
            unsent[key] = unsent.get(key, 0) + n
        errors += errs
    return begin, attempts, unsent, errors


def _check_alive(procs: Sequence[Any], results: Any) -> None:
    for p in procs:
        if p.exitcode is not None:
            with suppress(queue.Empty):
                failure = results.get_nowait()[-1]
                raise SystemExit(f"a gateway process failed:\n{failure}")
            raise SystemExit(f"gateway process {p.name} exited with {p.exitcode}")


def _reap(procs: Sequence[Any]) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
        p.join(5)


# --------------------------------------------------------------------------- analysis


@dataclass(frozen=True)
class Phase:
    """One overload phase of one algorithm, as the supplier would have seen it."""

    algorithm: str
    number: int  # 1 or 2
    begin: float
    end: float
    attempts: int
    unsent: int  # arrivals never attempted: every thread was busy until the phase ended
    admitted: list[float]  # return times of admitted calls, sorted (every one, even late)
    waits: list[float]  # seconds from attempt to return, admitted calls
    refused: int

    @property
    def within(self) -> int:
        """Admitted calls that returned inside the phase."""
        return sum(self.begin <= t < self.end for t in self.admitted)

    @property
    def utilisation(self) -> float:
        """Admitted inside the phase / (rate x phase length)."""
        return self.within / (RATE * (self.end - self.begin))

    @property
    def max_1s(self) -> float:
        """The most admitted in any 1 s window / rate."""
        return max_in_window(self.admitted) / RATE

    def second(self, n: int) -> float:
        """Admitted in second ``n`` (0-based) of the phase / rate."""
        lo = self.begin + n
        return sum(lo <= t < lo + 1 for t in self.admitted) / RATE

    def ramp_end(self) -> float:
        """Seconds into the phase until admissions reach the rate: the end of the last run
        of 10 admissions spaced more than 10 % above the stable interval (NaN: not
        reached before the phase ended)."""
        span, slow = 10, 1.1 / RATE
        ts = [t for t in self.admitted if t < self.end]
        ends = [i + span for i in range(len(ts) - span) if ts[i + span] - ts[i] > span * slow]
        if not ends:
            return 0.0
        if ends[-1] == len(ts) - 1:
            return math.nan
        return ts[ends[-1]] - self.begin


def phases(begin: float, plan: Plan, attempts: Sequence[Attempt], unsent: Unsent) -> list[Phase]:
    """The attempts sorted into each algorithm's two phases."""
    out = []
    for a, algorithm in enumerate(ALGORITHMS):
        for p, (lo, hi) in enumerate(plan.phases(run_start(begin, plan, a))):
            mine = [x for x in attempts if x[0] == a and x[1] == p]
            ok = [x for x in mine if x[4]]
            out.append(
                Phase(
                    algorithm,
                    p + 1,
                    lo,
                    hi,
                    len(mine),
                    unsent.get((a, p), 0),
                    sorted(x[3] for x in ok),
                    [x[3] - x[2] for x in ok],
                    len(mine) - len(ok),
                )
            )
    return out


# --------------------------------------------------------------------------- report


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table with the algorithm and phase columns left-aligned."""
    return text.table(headers, rows, left=2)


def fmt(value: float, spec: str = ".2f") -> str:
    """A number, or - for NaN."""
    return text.fmt(value, spec, missing="-")


def machine_facts(redis_url: str, private: bool, plan: Plan, quick: bool) -> list[str]:
    """The lines that say where, with what and how the numbers were measured."""
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        version = client.info("server").get("redis_version")
    finally:
        client.close()
    cpu = cpu_model()
    where = "private, started by this run" if private else "existing, --redis-url"
    fleet = plan.processes * plan.threads
    return [
        f"date:     {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        f"command:  {shlex.join(['python', *sys.argv])}",
        f"machine:  nproc {os.cpu_count()}, {cpu}, {platform.system()} {platform.release()}",
        f"python:   {platform.python_implementation()} {platform.python_version()}; "
        f"redis-server {version} ({where}); load {load_average()}",
        f"rows:     rateLimit {RATE}, cache {CACHE:g} s; token_bucket maxPermits NULL "
        f"(capacity {RATE}); warm_up warmupPeriod {WARMUP:g} s; sliding_window",
        f"demand:   {DEMAND:g} x rate = {DEMAND * RATE:g} arrivals/s, evenly spaced, taken by "
        f"{plan.processes} processes x {plan.threads} threads ({fleet} callers)",
        f"phases:   {plan.busy:g} s overload, {plan.idle:g} s idle, {plan.busy:g} s overload, "
        f"per algorithm in turn" + (" (--quick)" if quick else ""),
    ]


def report(runs: Sequence[Phase], errors: int) -> list[str]:
    """The results table, the after-idle table, and the targets."""
    rows = [
        [
            ph.algorithm,
            f"{ph.number}",
            f"{ph.attempts}",
            f"{ph.unsent}",
            f"{len(ph.admitted)}",
            f"{ph.refused}",
            fmt(ph.utilisation),
            fmt(ph.max_1s),
            fmt(ph.second(0)),
            fmt(percentile(ph.waits, 0.5) * 1000, ".0f"),
            fmt(percentile(ph.waits, 0.95) * 1000, ".0f"),
            fmt(percentile(ph.waits, 0.99) * 1000, ".0f"),
        ]
        for ph in runs
    ]
    headers = ["algorithm", "phase", "attempts", "unsent", "admitted", "refused", "util"]
    headers += ["max1s/r"]
    headers += ["1st s/r", "wait p50", "p95", "p99 ms"]
    lines = [table(headers, rows)]
    lines.append(
        "unsent: arrivals no thread was free to attempt before the phase ended. admitted: "
        "every admitted\nattempt of the phase, with those whose wait ended after it. util: "
        "admitted that returned\nwithin the phase / (rate x phase). max1s/r: most admitted "
        "in any sliding 1 s window / rate.\n1st s/r: admitted in the phase's first second / "
        "rate. wait: from the attempt to try_acquire\nreturning, admitted calls. Phase 1 "
        "starts on a fresh bucket, phase 2 after the idle spell."
    )
    if errors:
        lines.append(f"Redis errors: the circuit breaker opened {errors} time(s) (refused)")
    lines.append("")
    busy = runs[0].end - runs[0].begin
    seconds = min(5, int(busy))
    after = [
        [
            ph.algorithm,
            *(fmt(ph.second(n)) for n in range(seconds)),
            fmt(ph.ramp_end(), ".1f") if ph.algorithm == Algorithm.WARM_UP else "-",
        ]
        for ph in runs
        if ph.number == 2
    ]
    lines.append("After idle (phase 2): admitted per second / rate")
    lines.append(
        table(["algorithm", *(f"{n}-{n + 1} s" for n in range(seconds)), "at rate from s"], after)
    )
    lines.append(
        "at rate from: warm_up only, seconds into the phase after which every 10 "
        "consecutive admissions\nare spaced at most 10 % above the stable interval "
        f"(warmupPeriod {WARMUP:g} s)."
    )
    lines.append("")
    lines.extend(targets(runs))
    return lines


def targets(runs: Sequence[Phase]) -> list[str]:
    """Each accuracy target against the numbers, met or missed."""
    by = {(ph.algorithm, ph.number): ph for ph in runs}

    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    sw = [by[Algorithm.SLIDING_WINDOW, n] for n in (1, 2)]
    sw_max = max(ph.max_1s for ph in sw)
    sw_util = min(ph.utilisation for ph in sw)
    wu = by[Algorithm.WARM_UP, 2]
    ramp = wu.ramp_end()
    tb = [by[Algorithm.TOKEN_BUCKET, n] for n in (1, 2)]
    tb_max = max(ph.max_1s for ph in tb)
    tb_bound = (RATE + RATE) / RATE  # capacity + rate in the worst second
    return [
        "Targets:",
        f"  sliding_window  max1s/r {sw_max:.2f} <= 1.00: {verdict(sw_max <= 1.0)}; "
        f"util {sw_util:.2f} >= 0.95: {verdict(sw_util >= 0.95)}",
        f"  warm_up         first second after idle {wu.second(0):.2f} x rate <= ~0.5: "
        f"{verdict(wu.second(0) <= 0.55)}; at the rate from {fmt(ramp, '.1f')} s <= "
        f"warmupPeriod {WARMUP:g} s: "
        + (
            verdict(ramp <= WARMUP + 0.1)
            if wu.end - wu.begin > WARMUP + 1
            else "not measured (the phase is shorter than warmupPeriod + 1 s)"
        ),
        f"  token_bucket    max1s/r {tb_max:.2f} <= (capacity + rate) / rate = "
        f"{tb_bound:.2f}: {verdict(tb_max <= tb_bound)}",
    ]


def plot(runs: Sequence[Phase], begin: float, plan: Plan, path: Path) -> str:
    """Admitted calls per 100 ms, one panel per algorithm; returns what happened."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot (pip install matplotlib)"
    bins = math.ceil((plan.span + GAP / 2) / BIN)
    top = DEMAND * RATE * BIN * 1.15  # every arrival of 100 ms admitted at once, and room
    fig, axes = plt.subplots(len(ALGORITHMS), 1, figsize=(12, 8), sharex=True)
    for a, (ax, algorithm) in enumerate(zip(axes, ALGORITHMS, strict=True)):
        zero = run_start(begin, plan, a)
        times = sorted(t - zero for ph in runs if ph.algorithm == algorithm for t in ph.admitted)
        counts = [0] * bins
        for t in times:
            if 0 <= t < bins * BIN:
                counts[int(t / BIN)] += 1
        edges = [i * BIN for i in range(bins + 1)]
        ax.stairs(
            counts, edges, fill=True, color="tab:blue", alpha=0.7, label="admitted per 100 ms"
        )
        ax.axhline(RATE * BIN, color="tab:red", ls="--", lw=1, label=f"rate: {RATE}/s")
        ax.axvspan(plan.busy, plan.busy + plan.idle, color="0.92", label="idle")
        # The trailing 1 s count / rate: what the supplier's "per second" counter sees.
        grid = [i * 0.01 for i in range(int(bins * BIN / 0.01) + 1)]
        twin = ax.twinx()
        twin.plot(
            grid,
            [_trailing(times, t) / RATE for t in grid],
            color="tab:orange",
            lw=1.2,
            label="admitted in the last 1 s / rate (right)",
        )
        # One scale for both axes: the rate line is 1.0 on the right.
        ax.set_ylim(0, top)
        twin.set_ylim(0, top / (RATE * BIN))
        twin.set_ylabel("last 1 s / rate", color="tab:orange")
        ax.set_ylabel("per 100 ms")
        ax.set_title(_panel_title(algorithm), loc="left", fontsize=10)
        if a == 0:
            handles = ax.get_legend_handles_labels()
            more = twin.get_legend_handles_labels()
            ax.legend(handles[0] + more[0], handles[1] + more[1], loc="upper right", fontsize=8)
    axes[-1].set_xlabel("seconds since the first overload phase began")
    fig.suptitle(
        f"Admitted calls per 100 ms at {DEMAND:g} x the rate ({plan.processes} processes x "
        f"{plan.threads} threads, rateLimit {RATE}, cache {CACHE:g} s)",
        fontsize=11,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"plot: {path}"


def _trailing(times: Sequence[float], t: float) -> int:
    """How many of ``times`` (sorted) fall in (t - 1, t]."""
    return bisect.bisect_right(times, t) - bisect.bisect_right(times, t - 1.0)


def _panel_title(algorithm: str) -> str:
    titles: dict[str, str] = {
        Algorithm.TOKEN_BUCKET: f"token_bucket (capacity {RATE}): a burst of capacity + rate, "
        "then the rate",
        Algorithm.WARM_UP: f"warm_up (warmupPeriod {WARMUP:g} s): a third of the rate when cold, "
        "ramping up to it",
        Algorithm.SLIDING_WINDOW: "sliding_window: never more than the rate in any 1 s window",
    }
    return titles[algorithm]


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 2 s phases, 2 processes x 8 threads"
    )
    parser.add_argument(
        "--redis-url",
        help="use this Redis instead of a private redis-server (the run's keys are "
        "deleted afterwards)",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        help=f"where to write the PNG (default: {DEFAULT_PLOT.relative_to(CHECKOUT)}, "
        "or a temporary file with --quick)",
    )
    parser.add_argument("--no-plot", action="store_true", help="skip the plot")
    return parser.parse_args(argv)


def run(args: argparse.Namespace, stack: ExitStack) -> None:
    """Set up, run the fleet, print the report, draw the plot."""
    plan = QUICK if args.quick else FULL
    run_id = uuid.uuid4().hex[:8]
    redis_url = args.redis_url or stack.enter_context(private_redis())
    prefix = f"gwlacc{run_id}"
    if args.redis_url:
        stack.callback(_delete_keys, redis_url, prefix)
    workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gwl-accuracy-")))
    for line in machine_facts(redis_url, not args.redis_url, plan, args.quick):
        print(line)
    print(flush=True)
    job = Job(-1, plan, make_table(workdir), redis_url, prefix)
    begin, attempts, unsent, errors = run_fleet(job, stack)
    runs = phases(begin, plan, attempts, unsent)
    print()
    print("\n".join(report(runs, errors)))
    if args.no_plot:
        return
    path = args.plot or (
        Path(tempfile.gettempdir()) / "gwl-accuracy-quick.png" if args.quick else DEFAULT_PLOT
    )
    print(plot(runs, begin, plan, path))


def _delete_keys(redis_url: str, prefix: str) -> None:
    """On a shared Redis, remove every key this run made."""
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        delete_keys(client, f"{prefix}:*")
    finally:
        client.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; 0 when done, 130 when interrupted."""
    args = parse_args(argv)
    if args.redis_url:
        reachable_redis(args.redis_url)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s: %(message)s")
    signal.signal(signal.SIGTERM, raise_interrupt)  # `kill` cleans up like Ctrl-C
    began = time.monotonic()
    try:
        with ExitStack() as stack:  # stops the children, then redis-server
            run(args, stack)
    except KeyboardInterrupt:
        print("\ninterrupted; cleaned up", file=sys.stderr)
        return 130
    print(f"(run took {time.monotonic() - began:.0f} s; load average now {load_average()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
