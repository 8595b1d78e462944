"""A Sentinel failover that may lose writes keeps the fleet within R x T + C plus what
was lost, against real processes and real redis-servers.

Three processes of three unpaced threads call ``try_acquire(url, timeout=0)`` on one
interface (R = 100/s, C = 100), default settings (``share`` while Redis is away). The
Sentinel fixture (a master, a replica, a sentinel with down-after 1 s); the test
SIGKILLs the master after 3 s and the sentinel promotes the replica
(tests/support/failover.py). Replication is asynchronous: the decisions the replica
had not received when the master died are lost, and the promoted bucket is fuller than
the fleet's real use by at most those.

Asserted, from every call's record and the replication offsets:
- no caller saw an exception; the replica took over and decided again;
- over the failover period T (1 s before the kill to 2 s after Redis decides again)
  the fleet admitted at most R x T + C + the decisions lost (the master's offset just
  before the kill less the replica's just after, in admitted decisions' bytes) + 2
  (a permit at each edge of T);
- with the replica's link cut 300 ms before the kill, writes are lost (the bound's
  lost term is not always zero) and the same bound holds;
- the fleet used the rule: at least 0.5 x R x T admitted (it was not refusing all).

Counting is robust to a loaded host: a call counts only if it began and ended inside
T, so it was decided there; delays can only move calls out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Engine

from tests.support.clusters import LocalSentinel
from tests.support.failover import CAPACITY, RATE, URL, SentinelTopology, run_failover
from tests.support.limiting import write_row


@pytest.fixture
def sentinel_group() -> Iterator[LocalSentinel]:
    """A fresh Sentinel group for one failover (its master is killed for good)."""
    group = LocalSentinel().start()
    yield group
    group.stop()


@pytest.mark.slow
@pytest.mark.parametrize("cut_ms", [0.0, 300.0])
def test_a_failover_admits_at_most_the_rule_plus_what_was_lost(
    migrated_db: tuple[str, Engine],
    sentinel_group: LocalSentinel,
    key_prefix: str,
    figures: Callable[..., None],
    cut_ms: float,
) -> None:
    url, engine = migrated_db
    write_row(engine, URL, rateLimit=RATE, cache=0.0, status=1)

    report = run_failover(
        url, SentinelTopology(sentinel_group), "sentinel", key_prefix, cut_ms=cut_ms
    )
    f = report.figures()
    figures("failover, sentinel", **f)

    assert report.errors == []
    assert report.resumed_s() < 8.0, f
    assert report.bytes_per_decision > 0, f  # the sampler saw the master's writes
    start, end = report.period()
    lost = report.lost_bytes / report.bytes_per_decision
    admitted = report.admitted_within(start, end)
    assert admitted <= RATE * (end - start) + CAPACITY + lost + 2, f
    assert admitted >= 0.5 * RATE * (end - start), f
    if cut_ms:
        assert lost >= 1, f  # the cut lost decisions: the bound's last term was live
