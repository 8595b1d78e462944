"""Bookings before searches under one channel cap, with real gateway processes: four
processes offer searches at 5x the cap beside bookings at 0.2x, then 1x, then searches
alone (``bench/priority.py``, 3 s a phase), on a real Redis and on a real Redis Cluster
of 3 masters. The channel row's reserve with each interface row's ``priority`` gives
bookings first call on the supplier's capacity, and wastes none of it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.priority import CAP, measure
from tests.support.clusters import LocalCluster
from tests.support.services import RedisServer

#: the channel row's maxPermits: a 1 s window may hold the rate and the stored burst
BURST = 10


def check(redis_url: str) -> None:
    result = measure(redis_url, seconds=3.0)
    low, high, alone = result.phases
    for phase in (low, high):  # bookings never above the cap: all but a stray admitted
        assert phase.books_offered > 0
        assert phase.books_admitted >= 0.99 * phase.books_offered, phase
    assert low.searches_per_s >= 0.6 * CAP, low  # what bookings leave goes to searches
    assert high.searches_per_s <= 0.05 * CAP, high  # bookings take the whole cap
    # nothing held back when unused: a sheddable class alone goes on well past the
    # half its reserve would leave of a window. The bench reports 0.96-1.0 of the cap
    # on a quiet host; four processes stalled by a loaded one lose what a full bucket
    # could not store (74.5/s seen under a CI run's load).
    assert alone.searches_per_s >= 0.6 * CAP, alone
    for phase in result.phases:  # past the first second of each phase
        assert phase.most_in_1s <= CAP + BURST + 5, phase  # + admissions timed late


def test_bookings_first_on_one_redis(redis_server: RedisServer) -> None:
    check(redis_server.url)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    started = LocalCluster(masters=3).start()
    yield started
    started.stop()


def test_bookings_first_on_a_cluster_of_three_masters(cluster: LocalCluster) -> None:
    check(cluster.url)
