"""A running limiter follows the table: edits by plain SQL apply within one interval."""

from __future__ import annotations

import logging
import random
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, text

from gateway_limiter import GatewayLimiter
from gateway_limiter.backends.scripts import parse_state
from gateway_limiter.backends.state import bucket_key
from gateway_limiter.config.reload import ReloadSummary, spread_interval
from tests.support.limiting import limiter, set_switch, write_row
from tests.support.services import RedisServer, fresh_mariadb_database, mariadb_url

INTERVAL = 0.3


def wait_until(condition: object, seconds: float = 5.0) -> float:
    """Poll ``condition()`` until true; return how long it took (fail after ``seconds``)."""
    start = time.monotonic()
    while not condition():  # type: ignore[operator]
        if time.monotonic() - start > seconds:
            pytest.fail(f"condition not met within {seconds} s")
        time.sleep(0.02)
    return time.monotonic() - start


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    write_row(limiter_db[1], "/r", rateLimit=4, cache=0.0, status=1)
    return limiter_db


@pytest.fixture
def limiter_settings() -> dict[str, Any]:
    return {"reload_interval": INTERVAL}


def test_sql_edits_apply_within_one_reload_interval(
    lim: GatewayLimiter, migrated_db: tuple[str, Engine]
) -> None:
    engine = migrated_db[1]
    assert lim.registry.snapshot.rules["/r"].rate == 4

    write_row(engine, "/r", rateLimit=40)
    took = wait_until(lambda: lim.registry.snapshot.rules["/r"].rate == 40)
    assert took < INTERVAL * 1.1 + 1.0  # one interval (+ jitter), with slack for a busy host

    write_row(engine, "/r", status=0)
    wait_until(lambda: "/r" not in lim.registry.snapshot.rules)
    write_row(engine, "/new", rateLimit=1, cache=0.0, status=1)
    wait_until(lambda: "/new" in lim.registry.snapshot.rules)
    assert [lim.try_acquire("/new") for _ in range(3)] == [True, False, False]

    set_switch(engine, 0)
    wait_until(lambda: not lim.registry.snapshot.switch)
    assert all(lim.try_acquire("/new") for _ in range(10))
    set_switch(engine, 1)
    wait_until(lambda: lim.registry.snapshot.switch)
    assert not lim.try_acquire("/new")


def test_reload_summary_reports_added_changed_removed_and_skipped(
    lim: GatewayLimiter, migrated_db: tuple[str, Engine]
) -> None:
    engine = migrated_db[1]
    write_row(engine, "/r", rateLimit=8)
    write_row(engine, "/a", rateLimit=1, status=1)
    write_row(engine, "/bad", rateLimit=-5, status=1)
    summary = lim.reload()
    assert summary.ok
    assert summary.added == ("/a",)
    assert summary.changed == ("/r",)
    assert [s.reason for s in summary.skipped] == ["rateLimit -5 is negative"]
    write_row(engine, "/a", status=0)
    assert lim.reload().removed == ("/a",)


def test_a_rate_change_keeps_the_bucket_instead_of_refilling_it(
    lim: GatewayLimiter,
    migrated_db: tuple[str, Engine],
    redis_client: redis.Redis,
    key_prefix: str,
) -> None:
    engine = migrated_db[1]
    # Slow refills (1/s, then 2/s) with a burst of 4: a loaded host that stalls a few
    # hundred ms between calls refills nothing that would change what is counted.
    write_row(engine, "/rc", rateLimit=1, maxPermits=4, cache=0.0, status=1)
    lim.reload()
    assert [lim.try_acquire("/rc") for _ in range(5)] == [True] * 4 + [False]  # drained
    write_row(engine, "/rc", rateLimit=2)
    lim.reload()
    # a reset would serve 4 at once; a rescale keeps what was left (almost nothing)
    admitted = sum(lim.try_acquire("/rc") for _ in range(4))
    assert admitted <= 1
    # the state was built at 1/s; the next reservation adopts 2/s (refusals write nothing)
    assert lim.acquire("/rc") > 0
    state = parse_state(redis_client.get(bucket_key(key_prefix, "/rc")))
    assert state is not None and state.rate == 2.0


def test_database_outage_keeps_the_last_good_limits_logs_once_and_recovers(
    redis_server: RedisServer, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    with fresh_mariadb_database() as name:
        url = mariadb_url(name)
        lim = GatewayLimiter(
            database_url=url, redis_url=redis_server.url, key_prefix=key_prefix, reload_interval=60
        )
        from gateway_limiter.config.migrate import upgrade

        upgrade(lim.registry.engine)
        write_row(lim.registry.engine, "/r", rateLimit=2, cache=0.0, status=1)
        lim.start()
        with lim.registry.engine.begin() as conn:
            conn.execute(text("rename table t_ratelimite_conf to t_moved_away"))
        caplog.set_level(logging.DEBUG, logger="gateway_limiter")
        for _ in range(5):
            summary = lim.reload()
            assert not summary.ok and summary.error
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1  # once per outage, not once per tick
        assert "keeping the last good limits" in errors[0].getMessage()
        assert [lim.try_acquire("/r") for _ in range(3)] == [True, True, False]

        with lim.registry.engine.begin() as conn:
            conn.execute(text("rename table t_moved_away to t_ratelimite_conf"))
        assert lim.reload().ok
        assert any("reachable again" in r.getMessage() for r in caplog.records)
        lim.close()


def test_database_gone_for_good_between_reloads_raises_nothing(
    redis_server: RedisServer, key_prefix: str
) -> None:
    with fresh_mariadb_database() as name:
        url = mariadb_url(name)
        lim = GatewayLimiter(
            database_url=url, redis_url=redis_server.url, key_prefix=key_prefix, reload_interval=0.2
        )
        from gateway_limiter.config.migrate import upgrade

        upgrade(lim.registry.engine)
        write_row(lim.registry.engine, "/r", rateLimit=3, cache=0.0, status=1)
        lim.start()
        failed = threading.Event()
        lim.registry.listeners.append(lambda summary: None if summary.ok else failed.set())
    # the database is dropped now; scheduled reloads fail in the background
    assert failed.wait(30), "no scheduled reload failed within 30 s"
    assert not lim.reload().ok
    assert lim.registry.snapshot.rules["/r"].rate == 3
    assert [lim.try_acquire("/r") for _ in range(4)] == [True] * 3 + [False]
    lim.close()


def test_first_load_failing_starts_with_no_rules_and_says_so(
    redis_server: RedisServer, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="gateway_limiter")
    lim = GatewayLimiter(
        database_url="mysql+pymysql://root:s3cret@127.0.0.1:1/none",
        redis_url=redis_server.url,
        key_prefix=key_prefix,
        reload_interval=60,
    )
    summary = lim.start()
    assert not summary.ok
    assert lim.try_acquire("/anything", timeout=0)
    (record,) = caplog.records
    assert "NO LIMITS IN FORCE" in record.getMessage()
    assert "s3cret" not in record.getMessage()
    lim.close()


def test_close_stops_the_reload_thread(
    migrated_db: tuple[str, Engine], redis_server: RedisServer, key_prefix: str
) -> None:
    import threading

    before = threading.active_count()
    lim = limiter(migrated_db[0], redis_server.url, key_prefix, reload_interval=0.1)
    assert threading.active_count() > before
    lim.close()
    wait_until(lambda: threading.active_count() <= before)


def test_reloads_are_spread_by_a_random_generator_of_their_own() -> None:
    trigger = spread_interval(10.0, 1.0)
    random.seed(7)
    state = random.getstate()
    now = datetime.now(UTC)
    late = [(trigger.get_next_fire_time(now, now) - now).total_seconds() - 10.0 for _ in range(50)]
    assert random.getstate() == state  # the application's random numbers stay its own
    assert all(0.0 <= s <= 1.0 for s in late)
    assert len(set(late)) > 40  # spread over the jitter, each fire apart


def test_a_running_limiter_leaves_the_random_module_alone(
    migrated_db: tuple[str, Engine], redis_server: RedisServer, key_prefix: str
) -> None:
    lim = limiter(migrated_db[0], redis_server.url, key_prefix, reload_interval=0.05)
    reloads = threading.Semaphore(0)

    def heard(summary: ReloadSummary) -> None:
        reloads.release()

    try:
        lim.registry.listeners.append(heard)
        random.seed(7)
        state = random.getstate()
        for _ in range(3):  # scheduled reloads, each with the time of the next drawn
            assert reloads.acquire(timeout=10)
        assert random.getstate() == state
    finally:
        lim.close()
