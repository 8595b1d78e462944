"""Redis Sentinel under traffic from threads and asyncio at once: decisions go to the
master the sentinel names, and when that master dies mid-traffic callers see nothing
(the failure policy decides meanwhile), the sentinel promotes the replica, and limiting
resumes there, its missing script loaded on the first call."""

from __future__ import annotations

from sqlalchemy import Engine

from gateway_limiter.backends.state import bucket_key
from tests.support.clusters import LocalSentinel, wait_for
from tests.support.limiting import write_row
from tests.support.traffic import RATE, Traffic, limiting_resumes, stat


def test_decisions_go_to_the_master_and_survive_its_failover(
    migrated_db: tuple[str, Engine], redis_sentinel: LocalSentinel, key_prefix: str
) -> None:
    db_url, engine = migrated_db
    url = "/sentinel/search"
    write_row(engine, url, rateLimit=RATE, cache=0.0, status=1)
    master = redis_sentinel.server_on(redis_sentinel.master_port())
    traffic = Traffic(
        url,
        database_url=db_url,
        redis_url=redis_sentinel.url,
        key_prefix=key_prefix,
        redis_timeout=0.5,
        on_backend_error="local",
    ).start()
    try:
        limiting_resumes(traffic, seconds=1.0)  # shared limits on the master from the start
        assert master.client().exists(bucket_key(key_prefix, url))
        master.kill()
        # Callers refused in-process (the last reply named the next permit) ask no one:
        # the outage shows at the next call that asks, within a permit interval.
        wait_for("a caller to see the outage", lambda: traffic.fallbacks > 0, 10)
        wait_for("the sentinel to promote the replica",
                 lambda: redis_sentinel.master_port() != master.port, 30)  # fmt: skip
        limiting_resumes(traffic)
        assert traffic.fallbacks > 0  # the outage was seen, and the policy decided
    finally:
        traffic.stop()
    assert traffic.errors == []
    promoted = redis_sentinel.server_on(redis_sentinel.master_port())
    assert promoted.client().exists(bucket_key(key_prefix, url))
    assert stat(promoted.client(), "script|load") >= 1  # scripts are not replicated
