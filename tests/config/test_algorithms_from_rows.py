"""Per-interface algorithms chosen by row (revision 0003), enforced through real Redis."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import Engine, text

from gateway_limiter import GatewayLimiter
from tests.support.limiting import limiter, write_row
from tests.support.services import RedisServer


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    engine = limiter_db[1]
    # refilled at 1/s: a loaded host's stall between the calls counted refills nothing
    write_row(engine, "/tb", rateLimit=1, cache=0.0, algorithm=None, maxPermits=3)
    write_row(engine, "/sw", rateLimit=5, cache=0.0, algorithm="sliding_window")
    write_row(engine, "/wu", rateLimit=20, cache=0.5, algorithm="warm_up", warmupPeriod=1.0)
    write_row(engine, "/bad1", rateLimit=5, cache=0.0, algorithm="sliding_window", maxPermits=9)
    write_row(engine, "/bad2", rateLimit=5, cache=0.0, algorithm="token_bucket", warmupPeriod=2.0)
    write_row(engine, "/bad3", rateLimit=5, cache=0.0, algorithm="leaky")
    return limiter_db


def test_columns_default_to_todays_token_bucket(migrated_db: tuple[str, Engine]) -> None:
    with migrated_db[1].begin() as conn:
        conn.execute(
            text(
                "insert into t_ratelimite_conf (interfaceUrl, rateLimit, status) "
                "values ('/plain', 5, 1)"
            )
        )
        algorithm = conn.execute(
            text("select algorithm from t_ratelimite_conf where interfaceUrl = '/plain'")
        ).scalar_one()
    assert algorithm == "token_bucket"


def test_max_permits_sets_the_token_bucket_capacity(lim: GatewayLimiter) -> None:
    assert [lim.try_acquire("/tb") for _ in range(4)] == [True] * 3 + [False]


def test_sliding_window_admits_the_rate_then_refuses_until_a_slot_frees(
    lim: GatewayLimiter,
) -> None:
    assert [lim.try_acquire("/sw") for _ in range(7)] == [True] * 5 + [False] * 2
    verdict = lim.reserve("/sw", timeout=2.0)
    assert verdict.allowed
    assert 0.8 < verdict.wait_us / 1e6 <= 1.02  # the earliest slot: a window after the first


def test_warm_up_paces_a_cold_interface_at_a_third_of_the_rate(lim: GatewayLimiter) -> None:
    start = time.monotonic()
    waits = [lim.acquire("/wu") for _ in range(3)]
    assert waits[0] == pytest.approx(3 / 20, abs=0.02)  # cold: three stable intervals
    assert all(w > 0.05 for w in waits)  # paced, no burst
    assert time.monotonic() - start >= 0.35


def test_invalid_algorithm_combinations_are_skipped_with_reasons(lim: GatewayLimiter) -> None:
    summary = lim.reload()
    assert summary.ok
    reasons = " | ".join(s.reason for s in summary.skipped)
    assert "maxPermits 9 is invalid for sliding_window" in reasons
    assert "warmupPeriod is for warm_up only" in reasons
    assert "'leaky' is not one of" in reasons
    assert {"/tb", "/sw", "/wu"} <= set(lim.registry.snapshot.rules)


def test_an_unmigrated_0002_table_still_loads(
    mariadb_db: str, redis_server: RedisServer, key_prefix: str
) -> None:
    from gateway_limiter.config.migrate import upgrade
    from gateway_limiter.config.table import make_engine

    engine = make_engine(mariadb_db)
    upgrade(engine, "0002")  # code newer than schema: the new columns read as NULL
    with engine.begin() as conn:
        conn.execute(
            text(
                "insert into t_ratelimite_conf (interfaceUrl, rateLimit, cache, "
                "status) values ('/old', 2, 0, 1)"
            )
        )
    lim = limiter(mariadb_db, redis_server.url, key_prefix)
    try:
        assert lim.registry.snapshot.rules["/old"].algorithm == "token_bucket"
        assert [lim.try_acquire("/old") for _ in range(3)] == [True, True, False]
    finally:
        lim.close()
        engine.dispose()
