"""Prometheus metrics on the default registry: every outcome counted, labels bounded,
gauges read at scrape time, served over a real socket. Real MariaDB, real Redis.

The registry is the process's own, shared by every test: counters are compared before
and after, and each test limits URLs of its own (under its key prefix).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import Engine, text

from gateway_limiter import GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.observe.metrics import UNCONFIGURED, serve
from tests.support.limiting import limiter, set_switch, write_row
from tests.support.services import RedisServer

DECISIONS = "gateway_limiter_decisions_total"


def value(name: str, **labels: str) -> float:
    """A sample's value on the default registry (0 when the series does not exist)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


def decided(interface: str, reason: str, outcome: str = "admitted") -> float:
    return value(DECISIONS, interface=interface, outcome=outcome, reason=reason, priority="default")


def label_values(label: str) -> set[str]:
    """Every value ``label`` takes on the gateway_limiter_ metrics now."""
    return {
        sample.labels[label]
        for family in REGISTRY.collect()
        if family.name.startswith("gateway_limiter_")
        for sample in family.samples
        if label in sample.labels
    }


@pytest.fixture
def urls(key_prefix: str) -> dict[str, str]:
    """This test's own interface URLs."""
    names = ("lim", "wait", "closed", "disabled", "shadow")
    return {name: f"/{key_prefix}/{name}" for name in names}


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine], urls: dict[str, str]) -> tuple[str, Engine]:
    engine = limiter_db[1]
    write_row(engine, urls["lim"], rateLimit=3, cache=0.0, status=1)
    write_row(engine, urls["wait"], rateLimit=20, cache=0.5, status=1)
    write_row(engine, urls["closed"], rateLimit=0, cache=0.0, status=1)
    write_row(engine, urls["disabled"], rateLimit=3, cache=0.0, status=0)
    write_row(engine, urls["shadow"], rateLimit=1, cache=0.0, status=1, shadow=1)
    return limiter_db


@pytest.fixture
def limiter_settings() -> dict[str, Any]:
    return {"reload_interval": 3600}


def test_each_outcome_is_counted_under_its_interface_and_reason(
    lim: GatewayLimiter, urls: dict[str, str], migrated_db: tuple[str, Engine]
) -> None:
    unconfigured = decided(UNCONFIGURED, "not_configured")
    switch_off = decided(urls["lim"], "switch_off")

    limited = [lim.decide(urls["lim"]) for _ in range(5)]
    assert [d.allowed for d in limited] == [True, True, True, False, False]
    assert not lim.decide(urls["closed"]).allowed
    assert lim.decide(urls["disabled"]).reason == "disabled"
    assert lim.decide("/somewhere/else").reason == "not_configured"
    shadow = [lim.decide(urls["shadow"]) for _ in range(3)]
    assert [d.reason for d in shadow] == ["admitted", "shadow", "shadow"]

    assert decided(urls["lim"], "admitted") == 3
    assert decided(urls["lim"], "limited", "refused") == 2
    assert decided(urls["closed"], "closed", "refused") == 1
    assert decided(urls["disabled"], "disabled") == 1  # a row of the table: its own label
    assert decided(UNCONFIGURED, "not_configured") == unconfigured + 1
    assert decided(urls["shadow"], "admitted") == 1
    assert decided(urls["shadow"], "shadow") == 2  # would-be refusals, admitted
    assert decided(urls["shadow"], "shadow", "refused") == 0

    set_switch(migrated_db[1], 0)
    lim.reload()
    assert lim.decide(urls["lim"]).reason == "switch_off"
    assert decided(urls["lim"], "switch_off") == switch_off + 1


def test_waits_are_observed_for_admitted_calls_on_limited_interfaces(
    lim: GatewayLimiter, urls: dict[str, str]
) -> None:
    waits = [lim.reserve(urls["wait"]).wait_us / 1e6 for _ in range(25)]  # 20 stored, then 50 ms
    assert waits[:20] == [0.0] * 20
    assert not lim.decide(urls["lim"], timeout=0).waited

    histogram = "gateway_limiter_wait_seconds"
    assert value(histogram + "_count", interface=urls["wait"]) == 25
    # 20, unless a loaded host took 50 ms a call and a permit came back meanwhile
    assert value(histogram + "_bucket", interface=urls["wait"], le="0.0") == waits.count(0.0)
    for bound in (0.001, 0.05, 0.1, 0.25):  # queued: about 50, 100, ... 250 ms
        observed = value(histogram + "_bucket", interface=urls["wait"], le=str(bound))
        assert observed == sum(w <= bound for w in waits)
    assert value(histogram + "_bucket", interface=urls["wait"], le="0.25") == 25
    assert value(histogram + "_sum", interface=urls["wait"]) == pytest.approx(sum(waits))
    assert value(histogram + "_count", interface=urls["closed"]) == 0  # refusals: no wait


def test_callers_urls_never_become_label_values(lim: GatewayLimiter, key_prefix: str) -> None:
    before = decided(UNCONFIGURED, "not_configured")
    strangers = [f"/{key_prefix}/stranger/{i}" for i in range(200)]
    for url in strangers:
        assert lim.try_acquire(url)
    assert decided(UNCONFIGURED, "not_configured") == before + 200
    assert not set(strangers) & label_values("interface")


def test_reloads_are_counted_by_outcome_and_gauges_follow_the_snapshot(
    lim: GatewayLimiter, urls: dict[str, str], migrated_db: tuple[str, Engine]
) -> None:
    engine = migrated_db[1]
    assert value("gateway_limiter_rules_in_force") == 4  # lim, wait, closed, shadow
    assert value("gateway_limiter_shadow_rules") == 1
    assert value("gateway_limiter_switch_on") == 1
    assert value("gateway_limiter_rows_skipped") == 0
    assert value("gateway_limiter_rule_permits_per_second", interface=urls["lim"]) == 3
    assert value("gateway_limiter_rule_permits_per_second", interface=urls["closed"]) == 0
    assert 0 <= value("gateway_limiter_reload_age_seconds") < 60

    ok = value("gateway_limiter_reloads_total", outcome="ok")
    failed = value("gateway_limiter_reloads_total", outcome="failed")
    with engine.begin() as conn:
        conn.execute(  # an empty interfaceUrl: skipped by the reload
            text(
                "insert into t_ratelimite_conf (interfaceUrl, rateLimit, status) values ('', 1, 1)"
            )
        )
    set_switch(engine, 0)
    assert lim.reload().ok
    assert value("gateway_limiter_reloads_total", outcome="ok") == ok + 1
    assert value("gateway_limiter_switch_on") == 0
    assert value("gateway_limiter_rows_skipped") == 1

    good_at = lim.registry.snapshot.loaded_at
    assert good_at is not None
    with engine.begin() as conn:
        conn.execute(text("rename table t_ratelimite_conf to t_elsewhere"))
    try:
        assert not lim.reload().ok
        assert value("gateway_limiter_reloads_total", outcome="failed") == failed + 1
        # The last good limits stay, and their age is counted from the last good reload.
        assert value("gateway_limiter_rules_in_force") == 4
        assert lim.registry.snapshot.loaded_at == good_at
        since = time.time() - good_at
        assert since <= value("gateway_limiter_reload_age_seconds") <= time.time() - good_at
    finally:
        with engine.begin() as conn:
            conn.execute(text("rename table t_elsewhere to t_ratelimite_conf"))


def test_redis_outage_counts_errors_and_fallbacks_and_shows_the_fallback_state(
    migrated_db: tuple[str, Engine],
    private_redis: RedisServer,
    key_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    db, engine = migrated_db
    url = f"/{key_prefix}/r"
    write_row(engine, url, rateLimit=100, cache=0.0, status=1)
    lim = limiter(db, private_redis.url, key_prefix, breaker_seconds=0.3, reload_interval=3600)
    try:
        errors = value("gateway_limiter_backend_errors_total")
        fallbacks = value("gateway_limiter_backend_fallbacks_total")
        assert lim.decide(url).reason == "admitted"
        assert value("gateway_limiter_backend_fallback") == 0

        private_redis.kill()
        caplog.set_level(logging.WARNING, logger="gateway_limiter")
        outcomes = [lim.decide(url) for _ in range(10)]
        assert {d.reason for d in outcomes} == {"backend_fallback"}
        assert value("gateway_limiter_backend_errors_total") == errors + 1  # then the breaker
        assert value("gateway_limiter_backend_fallbacks_total") == fallbacks + 10
        # share (the default) starts its part empty: admitted or refused, all counted
        fallback_outcomes = [decided(url, "backend_fallback", o) for o in ("admitted", "refused")]
        assert sum(fallback_outcomes) == 10
        assert fallback_outcomes == [
            sum(d.allowed for d in outcomes),
            sum(not d.allowed for d in outcomes),
        ]
        assert value("gateway_limiter_backend_fallback") == 1
        assert lim.backend_fallbacks == 10

        private_redis.start()
        deadline = time.monotonic() + 10
        while lim.decide(url).reason != "admitted" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert value("gateway_limiter_backend_fallback") == 0
        lines = [r.getMessage() for r in caplog.records]
        assert sum("Redis unreachable" in line for line in lines) == 1
        assert sum("reachable again" in line for line in lines) == 1
    finally:
        lim.close()


def test_metrics_off_records_nothing(
    migrated_db: tuple[str, Engine], redis_server: RedisServer, key_prefix: str
) -> None:
    db, engine = migrated_db
    url = f"/{key_prefix}/quiet"
    write_row(engine, url, rateLimit=2, cache=0.0, status=1)
    lim = limiter(db, redis_server.url, key_prefix, metrics=False)
    try:
        assert [lim.try_acquire(url) for _ in range(3)] == [True, True, False]
        assert lim.decide(url).reason == "limited"
    finally:
        lim.close()
    assert url not in label_values("interface")


async def test_the_asyncio_limiter_counts_the_same_way(
    migrated_db: tuple[str, Engine], redis_server: RedisServer, key_prefix: str
) -> None:
    db, engine = migrated_db
    url = f"/{key_prefix}/async"
    write_row(engine, url, rateLimit=2, cache=0.0, status=1)
    async with AsyncGatewayLimiter(
        database_url=db, redis_url=redis_server.url, key_prefix=key_prefix, reload_interval=3600
    ) as lim:
        admitted = await asyncio.gather(*(lim.try_acquire(url) for _ in range(5)))
        assert sorted(admitted) == [False, False, False, True, True]
        assert value("gateway_limiter_rule_permits_per_second", interface=url) == 2
    assert decided(url, "admitted") == 2
    assert decided(url, "limited", "refused") == 3
    assert value("gateway_limiter_wait_seconds_count", interface=url) == 2


def test_serve_exposes_the_default_registry_over_http(
    lim: GatewayLimiter, urls: dict[str, str]
) -> None:
    for _ in range(2):
        assert lim.try_acquire(urls["lim"])
    server = serve(0)
    try:
        reply = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10)
    finally:
        server.close()
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain")
    labels = f'interface="{urls["lim"]}",outcome="admitted",priority="default",reason="admitted"'
    series = f"{DECISIONS}{{{labels}}} 2.0"
    assert series in reply.text.splitlines()
    assert "gateway_limiter_rules_in_force 4.0" in reply.text.splitlines()
    with pytest.raises(httpx.ConnectError):  # closed: the port is released
        httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=2)


def test_tallies_lose_no_count_when_threads_decide_at_once() -> None:
    # The decision path's counters take no lock; concurrent bumps must still all count.
    from prometheus_client import CollectorRegistry

    from gateway_limiter.observe.metrics import ProcessMetrics

    registry = CollectorRegistry()
    own = ProcessMetrics(registry)

    def decide_many() -> None:
        for i in range(20_000):
            own.record("/t", "admitted", True, 0.0 if i % 4 else 30_000.0)  # 30 ms: 1 in 4

    threads = [threading.Thread(target=decide_many) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    labels = {"interface": "/t"}
    admitted = labels | {"outcome": "admitted", "reason": "admitted", "priority": "default"}
    assert registry.get_sample_value(DECISIONS, admitted) == 160_000
    assert registry.get_sample_value("gateway_limiter_wait_seconds_count", labels) == 160_000
    bucket = "gateway_limiter_wait_seconds_bucket"
    assert registry.get_sample_value(bucket, labels | {"le": "0.0"}) == 120_000
    assert registry.get_sample_value(bucket, labels | {"le": "0.025"}) == 120_000
    assert registry.get_sample_value(bucket, labels | {"le": "0.05"}) == 160_000
    waited = registry.get_sample_value("gateway_limiter_wait_seconds_sum", labels)
    assert waited == pytest.approx(40_000 * 0.03)
