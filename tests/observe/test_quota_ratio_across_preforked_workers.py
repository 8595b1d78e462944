"""The calendar quota's used ratio under a pre-forking server (prometheus-client's
multiprocess mode, ``PROMETHEUS_MULTIPROC_DIR``): real worker processes each write it
to their own file, and a ``MultiProcessCollector`` over the directory gives one value,
the one the latest decision saw, never a worker's stale one. A quota raised mid-day (or
a new period) lowers the ratio: the largest would keep the old one up."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from sqlalchemy.engine import Engine

from tests.support.limiting import write_row

URL = "/ibe/daily"
GAUGE = "gateway_limiter_quota_used_ratio"


def _worker(db: str, redis_url: str, prefix: str, calls: int, out: Any) -> None:
    """A pre-forked worker: its own limiter, ``calls`` decisions on the quota."""
    from gateway_limiter import GatewayLimiter

    settings = {"database_url": db, "redis_url": redis_url, "key_prefix": prefix}
    with GatewayLimiter(**settings, redis_timeout=2.0, reload_interval=3600) as lim:
        out.put(sum(lim.try_acquire(URL, timeout=0) for _ in range(calls)))


def ratios(directory: Path) -> list[float]:
    """The gauge's values a MultiProcessCollector scrape gives for the quota."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
    return [
        sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name == GAUGE and sample.labels == {"interface": URL, "period": "day"}
    ]


def test_the_scrape_gives_the_latest_workers_ratio(
    limiter_db: tuple[str, Engine],
    limiter_redis_url: str,
    key_prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    db, engine = limiter_db
    write_row(engine, URL, rateLimit=4, cache=0, quotaPeriod="day", timeZone="Asia/Shanghai")
    directory = tmp_path / "prometheus"
    directory.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()

    def run(calls: int) -> int:
        proc = ctx.Process(target=_worker, args=(db, limiter_redis_url, key_prefix, calls, out))
        proc.start()
        try:
            admitted = int(out.get(timeout=120))
        finally:
            proc.join(60)
        assert proc.exitcode == 0
        return admitted

    assert run(6) == 4  # the day's 4 spent by the first worker: 100 %
    assert ratios(directory) == [1.0]
    write_row(engine, URL, rateLimit=100)  # the contract raised mid-day
    assert run(1) == 1  # a second worker: 5 of 100
    assert ratios(directory) == [0.05]
