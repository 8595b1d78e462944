"""Debt leases on real MariaDB and Redis (docs/algorithms.md, "Rate leases"): callers who
can wait, offered more than the rate once the bucket is empty, are served mostly from
permits their process's lease call scheduled as debt, one round trip for many
admissions, and the exactness bound still holds.

Two limiters (two processes' worth of leases) with four threads each call ``decide`` on
one lease row in a loop, each with the row's wait budget (``cache``, 0.5 s), for 2.5 s:
far above the rate once the first second's burst is spent. Each admission is stamped
when its call returns, after its wait; the permit was due on the bucket's clock no
earlier than the call's start plus its wait less the round trip of the lease call that
scheduled it, and is used no later than leaseMs after it, so a window of stamps holds
what the bucket scheduled in a window longer by L and by the slowest call beyond its
wait (``late_s``): the bound checked is C + R x (1 + L/1000 + late_s).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from itertools import chain

import pytest
import redis
from sqlalchemy import Engine

from tests.leases.test_lease_exactness_bound import _peak
from tests.support.limiting import evalsha_calls, limiter, write_row
from tests.support.services import RedisServer

RATE = 1000  # capacity too (maxPermits NULL: one second's worth)
LEASE_MS = 100
BUDGET_S = 0.5
SECONDS = 2.5
LIMITERS, THREADS = 2, 4


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    write_row(limiter_db[1], "/hot", rateLimit=RATE, cache=BUDGET_S, leaseMs=LEASE_MS)
    return limiter_db


def test_callers_who_wait_are_served_from_debt_leases_within_the_bound(
    limiter_db: tuple[str, Engine],
    redis_server: RedisServer,
    redis_client: redis.Redis,
    key_prefix: str,
) -> None:
    limiters = [
        limiter(limiter_db[0], redis_server.url, key_prefix, reload_interval=3600)
        for _ in range(LIMITERS)
    ]
    stamps: list[list[float]] = [[] for _ in range(LIMITERS * THREADS)]
    late = [0.0] * (LIMITERS * THREADS)
    start = threading.Barrier(LIMITERS * THREADS)

    def call(i: int) -> None:
        lim, mine = limiters[i % LIMITERS], stamps[i]
        start.wait()
        end = time.monotonic() + SECONDS
        while (started := time.monotonic()) < end:
            decision = lim.decide("/hot")
            if decision.allowed:
                mine.append(time.monotonic())
                late[i] = max(late[i], mine[-1] - started - decision.waited)

    before = evalsha_calls(redis_client)
    with ExitStack() as closing:
        for lim in limiters:
            closing.callback(lim.close)
        with ThreadPoolExecutor(LIMITERS * THREADS) as pool:
            list(pool.map(call, range(LIMITERS * THREADS)))
        asked = evalsha_calls(redis_client) - before
        held = [lim._leases for lim in limiters if lim._leases is not None]
        owed, lost = sum(h.owed for h in held), sum(h.owed_lost for h in held)
    every = list(chain.from_iterable(stamps))
    size, late_s = RATE * LEASE_MS // 1000, max(late)
    peak = _peak(every)
    bound = RATE + RATE * (1 + LEASE_MS / 1000 + late_s)
    assert peak <= bound, f"peak {peak} in a second, bound {bound:.0f} (late {late_s * 1e3:.1f} ms)"
    span = max(every) - min(every)
    # below: a plain bucket's C + R x D, less what each limiter's debt left unused
    floor = RATE + RATE * span - LIMITERS * size
    assert len(every) >= 0.9 * floor, f"{len(every)} in {span:.2f} s, floor {floor:.0f}"
    # the bucket ran dry after its first second: most of the rest came as debt, many
    # admissions to a round trip (a plain row: about one; measured 1.2 per EVALSHA)
    assert owed >= RATE * (SECONDS - 1.5)
    assert lost <= LIMITERS * size * 2
    assert len(every) / asked >= 10, f"{len(every)} admissions, {asked} EVALSHA"
