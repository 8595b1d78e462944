"""The database fails in every way while callers call: the reload never raises into a
caller, never delays a decision, keeps the last good snapshot, and never applies half a
table. And a 10,000-row table reloads in well under a second.

The database sits behind a TCP relay the test can cut (connections reset, new ones
refused) or hang (accepted, never answered), in front of the real MariaDB.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import Engine, delete, event, insert, update
from sqlalchemy.engine import make_url

from gateway_limiter import GatewayLimiter
from gateway_limiter.config.migrate import upgrade
from gateway_limiter.config.reload import Snapshot
from gateway_limiter.config.table import make_engine
from tests.support.limiting import CONF, write_row
from tests.support.services import RedisServer, TcpProxy
from tests.support.waiting import wait_for

#: A decision reads the snapshot and asks Redis: a database problem must not show in
#: its latency. A call that waited on the database would wait out the driver's
#: timeouts (``make_engine``: 5 s; the hung relay never answers), so
#: any call under that did not. The bound sits below it with room for a loaded host,
#: whose scheduler alone once held a call 334 ms (4 caller threads, a reload thread
#: and the relay's on 2 cores).
DECISION_BOUND = 0.75
Figures = Callable[..., None]


@dataclass
class Callers:
    """Threads calling try_acquire on ``urls`` until stopped; errors and the slowest call."""

    lim: GatewayLimiter
    urls: list[str]
    errors: list[BaseException] = field(default_factory=list)
    slowest: float = 0.0
    calls: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                self.lim.try_acquire(self.urls[i % len(self.urls)], timeout=0)
            except BaseException as e:  # any exception is the failure here
                self.errors.append(e)
            self.slowest = max(self.slowest, time.perf_counter() - t0)
            self.calls += 1
            i += 1
            time.sleep(0.002)

    def __enter__(self) -> Callers:
        self.threads = [threading.Thread(target=self.run) for _ in range(4)]
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(10)


@pytest.fixture
def proxied(migrated_db: tuple[str, Engine]) -> Iterator[tuple[str, TcpProxy]]:
    """The test's MariaDB database, reached through a relay: (URL via the relay, relay)."""
    url, engine = migrated_db
    write_row(engine, "/a", rateLimit=1000, cache=0.0, status=1)
    write_row(engine, "/b", rateLimit=500, cache=0.0, status=1)
    real = make_url(url)
    proxy = TcpProxy(real.host or "127.0.0.1", real.port or 3306).start()
    yield real.set(host="127.0.0.1", port=proxy.port).render_as_string(False), proxy
    proxy.cut()


def failed_reloads() -> float:
    """Reloads that failed in this process, as the metrics count them."""
    return REGISTRY.get_sample_value("gateway_limiter_reloads_total", {"outcome": "failed"}) or 0.0


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["cut", "hang"])
def test_a_database_that_goes_away_or_stops_answering_never_reaches_a_caller(
    proxied: tuple[str, TcpProxy],
    redis_server: RedisServer,
    key_prefix: str,
    fault: str,
    caplog: pytest.LogCaptureFixture,
    figures: Figures,
) -> None:
    db_url, proxy = proxied
    caplog.set_level(logging.WARNING, logger="gateway_limiter")
    lim = GatewayLimiter(
        database_url=db_url, redis_url=redis_server.url, key_prefix=key_prefix, reload_interval=0.2
    )
    failed_at = [0.0]
    try:
        assert lim.start().ok
        good = lim.registry.snapshot
        with Callers(lim, ["/a", "/b", "/unlimited"]) as callers:
            wait_for(lambda: callers.calls >= 50, 5, "the callers deciding")
            getattr(proxy, fault)()
            # A caller of reload() gets a summary, never an exception (a hung database
            # costs it the driver's timeouts; callers of try_acquire, nothing).
            started = time.monotonic()
            summary = lim.reload()
            failed_at[0] = time.monotonic() - started
            assert not summary.ok and summary.error
            # From now on every scheduled reload fails: the last good snapshot stays.
            held = lim.registry.snapshot
            assert held.rules == good.rules
            failed = failed_reloads()
            wait_for(lambda: failed_reloads() >= failed + 2, 30, "two scheduled reloads failing")
            assert lim.registry.snapshot is held
            proxy.restore()
            wait_for(lambda: lim.registry.snapshot is not held, 30)
        assert callers.errors == []
        assert callers.slowest < DECISION_BOUND
        assert callers.calls > 100
    finally:
        lim.close()
    assert lim.registry.snapshot.rules == good.rules
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    # The database's outage is told once. A loaded host may also time out a Redis call,
    # which says so in a line of its own: that one is not the database's.
    told = [m for m in errors if "redis" not in m.lower()]
    assert len(told) == 1 and "keeping the last good limits" in told[0], errors
    assert any("reachable again" in r.getMessage() for r in caplog.records)
    figures(
        f"database {fault}",
        reload_call_s=round(failed_at[0], 2),
        slowest_decision_ms=round(callers.slowest * 1000, 1),
        decisions=callers.calls,
    )


def test_a_dropped_table_keeps_the_last_good_limits_until_it_is_back(
    migrated_any_db: tuple[str, Engine], redis_server: RedisServer, key_prefix: str
) -> None:
    db_url, engine = migrated_any_db
    write_row(engine, "/a", rateLimit=2, cache=0.0, status=1)
    with GatewayLimiter(
        database_url=db_url, redis_url=redis_server.url, key_prefix=key_prefix, reload_interval=60
    ) as lim:
        good = lim.registry.snapshot
        CONF.drop(engine)
        summary = lim.reload()
        assert not summary.ok and "t_ratelimite_conf" in (summary.error or "")
        assert lim.registry.snapshot is good
        assert [lim.try_acquire("/a") for _ in range(3)] == [True, True, False]
        CONF.create(engine)  # back, empty: no limits is a valid table
        assert lim.reload().ok
        assert lim.registry.snapshot.rules == {}


@pytest.mark.slow
def test_rows_edited_during_reloads_never_give_half_a_table(
    migrated_any_db: tuple[str, Engine], redis_server: RedisServer, key_prefix: str
) -> None:
    """A writer changes every row in one transaction (rate = generation), deletes and
    inserts rows, and flips a row invalid and back, while reloads run from the
    scheduler and from three threads: every snapshot is one committed state."""
    db_url, engine = migrated_any_db
    urls = [f"/gen/{i}" for i in range(20)]
    t = CONF
    with engine.begin() as conn:
        conn.execute(
            insert(t), [{"interfaceUrl": u, "rateLimit": 1, "status": 1, "cache": 0} for u in urls]
        )
    lim = GatewayLimiter(
        database_url=db_url, redis_url=redis_server.url, key_prefix=key_prefix, reload_interval=0.05
    )
    stop = threading.Event()
    problems: list[str] = []
    seen: list[Snapshot] = []
    generations = [1]

    def writer() -> None:
        g = 1
        while not stop.is_set():
            g += 1
            with engine.begin() as conn:
                conn.execute(update(t).where(t.c.interfaceUrl.like("/gen/%")).values(rateLimit=g))
                conn.execute(delete(t).where(t.c.interfaceUrl == "/churn"))
                conn.execute(insert(t).values(interfaceUrl="/churn", rateLimit=g, status=1))
                conn.execute(
                    update(t).where(t.c.interfaceUrl == "/gen/0").values(status=2 if g % 2 else 1)
                )
            generations.append(g)

    def reloader() -> None:
        while not stop.is_set():
            try:
                lim.reload()
            except BaseException as e:  # the failure this test looks for
                problems.append(f"reload raised {e!r}")
            seen.append(lim.registry.snapshot)

    lim.start()
    threads = [threading.Thread(target=writer)] + [
        threading.Thread(target=reloader) for _ in range(3)
    ]
    try:
        with Callers(lim, urls) as callers:
            for th in threads:
                th.start()
            time.sleep(3.0)  # real time: how long the writer and the reloaders race
            stop.set()
            for th in threads:
                th.join(30)
        assert callers.errors == []
    finally:
        stop.set()
        lim.close()
    assert problems == []
    snapshots = {id(s): s for s in seen}.values()
    assert len(snapshots) > 10 and len(generations) > 10
    for s in snapshots:
        rates = {r.rate for u, r in s.rules.items() if u.startswith("/gen/")}
        assert len(rates) == 1, f"half a table: rates {sorted(rates)}"
        (g,) = rates
        # /churn and /gen/0 are of the same transaction as the rates
        if g > 1:
            assert s.rules["/churn"].rate == g
        else:
            assert "/churn" not in s.rules
        assert ("/gen/0" in s.rules) == (g % 2 == 0 or g == 1)


@pytest.mark.slow
@pytest.mark.parametrize("invalid", [0, 1000])
def test_a_10000_row_table_reloads_in_a_few_statements_and_linear_time(
    any_db: str,
    redis_server: RedisServer,
    key_prefix: str,
    invalid: int,
    figures: Figures,
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = make_engine(any_db)
    upgrade(engine)
    rows: list[dict[str, Any]] = [
        {
            "channelType": "IBE+",
            "interfaceNo": f"N{i}",
            "interfaceUrl": f"/svc/{i}/{'x' * 40}",
            "rateLimit": -1 if i < invalid else 1 + i % 500,
            "cache": 0.25,
            "status": 0 if i % 10 == 9 else 1,
        }
        for i in range(10_000)
    ]
    with engine.begin() as conn:
        conn.execute(insert(CONF), rows)
    caplog.set_level(logging.WARNING, logger="gateway_limiter")
    lim = GatewayLimiter(
        database_url=any_db, redis_url=redis_server.url, key_prefix=key_prefix, reload_interval=3600
    )
    statements: list[str] = []

    def sent(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if threading.get_ident() == reloader:  # not the limiter's own background threads
            statements.append(statement)

    reloader = threading.get_ident()

    event.listen(Engine, "before_cursor_execute", sent)
    try:
        times = []
        sent_per_reload = []
        for _ in range(3):
            del statements[:]
            t0 = time.perf_counter()
            summary = lim.reload()
            times.append(time.perf_counter() - t0)
            sent_per_reload.append(len(statements))
            assert summary.ok
        lim.start()
        assert summary.rules == sum(1 for r in rows if r["status"] == 1 and r["rateLimit"] > 0)
        assert len(summary.skipped) == sum(1 for r in rows[:invalid] if r["status"] == 1)
        assert caplog.text.count("row skipped") == len(summary.skipped)  # once each
        assert lim.try_acquire("/svc/1234/" + "x" * 40, timeout=0)
    finally:
        event.remove(Engine, "before_cursor_execute", sent)
        lim.close()
        engine.dispose()
    # The work, which no load changes: the whole table in one read, whatever its size
    # (the definition, the rows, the switch), never a statement per row.
    assert max(sent_per_reload) <= 3, statements
    # The time is bench/reload_cost.py's to measure (--rows 10000; a quiet host takes
    # 0.2-0.4 s, the contract is under a second): here only a ceiling that no loaded host
    # reaches (CI beside other suites measured medians up to 1.1 s) and that a reload
    # gone quadratic in Python over 10,000 rows (10^8 interpreted steps) would not keep.
    assert min(times) < 10.0
    figures(
        f"10,000-row reload on {any_db.split(':', maxsplit=1)[0]}, {invalid} invalid rows",
        first_s=round(times[0], 3),
        median_s=round(statistics.median(times), 3),
        best_s=round(min(times), 3),
    )
