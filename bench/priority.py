#!/usr/bin/env python
"""Priority classes inside one cap: bookings before searches when the supplier's
capacity is short (docs/priority.md).

Run from the checkout::

    python bench/priority.py                      # 10 s per phase, a private Redis
    python bench/priority.py --seconds 1.5 --rounds 2 --calls 2000   # a smoke run
    python bench/priority.py --redis-url redis+cluster://127.0.0.1:7000
    python bench/priority.py --plot docs/priority.png

The rows (a temporary SQLite table): a channel cap of 100/s (``maxPermits`` 10) over
``/pri/search`` (``priority`` sheddable, ``cache`` 0) and ``/pri/book`` (``priority``
critical, ``cache`` 0.5), the channel row's ``reserve``
``default=0.1,sheddable_plus=0.3,sheddable=0.5``.

Four processes, each with threads that call ``try_acquire`` on a fixed schedule (open
loop: the offered rate does not bend to the answers), in three phases: searches offered
at 5x the cap with bookings at 0.2x, then with bookings at 1x, then searches alone.
Every admission is timed when the call returns. The figures: the share of bookings
admitted per phase, the most admitted in any 1 s (past the first second), the searches'
rate alone against the cap; then the Redis server time of one decision with a reserve
in play against one without (``INFO commandstats``, on a Redis of the run's own).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from bench.harness.args import description, positive_float, positive_int, reachable_redis
from bench.harness.limiters import started_limiter
from bench.harness.report import load_average, table
from bench.harness.servers import private_redis
from bench.harness.stats import max_in_window
from gateway_limiter.config.migrate import upgrade
from gateway_limiter.config.table import make_engine, upsert_conf

CAP = 100
SEARCH, BOOK = "/pri/search", "/pri/book"
CHANNEL = "PRI"
RESERVE = "default=0.1,sheddable_plus=0.3,sheddable=0.5"
PROCESSES = 4
#: (name, searches offered, bookings offered) as multiples of the cap
PHASES: list[tuple[str, float, float]] = [
    ("bookings 0.2x", 5.0, 0.2),
    ("bookings 1x", 5.0, 1.0),
    ("searches alone", 5.0, 0.0),
]
#: threads per process and class: enough that a booking waiting its turn (up to its
#: 0.5 s budget) does not hold up the schedule of the others
THREADS = {SEARCH: 4, BOOK: 6}


#: ``--leased``: one interface row that both classes call, with the reserve and a lease
#: of 100 ms (10 permits); the bucket keeps 40, 20 of them held back from searches
FARE = "/pri/fare"
LEASED_BURST = 40
#: each class's call in ``--leased`` runs: (url, priority, timeout)
LEASED_CALLS: dict[str, tuple[str, str, float]] = {
    SEARCH: (FARE, "sheddable", 0.0),
    BOOK: (FARE, "critical", 0.5),
}


def leased_rows() -> dict[str, dict[str, Any]]:
    """``--leased``: one token bucket row of the cap's rate with the reserve and a
    ``leaseMs``, that searches call as sheddable and bookings as critical."""
    return {
        FARE: {
            "rate_limit": CAP,
            "max_permits": LEASED_BURST,
            "reserve": RESERVE,
            "lease_ms": 100,
            "cache": 0.0,
        }
    }


def rows() -> dict[str, dict[str, Any]]:
    """The benchmark's rows, by URL (columns by their model names)."""
    return {
        "*": {"channel_type": CHANNEL, "rate_limit": CAP, "max_permits": 10, "reserve": RESERVE},
        SEARCH: {
            "channel_type": CHANNEL,
            "rate_limit": 100_000,
            "cache": 0.0,
            "priority": "sheddable",
        },
        BOOK: {
            "channel_type": CHANNEL,
            "rate_limit": 100_000,
            "cache": 0.5,
            "priority": "critical",
        },
    }


def write_rows(database_url: str, chosen: dict[str, dict[str, Any]]) -> None:
    """The tables at ``database_url`` with one enabled row per URL of ``chosen``."""
    engine = make_engine(database_url)
    try:
        upgrade(engine)
        for url, columns in chosen.items():
            upsert_conf(engine, url, status=1, **columns)
    finally:
        engine.dispose()


def _offer(
    limiter: Any,
    url: str,
    rate: float,
    start: float,
    seconds: float,
    got: list[tuple[float, bool]],
    leased: bool = False,
) -> None:
    """Call ``url`` at ``rate`` a second from ``start`` (wall clock) for ``seconds``
    (``leased``: the one leased row, in ``url``'s class)."""
    if rate <= 0:
        return
    interval = 1.0 / rate
    k = 0
    while True:
        at = start + k * interval
        if at >= start + seconds:
            return
        pause = at - time.time()
        if pause > 0:
            time.sleep(pause)
        if leased:
            fare, priority, timeout = LEASED_CALLS[url]
            admitted = limiter.try_acquire(fare, timeout=timeout, priority=priority)
        else:
            admitted = limiter.try_acquire(url)
        got.append((time.time(), admitted))
        k += 1


def worker(
    database_url: str,
    redis_url: str,
    prefix: str,
    seconds: float,
    out: str,
    sync: Any,
    leased: bool = False,
) -> None:
    """One gateway process: its share of every phase's demand, admissions to ``out``.
    ``sync``: (ready queue, go event, start time): the phases start once every process
    has its limiter loaded."""
    ready, go, when = sync
    with ExitStack() as stack:
        limiter = started_limiter(
            stack, database_url, redis_url, prefix, redis_timeout=1.0, on_backend_error="deny"
        )
        limiter.try_acquire(FARE if leased else SEARCH, priority="critical")  # connected
        ready.put(os.getpid())
        go.wait()
        start = when.value
        found: dict[str, list[tuple[float, bool, int]]] = {SEARCH: [], BOOK: []}
        threads = []
        for i, (_, search_x, book_x) in enumerate(PHASES):
            begin = start + i * seconds
            for url, multiple in ((SEARCH, search_x), (BOOK, book_x)):
                for n in range(THREADS[url]):
                    rate = multiple * CAP / PROCESSES / THREADS[url]
                    own: list[tuple[float, bool]] = []
                    # staggered: the threads of a process do not call in step
                    offset = n / (THREADS[url] * max(rate, 1e-9))
                    thread = threading.Thread(
                        target=_offer,
                        args=(limiter, url, rate, begin + offset, seconds, own, leased),
                    )
                    threads.append((url, i, own, thread))
        for *_, thread in threads:
            thread.start()
        for url, i, own, thread in threads:
            thread.join()
            found[url].extend((t, a, i) for t, a in own)
        leases = limiter._leases
        lease_calls = 0 if leases is None else leases.refills
    Path(out).write_text(json.dumps({"calls": found, "lease_calls": lease_calls}))


class Phase(NamedTuple):
    """What one phase came to."""

    name: str
    books_offered: int
    books_admitted: int
    searches_per_s: float
    books_per_s: float
    most_in_1s: int


class Result(NamedTuple):
    """A run: its phases, and each class's admissions (wall-clock times) for the plot."""

    start: float
    seconds: float
    phases: list[Phase]
    admitted: dict[str, list[float]]
    #: lease calls the processes sent (``--leased``; 0 otherwise), and decisions made
    lease_calls: int = 0
    decisions: int = 0


def measure(redis_url: str, seconds: float = 10.0, leased: bool = False) -> Result:
    """Run the three phases on ``redis_url`` with four processes (``leased``: on the one
    leased row, ``leased_rows``)."""
    prefix = f"gwlpri{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="gwl-bench-priority-") as workdir:
        database_url = f"sqlite:///{Path(workdir) / 'limits.db'}"
        write_rows(database_url, leased_rows() if leased else rows())
        outs = [str(Path(workdir) / f"p{i}.json") for i in range(PROCESSES)]
        spawn = multiprocessing.get_context("spawn")
        sync = (spawn.Queue(), spawn.Event(), spawn.Value("d", 0.0))
        procs = [
            spawn.Process(
                target=worker, args=(database_url, redis_url, prefix, seconds, o, sync, leased)
            )
            for o in outs
        ]
        for p in procs:
            p.start()
        for _ in procs:
            sync[0].get(timeout=120)
        start = sync[2].value = time.time() + 0.5
        sync[1].set()
        for p in procs:
            p.join()
            if p.exitcode != 0:
                raise SystemExit(f"a gateway process failed (exit {p.exitcode})")
        calls: dict[str, list[tuple[float, bool, int]]] = {SEARCH: [], BOOK: []}
        lease_calls = 0
        for out in outs:
            found = json.loads(Path(out).read_text())
            lease_calls += found["lease_calls"]
            for url, got in found["calls"].items():
                calls[url].extend((t, a, i) for t, a, i in got)
    admitted = {url: sorted(t for t, a, _ in got if a) for url, got in calls.items()}
    everything = sorted(admitted[SEARCH] + admitted[BOOK])
    phases = []
    for i, (name, _, _) in enumerate(PHASES):
        begin, end = start + i * seconds, start + (i + 1) * seconds
        books = [(t, a) for t, a, phase in calls[BOOK] if phase == i]
        steady = [t for t in everything if begin + 1.0 <= t < end]
        span = max(seconds - 1.0, 1e-9)
        phases.append(
            Phase(
                name,
                len(books),
                sum(a for _, a in books),
                sum(1 for t in admitted[SEARCH] if begin + 1.0 <= t < end) / span,
                sum(1 for t in admitted[BOOK] if begin + 1.0 <= t < end) / span,
                max_in_window(steady, 1.0),
            )
        )
    decisions = sum(len(got) for got in calls.values())
    return Result(start, seconds, phases, admitted, lease_calls, decisions)


class Cost(NamedTuple):
    """Redis server µs per decision over interleaved rounds: the median of each, and the
    median, lowest and highest of the rounds' ratios (a round with a reserve over the
    round without one just before it)."""

    plain: float
    reserved: float
    ratio: float
    ratio_low: float
    ratio_high: float
    rounds: int


def decision_cost(redis_url: str, calls: int = 20_000, rounds_n: int = 20) -> Cost:
    """Redis server µs per decision (``cmdstat_evalsha``) on an interface under a channel
    cap without a reserve, then on one whose cap has a reserve (a sheddable call): both
    never limited (10,000,000/s), in ``rounds_n`` rounds of each taken in turn (A, B,
    A, B, ...). ``redis_url`` must be a Redis no one else uses."""
    prefix = f"gwlcost{uuid.uuid4().hex[:8]}"
    cost_rows = {
        "*": {"channel_type": "CPLAIN", "rate_limit": 10_000_000},
        "/cost/plain": {"channel_type": "CPLAIN", "rate_limit": 10_000_000, "cache": 0.0},
    }
    reserved_rows = {
        "*": {"channel_type": "CRES", "rate_limit": 10_000_000, "reserve": RESERVE},
        "/cost/reserved": {"channel_type": "CRES", "rate_limit": 10_000_000, "cache": 0.0},
    }
    client = redis.Redis.from_url(redis_url)
    rounds: dict[str, list[float]] = {"/cost/plain": [], "/cost/reserved": []}
    with ExitStack() as stack:
        limiters = {}
        for chosen, url in ((cost_rows, "/cost/plain"), (reserved_rows, "/cost/reserved")):
            workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="gwl-bench-cost-"))
            database_url = f"sqlite:///{Path(workdir) / 'limits.db'}"
            write_rows(database_url, chosen)
            limiters[url] = started_limiter(
                stack, database_url, redis_url, prefix, redis_timeout=1.0
            )
            for _ in range(1000):  # scripts loaded, connections warm
                limiters[url].try_acquire(url, priority="sheddable")
        # rounds taken in turn, so a change in the host's load falls on both alike
        for _ in range(rounds_n):
            for url, limiter in limiters.items():
                client.config_resetstat()
                for _ in range(calls // rounds_n):
                    limiter.try_acquire(url, priority="sheddable")
                stats = client.info("commandstats").get("cmdstat_evalsha")
                if stats:  # (none: every call of the round timed out on a stalled host)
                    rounds[url].append(float(stats["usec"]) / float(stats["calls"]))
    # medians: on a loaded host a round's time varies by 2x; the ratio of rounds taken
    # in turn cancels most of what the host's load does to both
    plain, reserved = rounds["/cost/plain"], rounds["/cost/reserved"]
    ratios = sorted(b / a for a, b in zip(plain, reserved, strict=False))
    return Cost(
        statistics.median(plain),
        statistics.median(reserved),
        statistics.median(ratios),
        ratios[0],
        ratios[-1],
        len(ratios),
    )


def plot(result: Result, path: str) -> None:
    """Admitted per second per class over time, with the cap, as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    total = result.seconds * len(PHASES)
    bins = int(total)
    fig, ax = plt.subplots(figsize=(8, 3.6), dpi=110)
    for url, label in ((BOOK, "bookings (critical)"), (SEARCH, "searches (sheddable)")):
        counts = [0] * bins
        for t in result.admitted[url]:
            b = int(t - result.start)
            if 0 <= b < bins:
                counts[b] += 1
        ax.plot([i + 0.5 for i in range(bins)], counts, label=label, marker=".")
    ax.axhline(CAP, color="grey", linestyle="--", linewidth=1, label="channel cap")
    for i, (name, _, _) in enumerate(PHASES):
        ax.axvline(i * result.seconds, color="lightgrey", linewidth=1)
        ax.text(i * result.seconds + 0.2, CAP * 1.12, name, fontsize=8)
    ax.set_xlabel("seconds")
    ax.set_ylabel("admitted per second")
    ax.set_ylim(0, CAP * 1.25)
    ax.legend(loc="center right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def report(result: Result | None, cost: Cost | None) -> str:
    """The figures as text."""
    lines = []
    if result is not None:
        lines += _phases(result)
    if cost is not None:
        lines.append(
            f"Redis time per decision, median of {cost.rounds} interleaved rounds: "
            f"{cost.plain:.2f} µs without a reserve, {cost.reserved:.2f} µs with one; "
            f"ratio median {cost.ratio:.3f}x (rounds {cost.ratio_low:.3f}x to "
            f"{cost.ratio_high:.3f}x)"
        )
    lines.append(f"load average: {load_average()}")
    return "\n".join(lines)


def _phases(result: Result) -> list[str]:
    lines = [
        table(
            ["phase", "bookings admitted", "searches/s", "bookings/s", "most in 1 s"],
            [
                [
                    p.name,
                    f"{p.books_admitted}/{p.books_offered}"
                    + (f" ({p.books_admitted / p.books_offered:.2%})" if p.books_offered else ""),
                    f"{p.searches_per_s:.1f}",
                    f"{p.books_per_s:.1f}",
                    str(p.most_in_1s),
                ]
                for p in result.phases
            ],
        )
    ]
    alone = result.phases[-1].searches_per_s / CAP
    lines.append(f"searches alone: {alone:.3f} of the cap ({CAP}/s)")
    if result.lease_calls:
        lines.append(f"lease calls: {result.lease_calls} for {result.decisions} decisions")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--redis-url", help="a Redis or Redis Cluster (default: a private one)")
    parser.add_argument("--seconds", type=positive_float, default=10.0, help="seconds per phase")
    parser.add_argument("--plot", help="write the plot of admitted per class to this PNG")
    parser.add_argument("--json", action="store_true", help="the figures as JSON")
    parser.add_argument(
        "--leased", action="store_true", help="one leased row both classes call (leaseMs)"
    )
    parser.add_argument(
        "--cost-only", action="store_true", help="only the Redis time of a decision"
    )
    parser.add_argument(
        "--rounds", type=positive_int, default=20, help="interleaved rounds of the cost"
    )
    parser.add_argument(
        "--calls", type=positive_int, default=20_000, help="decisions of each kind the cost counts"
    )
    args = parser.parse_args(argv)
    if args.calls < args.rounds:
        parser.error(f"argument --calls: {args.calls}: must be >= --rounds ({args.rounds})")
    with ExitStack() as stack:
        if args.redis_url:
            reachable_redis(args.redis_url)
            redis_url = args.redis_url
            own = stack.enter_context(private_redis())  # cost: a Redis no one else uses
        else:
            redis_url = own = stack.enter_context(private_redis())
        result = None if args.cost_only else measure(redis_url, args.seconds, args.leased)
        cost = decision_cost(own, calls=args.calls, rounds_n=args.rounds)
    if args.plot and result is not None:
        plot(result, args.plot)
    if args.json:
        phases = [] if result is None else [p._asdict() for p in result.phases]
        print(json.dumps({"phases": phases, "cost_us": cost._asdict()}))
    else:
        print(report(result, cost))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GATEWAY_LIMITER_METRICS", "false")
    raise SystemExit(main())
