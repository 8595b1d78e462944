"""The fleet keeps the rule while Redis is away, against real processes.

Four processes of three threads each call ``try_acquire(url, timeout=0)`` on one
interface (R = 40/s, C = 40) under the default ``on_backend_error`` (``share``) and
otherwise default settings; the test SIGKILLs the private redis-server for 8 s and
restarts it empty (tests/support/outage.py).

Asserted, from every call's record:
- every process knew the fleet (N = 4) before the kill, and no caller saw an exception;
- in every 1 s window from 1.5 s into the outage (10 ms steps), the fleet admitted at
  most 1.15 x R: each process decides at R/4 with a bucket of C/4, so once those
  buckets are spent the fleet admits R per second (plus at most one permit per
  process at a window's edges: 44 of the 46 allowed);
- over the outage the fleet admitted at least 0.8 x R x D (demand is even and each
  process's share is R/4: 0.8 leaves a fifth for the seconds a loaded host does not
  run a process's threads).

Counting is robust to a loaded host: a call counts in a window only if it began and
ended inside it, so it was decided there; delays can only move calls out of windows.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import Engine

from tests.support.limiting import write_row
from tests.support.outage import PROCESSES, RATE, UNEVEN_PACE, UNEVEN_THREADS, URL, run_outage
from tests.support.services import RedisServer


@pytest.mark.slow
def test_the_fleet_keeps_the_rule_while_redis_is_killed(
    migrated_db: tuple[str, Engine],
    private_redis: RedisServer,
    key_prefix: str,
    figures: Callable[..., None],
) -> None:
    url, engine = migrated_db
    write_row(engine, URL, rateLimit=RATE, cache=0.0, status=1)

    report = run_outage(url, private_redis, key_prefix, policy=None)
    figures("fleet outage, share", **report.figures())

    assert report.errors == []
    assert report.sizes_before == [PROCESSES] * PROCESSES
    windows = report.windows()
    assert max(windows) <= 1.15 * RATE, f"most admitted in 1 s: {max(windows)}"
    assert report.total() >= 0.8 * RATE * report.outage_s, report.by_process()
    # each process took its part: none decided the whole rule alone
    assert all(0 < n <= RATE * report.outage_s / 2 for n in report.by_process())


@pytest.mark.slow
def test_one_process_with_most_of_the_demand_gets_most_of_the_rule(
    migrated_db: tuple[str, Engine],
    private_redis: RedisServer,
    key_prefix: str,
    figures: Callable[..., None],
) -> None:
    """Process 0 carries 80 % of 50 calls/s (paced, so the demand does not depend on
    the host's speed): its claim follows its demand, so the fleet admits at least
    0.6 x R over the outage (1/N shares would give R/4 + the others' 10/s = 0.5 x R),
    and the claims add up to at most 1: never over 1.15 x R in a second."""
    url, engine = migrated_db
    write_row(engine, URL, rateLimit=RATE, cache=0.0, status=1)

    report = run_outage(
        url, private_redis, key_prefix, policy=None, threads=UNEVEN_THREADS, paced=UNEVEN_PACE
    )
    figures("fleet outage, share, 80 % of the demand on one process", **report.figures())

    assert report.errors == []
    assert report.sizes_before == [PROCESSES] * PROCESSES
    windows = report.windows()
    assert max(windows) <= 1.15 * RATE, f"most admitted in 1 s: {max(windows)}"
    assert report.total() >= 0.6 * RATE * report.outage_s, report.by_process()
    # the busy process got more than 1/N: the demand weighting at work
    assert report.by_process()[0] > 1.5 * RATE / PROCESSES * report.outage_s
