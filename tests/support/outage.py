"""A fleet outage: real processes share one interface, Redis is killed.

``run_outage`` starts a ``Fleet`` (tests/support/fleet.py) on one interface of rate R,
lets it beat long enough that every process knows N, SIGKILLs the private
``redis-server`` for ``OUTAGE_S`` seconds, restarts it empty, and returns what every
call saw. ``OutageReport`` reads the records: what the fleet admitted in every 1 s
window from ``SETTLE_S`` into the outage, and over the whole outage.

Used by tests/faults/test_fault_fleet_shares_the_rule.py (which asserts the bounds)
and bench/fleet_outage.py (which prints ``share`` beside ``local``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from tests.support.fleet import Fleet, WorkerConfig
from tests.support.services import RedisServer

URL = "/fleet/outage"
RATE = 40
CAPACITY = RATE  # maxPermits NULL: one second's worth
PROCESSES = 4
THREADS = 3
#: Before the kill: every process has beaten at least twice (default fleet_heartbeat
#: 1 s) after the last one started, so each knows N.
WARM_S = 3.0
OUTAGE_S = 8.0
#: After the restart: the fleet is back on Redis.
AFTER_S = 1.5
#: The windows counted start this long into the outage: the buckets each process
#: starts its outage with (C/N each, C in all) have been spent by then.
SETTLE_S = 1.5
#: Uneven demand: process 0 carries 80 % of 50 calls/s (12 threads of 10/3 calls/s),
#: the three others one such thread each. At 1/N each, the fleet would admit R/4 + 10
#: = 0.5 x R; demand-weighted, about R.
UNEVEN_THREADS = [12, 1, 1, 1]
UNEVEN_PACE = 10 / 3


@dataclass(frozen=True)
class Admitted:
    """One admitted call: its process, start and end (s from the kill)."""

    process: int
    started: float
    ended: float


@dataclass(frozen=True)
class OutageReport:
    """What a fleet admitted around one outage of ``outage_s`` seconds."""

    policy: str
    outage_s: float
    admitted: list[Admitted]
    calls: int
    #: Per process: the fleet size it knew just before the kill.
    sizes_before: list[int]
    errors: list[str]

    def in_outage(self) -> list[Admitted]:
        """Admitted calls that began and ended while Redis was down."""
        return [a for a in self.admitted if a.started >= 0.0 and a.ended <= self.outage_s]

    def total(self) -> int:
        """The fleet's admissions over the outage."""
        return len(self.in_outage())

    def by_process(self) -> list[int]:
        """Each process's admissions over the outage."""
        counts = [0] * len(self.sizes_before)
        for a in self.in_outage():
            counts[a.process] += 1
        return counts

    def windows(self) -> list[int]:
        """Admitted calls that began and ended within one second, for every second
        from ``SETTLE_S`` into the outage to its end that starts at 10 ms steps. Each
        call was decided between its start and end, so these were decided within that
        second, whatever the host's delays: a count the rule bounds."""
        inside = sorted(self.in_outage(), key=lambda a: a.started)
        counts = []
        first = SETTLE_S
        while first + 1.0 <= self.outage_s:
            counts.append(sum(1 for a in inside if a.started >= first and a.ended <= first + 1.0))
            first += 0.01
        return counts

    def figures(self) -> dict[str, Any]:
        """The figures a test prints and the docs quote."""
        windows = self.windows()
        return {
            "policy": self.policy,
            "calls": self.calls,
            "fleet_size_before": self.sizes_before,
            "admitted_in_outage": self.total(),
            "floor_0_8_R_D": 0.8 * RATE * self.outage_s,
            "by_process": self.by_process(),
            "most_in_1s": max(windows),
            "least_in_1s": min(windows),
            "ceiling_1_15_R": 1.15 * RATE,
        }


def run_outage(
    database_url: str,
    server: RedisServer,
    key_prefix: str,
    policy: str | None,
    *,
    threads: list[int] | None = None,
    paced: float = 0.0,
    outage_s: float = OUTAGE_S,
) -> OutageReport:
    """One run: the fleet (``threads`` per process, default ``THREADS`` each; each
    thread unpaced with a 3 ms pause, or ``paced`` calls per second) under
    ``on_backend_error = policy`` (None: the default), Redis killed for ``outage_s``.
    Every other setting is the default. ``server`` is running when this returns."""
    each = threads if threads is not None else [THREADS] * PROCESSES
    settings = {} if policy is None else {"on_backend_error": policy}
    config = WorkerConfig(
        database_url=database_url,
        redis_url=server.url,
        key_prefix=key_prefix,
        urls=[URL],
        seconds=WARM_S + outage_s + AFTER_S,
        threads=THREADS,
        pause=0.003,
        paced=paced,
        settings=settings,
    )
    fleet = Fleet(config, len(each), threads=each)
    try:
        start = fleet.start()
        # real time: warm traffic until WARM_S
        time.sleep(max(0.0, start + WARM_S - time.time()))
        killed = time.time()
        server.kill()
        # real time: the outage's length
        time.sleep(max(0.0, killed + outage_s - time.time()))
        restarted = time.time()
        server.start()
        results = fleet.results()
    finally:
        fleet.kill()
        if server.proc is None:
            server.start()
    admitted = [
        Admitted(n, started - killed, started + took - killed)
        for n, r in enumerate(results)
        for started, took, ok, _, _ in r["calls"]
        if ok
    ]
    sizes = [([0] + [size for at, size in r["fleet_sizes"] if at < killed])[-1] for r in results]
    return OutageReport(
        policy=policy or "share (default)",
        outage_s=restarted - killed,
        admitted=admitted,
        calls=sum(len(r["calls"]) for r in results),
        sizes_before=[int(s) for s in sizes],
        errors=[e for r in results for e in r["errors"]],
    )
