"""Rate leases keep the class order, with real gateway processes on a real Redis: one
token bucket row of 100/s with the reserve and ``leaseMs`` 100, that four processes
call, searches as sheddable (timeout 0) at 5x the rate beside bookings as critical at
0.2x, then 1x, then searches alone (``bench/priority.py --leased``, 3 s a phase).
Searches spend leased permits, yet every booking is admitted: a lease takes only from
above every class's reserve, so no process holds the reserve in its lease."""

from __future__ import annotations

from bench.priority import CAP, LEASED_BURST, measure
from tests.support.services import RedisServer


def test_bookings_all_admitted_while_searches_use_leases(redis_server: RedisServer) -> None:
    result = measure(redis_server.url, seconds=3.0, leased=True)
    low, high, alone = result.phases
    for phase in (low, high):
        assert phase.books_offered > 0
        assert phase.books_admitted >= 0.99 * phase.books_offered, phase
    assert low.searches_per_s >= 0.5 * CAP, low  # what bookings leave goes to searches
    assert high.searches_per_s <= 0.1 * CAP, high  # bookings take the whole rate
    assert alone.searches_per_s >= 0.6 * CAP, alone  # nothing held back when unused
    for phase in result.phases:  # past the first second of each phase
        assert phase.most_in_1s <= CAP + LEASED_BURST + 5, phase
    # decisions went from the leases (or were refused in-process while the class could
    # not go): far fewer lease calls than decisions
    assert 0 < result.lease_calls < 0.8 * result.decisions, result[-2:]
