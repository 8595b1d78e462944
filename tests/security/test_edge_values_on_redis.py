"""Every column and argument at its edges, against a real redis-server and a real Redis
Cluster of 3 masters: 0, 1, tiny and huge floats, 2**31 - 1, 2**53, NaN and infinities
where SQLite keeps them, control and non-UTF-8 bytes, braces and colons in URLs, keys
and channels, a URL that begins with ``}``.

Each value works within its promise or is refused with a clear error naming it: a row
the reload cannot use is skipped naming its configId (the reload still succeeds), an
argument the call cannot serve is a TypeError or ValueError naming the argument. And,
whatever the values:

- nothing is ever taken for a Redis outage: the breaker stays closed, the failure
  policy decides nothing (a script error on a value would open it);
- no exception reaches the caller but those the docs name;
- no script call costs Redis more than a few milliseconds (Redis' own SLOWLOG, at a
  threshold a loaded host still meets), and no call takes a caller long.

Rows go into SQLite, which keeps whatever it is given (MariaDB's column types bound
the values; ``test_hostile_rows.py`` drives those). Examples are few and bounded so
each property runs in seconds.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Column, Engine, Integer, MetaData, Table, delete, insert, text
from sqlalchemy.types import NullType

from gateway_limiter import GatewayLimiter, Refused
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.config.migrate import upgrade
from gateway_limiter.config.table import CONF_TABLE, RateLimitConf, make_engine
from tests.support.clusters import LocalCluster
from tests.support.services import RedisServer

#: A script call that takes Redis this long (µs) is a failure: the stall this guards
#: against took 1.2 s. Redis times a command by the wall clock, so a host whose other
#: work keeps redis-server off the CPU lengthens it too: a fresh-clone run saw a 48 KB
#: SCRIPT LOAD take 64 ms and one EVALSHA 93 ms while other jobs were installing
#: packages. A quarter of a second stays well clear of both.
SLOW_US = 250_000
#: The most one call may take a caller here (a wall-clock bound for a loaded host).
SLOW_CALL_S = 2.0

INT11_MAX = 2**31 - 1
TINY = 5e-324
NAN = float("nan")
INF = float("inf")

#: URLs at the edges: braces (a hash tag, an empty one, one that opens another), colons
#: (the key's separator), a URL of 128 characters, non-ASCII, a channel row's ``*``.
URLS = ["/a", "}x", "}", "{}", "{x}", "a:b:{c}:", ":", "/é", "u" * 128, "*"]
#: Values that must be refused by the reload, naming the row.
BAD_URLS: list[str | bytes] = ["", "\x00/ctl", "/new\nline", "u" * 129, b"/\xff\xfe"]

rows = st.fixed_dictionaries(
    {
        "interfaceUrl": st.sampled_from([*URLS, *BAD_URLS]),
        "rateLimit": st.sampled_from([0, 1, 2, 1000, INT11_MAX, -1, None, 2**53]),
        "cache": st.sampled_from([None, 0.0, -0.0, TINY, 0.01, 9.99, 1e300, INF, -1.0]),
        "periodSeconds": st.sampled_from([1, 1, 2, 60, 86_400, 0, 86_401]),
        "algorithm": st.sampled_from(
            [None, "token_bucket", "warm_up", "sliding_window", "fixed_window", "x{y}"]
        ),
        "maxPermits": st.sampled_from([None, None, 1, INT11_MAX, 0]),
        "warmupPeriod": st.sampled_from([None, TINY, 1e-305, 0.001, 1.0, 3600.0, INF]),
        "perCaller": st.sampled_from([0, 0, 1]),
        "callerKey": st.sampled_from([None, None, "vip", "{k}", "a:b", "\x01", "é" * 64]),
        "channelType": st.sampled_from([None, None, "IBE+", "{c}", "}", "a:b"]),
        "maxConcurrent": st.sampled_from([None, None, 0, 1, INT11_MAX, -1]),
        "leaseMs": st.sampled_from([None, None, 0, 1, 60_000, 60_001]),
        "shadow": st.sampled_from([0, 0, 1]),
        "status": st.just(1),
    }
)
permits = st.sampled_from([1, 1, 2, 1000, 1001, INT11_MAX, 2**53, 0, -1])
timeouts = st.sampled_from([None, 0, 0.0, TINY, 1e-300, 0.5, 9.99, 1e16, 2**53, 1e308, INF, NAN])
keys = st.sampled_from([None, "", "vip", "{k}", "}", "a:b", "\x00\x01", "é" * 200, "\ud800"])
retry_afters = st.sampled_from([None, 0, TINY, 1.0, 86_400, 86_401, NAN, INF, -1])
calls = st.lists(
    st.tuples(
        st.sampled_from(["reserve", "try_acquire", "decide", "slot", "pushback", "in_flight"]),
        st.sampled_from([*URLS, "/none"]),
        permits,
        timeouts,
        keys,
        retry_afters,
    ),
    min_size=1,
    max_size=6,
)

PROPERTY = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def untyped_table() -> Table:
    """The limits table as SQLite sees it: columns that take any value."""
    columns = [
        Column(c.name, NullType() if c.name != "configId" else Integer, primary_key=c.primary_key)
        for c in RateLimitConf.__table__.columns
    ]
    return Table(CONF_TABLE, MetaData(), *columns)


def write_rows(engine: Engine, written: list[dict[str, Any]]) -> None:
    """Replace the table's rows; a bytes URL is stored as TEXT that is not UTF-8."""
    table = untyped_table()
    with engine.begin() as conn:
        conn.execute(delete(table))
        for row in written:
            url = row["interfaceUrl"]
            if isinstance(url, bytes):
                conn.execute(insert(table).values(**(row | {"interfaceUrl": "?"})))
                conn.execute(
                    text(
                        f"update {CONF_TABLE} set interfaceUrl = CAST(X'{url.hex()}' AS TEXT) "
                        "where configId = (select max(configId) from t_ratelimite_conf)"
                    )
                )
            else:
                conn.execute(insert(table).values(**row))


@pytest.fixture(scope="module")
def three_masters() -> Iterator[LocalCluster]:
    """A Redis Cluster of 3 masters (no replicas: nothing here fails over)."""
    cluster = LocalCluster(masters=3).start()
    yield cluster
    cluster.stop()


@pytest.fixture(params=["redis", "cluster"])
def store(
    request: pytest.FixtureRequest, private_redis: RedisServer, three_masters: LocalCluster
) -> tuple[str, list[redis.Redis]]:
    """Where the limits live: (its URL, a client of every master), the slow log armed."""
    if request.param == "redis":
        url, clients = private_redis.url, [private_redis.client()]
    else:
        url, clients = three_masters.url, [n.client() for n in three_masters.running()]
    for client in clients:
        client.config_set("slowlog-log-slower-than", SLOW_US)
        client.slowlog_reset()
        # a bound on what one script may build, should one ever try (refused: OOM)
        client.config_set("maxmemory", "256mb")
    return url, clients


@pytest.fixture
def edge_db(tmp_path: Any) -> Iterator[tuple[str, Engine]]:
    url = f"sqlite:///{tmp_path / 'edge.db'}"
    engine = make_engine(url)
    upgrade(engine)
    yield url, engine
    engine.dispose()


@pytest.fixture
def lim(
    edge_db: tuple[str, Engine], store: tuple[str, list[redis.Redis]], key_prefix: str
) -> Iterator[GatewayLimiter]:
    with GatewayLimiter(
        database_url=edge_db[0],
        redis_url=store[0],
        key_prefix=key_prefix,
        reload_interval=3600,
        audit_sql_changes=False,
        slot_lease=0.5,
        # a slow CI host must not send a decision to the policy
        redis_timeout=2.0,
        redis_timeout_ceiling=2.0,
    ) as limiter:
        yield limiter


NAMES = ("url", "permits", "timeout", "key", "retry_after")


def no_wait(timeout: Any) -> Any:
    """A timeout that never sleeps: 0 in place of any valid one, a bad one as it is."""
    valid = isinstance(timeout, (int, float)) and 0 <= timeout <= 1e308
    return 0 if timeout is None or valid else timeout


def one_call(lim: GatewayLimiter, call: tuple[Any, ...]) -> None:
    """Make ``call``; only what the docs name may come out of it."""
    kind, url, n, timeout, key, retry_after = call
    try:
        if kind == "reserve":
            lim.reserve(url, n, timeout, key)
        elif kind == "try_acquire":
            lim.try_acquire(url, n, no_wait(timeout), key)
        elif kind == "decide":
            lim.decide(url, n, no_wait(timeout), key)
        elif kind == "slot":
            with lim.slot(url, 0, key):
                pass
        elif kind == "pushback":
            lim.pushback(url, retry_after, key)
        else:
            in_flight = lim.in_flight(url)
            assert in_flight is None or in_flight >= 0
    except (TypeError, ValueError) as e:
        assert any(name in str(e) for name in NAMES), e
    except Refused:
        assert kind == "slot"


@PROPERTY
@given(written=st.lists(rows, min_size=1, max_size=4), made=calls)
def test_any_row_and_call_at_the_edges_is_served_or_refused_naming_it(
    lim: GatewayLimiter,
    edge_db: tuple[str, Engine],
    store: tuple[str, list[redis.Redis]],
    written: list[dict[str, Any]],
    made: list[tuple[Any, ...]],
) -> None:
    write_rows(edge_db[1], written)
    summary = lim.reload()
    assert summary.ok, summary.error
    for call in made:
        started = time.monotonic()
        one_call(lim, call)
        assert time.monotonic() - started < SLOW_CALL_S, call
    # Never an outage: every script call was Redis' to decide, and Redis decided it.
    assert lim.backend_healthy and lim.backend_fallbacks == 0
    slow = [e for c in store[1] for e in c.slowlog_get(16)]
    assert slow == [], slow


RATES = [1, 2, 1000, INT11_MAX]
PERIODS = [1, 60, 86_400]
WINDOWED = ["token_bucket", "sliding_window", "fixed_window"]
PERMITS = [1, 2, 1000, 1001, 10_000, INT11_MAX]
BUDGETS = [0.0, TINY, 9.99, 1e16, 2**53, 1e308]


def test_permits_at_the_edges_of_a_limit_are_served_or_refused_before_redis(
    lim: GatewayLimiter, edge_db: tuple[str, Engine], store: tuple[str, list[redis.Redis]]
) -> None:
    # Every (rate, period, algorithm) x (permits, timeout): a reload per limit, a round
    # trip per call, a few seconds in all.
    url = "}edge:{p}"  # an empty hash tag were it not handled
    for rate, period, algorithm in itertools.product(RATES, PERIODS, WINDOWED):
        row = {"interfaceUrl": url, "rateLimit": rate, "periodSeconds": period, "status": 1}
        write_rows(edge_db[1], [row | {"algorithm": algorithm, "cache": 0.0}])
        assert lim.reload().ok
        for n, timeout in itertools.product(PERMITS, BUDGETS):
            case = (rate, period, algorithm, n, timeout)
            try:
                verdict = lim.reserve(url, n, timeout)
            except ValueError as e:  # only what the docs say cannot be served
                assert "permits must be at most" in str(e) and repr(url) in str(e), case
                assert (algorithm == "sliding_window" and 1000 < n <= rate) or (
                    algorithm == "token_bucket" and n * period / rate > 365 * 86_400
                ), case
            else:
                if verdict.allowed:
                    assert verdict.wait_us <= min(timeout, 365 * 86_400) * 1e6 + 1, case
                    assert math.isfinite(verdict.wait_us), case
            assert lim.backend_healthy and lim.backend_fallbacks == 0, case
    assert [e for c in store[1] for e in c.slowlog_get(16)] == []


#: Each column's edges (docs/design.md, "The table"): every value is tried alone, on an
#: otherwise valid row of each algorithm it can go with.
EDGES: dict[str, list[Any]] = {
    "interfaceUrl": [*URLS[:-1], *BAD_URLS],
    "rateLimit": [0, 1, 2, INT11_MAX, -1, None, 2**53, 2.5],
    "cache": [None, 0.0, -0.0, TINY, 9.99, 10.0, 1e300, INF, -INF, NAN],
    "periodSeconds": [1, 86_400, 0, 86_401, -1, 2**53],
    "maxPermits": [1, INT11_MAX, 0, -1, 2**53],
    "warmupPeriod": [TINY, 1e-305, 0.0009, 0.001, 3600.0, 3600.5, INF, NAN, -1.0],
    "perCaller": [0, 1, 2],
    "callerKey": ["", "vip", "{k}", "}", "a:b", "\x01", "é" * 64, "é" * 65],
    "channelType": ["IBE+", "{c}", "}", "a:b", "\x00", "c" * 24, "c" * 25],
    "maxConcurrent": [0, 1, INT11_MAX, -1, 2**53],
    "leaseMs": [0, 1, 60_000, 60_001, -1],
    "shadow": [0, 1, 2],
    "algorithm": ["", "x{y}", "TOKEN_BUCKET"],
}
ALL_ALGORITHMS = ["token_bucket", "warm_up", "sliding_window", "fixed_window"]
ALGORITHMS_OF = {
    "maxPermits": ["token_bucket"],
    "warmupPeriod": ["warm_up"],
    "rateLimit": ALL_ALGORITHMS,
    "periodSeconds": ALL_ALGORITHMS,
    "cache": ALL_ALGORITHMS,
}
#: The columns that make a key (a cluster's slots differ only there).
KEYED = ("interfaceUrl", "callerKey", "channelType", "perCaller")


def edge_rows(column: str, value: Any, algorithm: str, rate: int) -> list[dict[str, Any]]:
    """A valid row of ``algorithm`` with ``column`` at ``value`` (and what the column
    needs to mean anything: a per-caller row for callerKey, a channel row for
    channelType)."""
    row: dict[str, Any] = {
        "interfaceUrl": "/edge",
        "rateLimit": rate,
        "cache": 0.0,
        "periodSeconds": 1,
        "status": 1,
        "algorithm": algorithm,
        "warmupPeriod": 1.0 if algorithm == "warm_up" else None,
        column: value,
    }
    if column == "callerKey":
        row["perCaller"] = 1
    written = [row]
    if column == "channelType":
        written.append(
            {"interfaceUrl": "*", "rateLimit": 100, "cache": 0.0, "status": 1, "channelType": value}
        )
    return written


def test_each_column_at_each_edge_is_served_or_skipped_naming_its_row(
    lim: GatewayLimiter, edge_db: tuple[str, Engine], store: tuple[str, list[redis.Redis]]
) -> None:
    # Every (column, value, algorithm), one after the other on one limiter: a few
    # milliseconds each (on a cluster, the columns that make a key). The URL of the
    # row is called in every way the API has.
    tried = 0
    cluster = store[0].startswith("redis+cluster")
    for column, values in EDGES.items():
        if cluster and column not in KEYED:
            continue
        for value in values:
            for algorithm, rate in itertools.product(
                ALGORITHMS_OF.get(column, ["token_bucket", "sliding_window"]),
                (1, 1000) if column in ("warmupPeriod", "maxPermits") else (1000,),
            ):
                written = edge_rows(column, value, algorithm, rate)
                write_rows(edge_db[1], written)
                summary = lim.reload()
                assert summary.ok, (column, value, summary.error)
                url = written[0]["interfaceUrl"]
                if not isinstance(url, str):
                    url = "/edge"
                for key in (None, "vip") if column in KEYED else (None,):
                    for call in (
                        ("reserve", url, 1, 0, key, None),
                        ("reserve", url, 2, 0.5, key, None),
                        ("reserve", url, 1000, 1e16, key, None),
                        ("reserve", url, INT11_MAX, 1e16, key, None),
                        ("slot", url, 1, 0, key, None),
                        ("pushback", url, 1, None, key, None),
                        ("in_flight", url, 1, None, key, None),
                    ):
                        one_call(lim, call)
                state = (column, value, algorithm, rate)
                assert lim.backend_healthy and lim.backend_fallbacks == 0, state
                tried += 1
    assert tried > (60 if cluster else 150)
    slow = [e for c in store[1] for e in c.slowlog_get(16)]
    assert slow == [], slow


async def one_async_call(lim: AsyncGatewayLimiter, call: tuple[Any, ...]) -> None:
    """``one_call`` for the asyncio limiter."""
    kind, url, n, timeout, key, retry_after = call
    try:
        if kind == "reserve":
            await lim.reserve(url, n, timeout, key)
        elif kind == "try_acquire":
            await lim.try_acquire(url, n, no_wait(timeout), key)
        elif kind == "decide":
            await lim.decide(url, n, no_wait(timeout), key)
        elif kind == "slot":
            async with lim.slot(url, 0, key):
                pass
        elif kind == "pushback":
            await lim.pushback(url, retry_after, key)
        else:
            in_flight = await lim.in_flight(url)
            assert in_flight is None or in_flight >= 0
    except (TypeError, ValueError) as e:
        assert any(name in str(e) for name in NAMES), e
    except Refused:
        assert kind == "slot"


@pytest.fixture
def async_lim(
    edge_db: tuple[str, Engine], store: tuple[str, list[redis.Redis]], key_prefix: str
) -> Iterator[tuple[asyncio.Runner, AsyncGatewayLimiter]]:
    """A started asyncio limiter and the one event loop it lives on, across examples."""
    with asyncio.Runner() as runner:
        lim = AsyncGatewayLimiter(
            database_url=edge_db[0],
            redis_url=store[0],
            key_prefix=key_prefix,
            reload_interval=3600,
            audit_sql_changes=False,
            slot_lease=0.5,
            redis_timeout=2.0,
            redis_timeout_ceiling=2.0,
        )
        runner.run(lim.start())
        try:
            yield runner, lim
        finally:
            runner.run(lim.aclose())


@settings(PROPERTY, max_examples=25)
@given(written=st.lists(rows, min_size=1, max_size=4), made=calls)
def test_the_asyncio_limiter_serves_or_refuses_the_edges_alike(
    async_lim: tuple[asyncio.Runner, AsyncGatewayLimiter],
    edge_db: tuple[str, Engine],
    store: tuple[str, list[redis.Redis]],
    written: list[dict[str, Any]],
    made: list[tuple[Any, ...]],
) -> None:
    runner, lim = async_lim
    write_rows(edge_db[1], written)

    async def check() -> None:
        summary = await lim.reload()
        assert summary.ok, summary.error
        for call in made:
            started = time.monotonic()
            await one_async_call(lim, call)
            assert time.monotonic() - started < SLOW_CALL_S, call

    runner.run(check())
    assert lim.backend_healthy and lim.backend_fallbacks == 0
    assert [e for c in store[1] for e in c.slowlog_get(16)] == []
