"""The exactness bound of leases on real Redis (docs/algorithms.md, "Leases"): for any
traffic, the admissions in any 1 s window are at most C + R x (1 + L/1000), C the
capacity, R the rate and L the row's leaseMs, whatever the number of processes: a
hand-back returns only what the bucket cannot have refilled since the lease was taken,
so a lease gone stale (a process calling now and then beside busy ones) is dropped,
not handed back into a bucket that refilled meanwhile.

Two limiters (two processes' worth of leases) with three threads each hammer one lease
row. Each admission is stamped when its call returns; the permit was debited in Redis
or taken from a lease between the call's start and that stamp, so a window of stamps
holds what went in a window longer by the slowest admitted call (``late_s``): the bound
checked is C + R x (1 + L/1000 + late_s). The lower bound: leases never admit much less
than a plain bucket would (C + R x D over D seconds), less the leases still unspent.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
from sqlalchemy import Engine

from tests.support.limiting import limiter, write_row
from tests.support.services import RedisServer

RATE = 2000  # capacity too (maxPermits NULL: one second's worth)
LEASE_MS = 100
SECONDS = 2.5
LIMITERS, THREADS = 2, 3


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    write_row(limiter_db[1], "/hot", rateLimit=RATE, cache=0.0, leaseMs=LEASE_MS)
    return limiter_db


def _peak(stamps: list[float], window_s: float = 1.0) -> int:
    stamps.sort()
    most, start = 0, 0
    for end, t in enumerate(stamps):
        while t - stamps[start] >= window_s:
            start += 1
        most = max(most, end - start + 1)
    return most


@pytest.mark.parametrize("paced", [False, True], ids=["hammering", "mixed"])
def test_admissions_in_any_second_stay_within_the_lease_bound(
    limiter_db: tuple[str, Engine], redis_server: RedisServer, key_prefix: str, paced: bool
) -> None:
    url = redis_server.url
    limiters = [
        limiter(limiter_db[0], url, key_prefix, reload_interval=3600) for _ in range(LIMITERS)
    ]
    stamps: list[list[float]] = [[] for _ in range(LIMITERS * THREADS)]
    late = [0.0] * (LIMITERS * THREADS)
    go = threading.Event()

    def hammer(i: int) -> None:
        lim, mine = limiters[i % LIMITERS], stamps[i]
        # mixed: the second limiter's threads call every few ms, so its leases go stale
        # (and are dropped), while the first limiter's hammer the bucket empty
        slow = paced and i % LIMITERS == 1
        pause = random.Random(i)
        go.wait()
        end = time.monotonic() + SECONDS
        slowest = 0.0
        while (started := time.monotonic()) < end:
            if lim.try_acquire("/hot", timeout=0):
                now = time.monotonic()
                mine.append(now)
                slowest = max(slowest, now - started)
            if slow:
                time.sleep(pause.uniform(0.0, 0.06))
        late[i] = slowest

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(len(stamps))]
    try:
        for t in threads:
            t.start()
        go.set()
        for t in threads:
            t.join()
        handed_back = sum(lim._leases.handed_back for lim in limiters if lim._leases)
        dropped = sum(lim._leases.dropped for lim in limiters if lim._leases)
    finally:
        for lim in limiters:
            lim.close()
    every = [s for mine in stamps for s in mine]
    peak, late_s = _peak(every), max(late)
    size = RATE * LEASE_MS // 1000
    if paced:  # stale leases with permits left in them: dropped in-process, none sent
        assert dropped > 0
        assert handed_back == 0
    bound = RATE + RATE * (1 + LEASE_MS / 1000 + late_s)  # the same for both
    assert peak <= bound, (
        f"peak {peak} in a second, bound {bound:.0f} (late {late_s * 1000:.1f} ms)"
    )
    if not paced:  # below: a plain bucket's C + R x D, less each limiter's last lease
        span = max(every) - min(every)
        floor = RATE + RATE * span - LIMITERS * size
        assert len(every) >= 0.9 * floor, f"{len(every)} in {span:.2f} s, floor {floor:.0f}"
