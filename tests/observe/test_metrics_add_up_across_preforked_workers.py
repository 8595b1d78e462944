"""Metrics under a pre-forking server (gunicorn and the like): prometheus-client's
multiprocess mode (docs/observability.md, "Pre-forking servers").

Three real worker processes, started with ``PROMETHEUS_MULTIPROC_DIR`` set, each decide
through their own limiter on a real MariaDB and Redis; one of them records a pushback.
A ``MultiProcessCollector`` over the directory then shows the sum of their counters and
one sensible value per gauge (not one per worker).
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from sqlalchemy.engine import Engine

from tests.support.limiting import write_row

OPEN = "/ibe/open"
TIGHT = "/ibe/tight"
WORKERS = 3
CALLS = 20
TIGHT_CALLS = 5


def _worker(db: str, redis_url: str, prefix: str, index: int, out: Any, started: Any) -> None:
    """A pre-forked worker: its own limiter, deciding; once every worker has started, the
    first one is told to back off."""
    from gateway_limiter import GatewayLimiter
    from gateway_limiter.observe.metrics import multiprocess_mode, process_metrics

    settings = {"database_url": db, "redis_url": redis_url, "key_prefix": prefix}
    with GatewayLimiter(**settings, redis_timeout=2.0, reload_interval=3600) as lim:
        admitted = sum(lim.try_acquire(OPEN, timeout=0) for _ in range(CALLS))
        tight = sum(lim.try_acquire(TIGHT, timeout=0) for _ in range(TIGHT_CALLS))
        started.wait(60)
        if index == 0:
            lim.pushback(OPEN)  # the supplier said 429: the effective rate halves
        metrics = process_metrics()
        out.put((multiprocess_mode(), metrics is not None and metrics.multiprocess))
        out.put((admitted, tight))


def samples(directory: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], list[float]]:
    """Every sample a MultiProcessCollector scrape gives, by name and labels."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
    found: dict[tuple[str, tuple[tuple[str, str], ...]], list[float]] = {}
    for family in registry.collect():
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            found.setdefault(key, []).append(sample.value)
    return found


def test_a_scrape_adds_up_the_workers_counters_and_keeps_one_value_per_gauge(
    limiter_db: tuple[str, Engine],
    limiter_redis_url: str,
    key_prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    db, engine = limiter_db
    write_row(engine, OPEN, rateLimit=1000, cache=0)
    write_row(engine, TIGHT, add=True, rateLimit=1, cache=0)
    directory = tmp_path / "prometheus"
    directory.mkdir()
    # what a pre-forking server's workers inherit (spawned: prometheus-client is imported
    # afresh in each, with the variable set)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    ctx = multiprocessing.get_context("spawn")
    out, started = ctx.Queue(), ctx.Barrier(WORKERS)
    procs = [
        ctx.Process(target=_worker, args=(db, limiter_redis_url, key_prefix, i, out, started))
        for i in range(WORKERS)
    ]
    for proc in procs:
        proc.start()
    try:
        got = [out.get(timeout=120) for _ in range(2 * WORKERS)]
    finally:
        for proc in procs:
            proc.join(60)
    assert all(proc.exitcode == 0 for proc in procs)
    modes = [g for g in got if isinstance(g[0], bool)]
    assert modes == [(True, True)] * WORKERS  # each worker wrote its metrics to files
    counts = [g for g in got if not isinstance(g[0], bool)]
    assert [admitted for admitted, _ in counts] == [CALLS] * WORKERS
    tight_admitted = sum(tight for _, tight in counts)
    assert 1 <= tight_admitted < WORKERS * TIGHT_CALLS

    found = samples(directory)

    def one(name: str, **labels: str) -> float:
        values = found[(name, tuple(sorted(labels.items())))]
        assert len(values) == 1, (name, labels, values)  # one series, not one per worker
        return values[0]

    decisions = "gateway_limiter_decisions_total"
    default = {"priority": "default"}
    assert one(decisions, interface=OPEN, outcome="admitted", reason="admitted", **default) == 60
    assert one(decisions, interface=TIGHT, outcome="admitted", reason="admitted", **default) == (
        tight_admitted
    )
    refused = WORKERS * TIGHT_CALLS - tight_admitted
    assert one(decisions, interface=TIGHT, outcome="refused", reason="limited", **default) == (
        refused
    )
    assert one("gateway_limiter_wait_seconds_count", interface=OPEN) == WORKERS * CALLS
    assert one("gateway_limiter_wait_seconds_bucket", interface=OPEN, le="0.0") == 60
    assert one("gateway_limiter_reloads_total", outcome="ok") >= WORKERS  # one each at start
    # gauges: what the table says, once, whichever worker said it last
    assert one("gateway_limiter_rules_in_force") == 2
    assert one("gateway_limiter_switch_on") == 1
    assert one("gateway_limiter_rule_permits_per_second", interface=TIGHT) == 1
    assert one("gateway_limiter_rule_permits_per_second", interface=OPEN) == 1000
    # the pushback worker 0 recorded: the most recent effective rate is the halved one
    assert 500 <= one("gateway_limiter_effective_rate", interface=OPEN) < 550
    assert one("gateway_limiter_fleet_size") >= 1
