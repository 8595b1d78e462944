"""Any row the table can hold: the reload applies the valid ones, skips the rest with a
warning naming the configId, never raises, and never writes a Redis key outside the prefix.

Rows go in through SQLAlchemy Core with bound parameters, into a real MariaDB (whose
column types bound the values) and into SQLite, which stores whatever it is given (text
in rateLimit, a blob in interfaceUrl), as an operator's sqlite3 shell would.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import (
    Column,
    Engine,
    Integer,
    MetaData,
    Table,
    delete,
    insert,
    select,
)
from sqlalchemy.types import NullType

from gateway_limiter import GatewayLimiter
from gateway_limiter.backends.state import caller_part, state_key
from gateway_limiter.cli import main
from gateway_limiter.config.migrate import upgrade
from gateway_limiter.config.rules import ALGORITHMS, MAX_URL_LENGTH, control_character
from gateway_limiter.config.table import CONF_TABLE, RateLimitConf, make_engine
from tests.support.limiting import CONF, scan_keys
from tests.support.services import RedisServer

INT11 = st.integers(-(2**31), 2**31 - 1)
#: Hostile text: quotes, braces, spaces, newlines, NUL, non-ASCII, emoji.
NASTY = st.text(
    alphabet=st.one_of(
        st.sampled_from("'\"`;{}[]()*?%_\\/ \t\r\n\x00-#:@é中🙂"),
        st.characters(codec="utf-8"),
    ),
    max_size=MAX_URL_LENGTH,
)


def nasty(max_size: int) -> st.SearchStrategy[str]:
    return NASTY.map(lambda s: s[:max_size])


def urls() -> st.SearchStrategy[str | None]:
    """Mostly a few shared URLs (duplicates), sometimes anything the column holds."""
    return st.one_of(
        st.sampled_from(["/ibe/flight/search", "/a b", "/q'uote", "/{tag}", "/é"]),
        nasty(MAX_URL_LENGTH),
        st.just(""),
        st.none(),
    )


# What MariaDB's column types allow (docs/design.md, "The table", with revision 0003).
typed_rows = st.fixed_dictionaries(
    {
        "channelType": st.one_of(st.none(), nasty(24)),
        "interfaceNo": st.one_of(st.none(), nasty(24)),
        "interfaceUrl": urls(),
        "rateLimit": st.one_of(st.none(), st.integers(0, 50), INT11),
        "cache": st.one_of(st.none(), st.integers(-999, 999).map(lambda c: c / 100)),  # FLOAT(3,2)
        "status": st.one_of(st.sampled_from([0, 1, 1]), st.integers(-128, 127)),
        "algorithm": st.one_of(st.none(), st.sampled_from(ALGORITHMS), nasty(16)),
        "maxPermits": st.one_of(st.none(), st.integers(1, 100), INT11),
        "warmupPeriod": st.one_of(
            st.none(),
            st.floats(0.25, 60, width=32),
            st.floats(width=32, allow_nan=False, allow_infinity=False),
        ),
    }
)

# Whatever SQLite keeps in any column (it has no column types, only affinities).
anything = st.one_of(
    st.none(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    nasty(40),
    st.binary(max_size=8),
)
untyped_rows = st.fixed_dictionaries(
    {
        "channelType": anything,
        "interfaceNo": anything,
        "interfaceUrl": st.one_of(urls(), anything),
        "rateLimit": st.one_of(st.integers(0, 50), anything),
        "cache": st.one_of(st.floats(0, 1), anything),
        "status": st.one_of(st.just(1), anything.filter(lambda v: v is not None)),  # NOT NULL
        "algorithm": st.one_of(st.none(), st.sampled_from(ALGORITHMS), anything),
        "maxPermits": st.one_of(st.none(), anything),
        "warmupPeriod": st.one_of(st.none(), anything),
        "lastModifyTime": st.one_of(st.none(), anything),
    }
)

PROPERTY = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@contextmanager
def started(db_url: str, server: RedisServer, prefix: str) -> Iterator[GatewayLimiter]:
    with GatewayLimiter(
        database_url=db_url,
        redis_url=server.url,
        key_prefix=prefix,
        reload_interval=3600,
        redis_timeout=2.0,  # a slow CI host must not send a decision to the policy
    ) as limiter:
        yield limiter


@pytest.fixture
def lim(
    migrated_any_db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str
) -> Iterator[GatewayLimiter]:
    with started(migrated_any_db[0], private_redis, key_prefix) as limiter:
        yield limiter


@pytest.fixture
def sqlite_engine(sqlite_db: str) -> Iterator[Engine]:
    engine = make_engine(sqlite_db)
    upgrade(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def sqlite_lim(
    sqlite_db: str, sqlite_engine: Engine, private_redis: RedisServer, key_prefix: str
) -> Iterator[GatewayLimiter]:
    with started(sqlite_db, private_redis, key_prefix) as limiter:
        yield limiter


def replace_rows(engine: Engine, table: Table, rows: list[dict[str, Any]]) -> None:
    """Empty the table, then insert ``rows`` with bound parameters, one statement each."""
    with engine.begin() as conn:
        conn.execute(delete(table))
        for row in rows:
            conn.execute(insert(table).values(**row))


def check_reload(
    lim: GatewayLimiter, engine: Engine, server: RedisServer, prefix: str, caplog: Any
) -> None:
    """The properties every reload of every table must have."""
    caplog.clear()
    server.client().flushall()  # keys of earlier examples' rules are not this table's
    summary = lim.reload()
    assert summary.ok, summary.error
    t = RateLimitConf.__table__
    with engine.connect() as conn:
        ids = [r[0] for r in conn.execute(select(t.c.configId).order_by(t.c.configId))]
    snapshot = lim.registry.snapshot
    applied = {rule.config_id for rule in snapshot.rules.values()}
    skipped = {s.config_id for s in snapshot.skipped}
    assert applied <= set(ids) and skipped <= set(ids)
    assert not applied & skipped
    # Every skipped row is named in a warning, once.
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    for s in snapshot.skipped:
        assert f"row skipped: configId {s.config_id}:" in warned
    # Every rule decides, on Redis, without an exception.
    for url, rule in snapshot.rules.items():
        assert isinstance(url, str) and 0 < len(url) <= MAX_URL_LENGTH
        assert rule.rate >= 0 and math.isfinite(rule.cache) and 0 <= rule.cache <= 9.99
        assert isinstance(lim.try_acquire(url, timeout=0), bool)
        lim.reserve(url, 2, 0.0)
    assert lim.backend_healthy and lim.backend_fallbacks == 0
    # ... and never writes a key that is not one of theirs, under the prefix.
    mine = {
        state_key(prefix, limit) + (caller_part(None) if limit.per_caller else "")
        for rule in snapshot.rules.values()
        for limit in rule.limits
    }  # every kind of limit (bucket, sliding or fixed window), period and scope
    keys = scan_keys(server.client())
    assert keys <= mine, keys - mine
    assert all(k.startswith(f"{prefix}:{{") for k in keys)


def check_conf_list(db_url: str, lim: GatewayLimiter, capsys: pytest.CaptureFixture[str]) -> None:
    """``conf list`` shows the same table without a traceback, naming what is skipped."""
    capsys.readouterr()
    assert main(["--database-url", db_url, "conf", "list"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    for s in lim.registry.snapshot.skipped:
        assert f"skipped by the reload: configId {s.config_id}:" in out


@PROPERTY
@given(rows=st.lists(typed_rows, min_size=1, max_size=8))
def test_any_row_the_column_types_allow_is_applied_or_skipped_with_a_warning(
    lim: GatewayLimiter,
    migrated_any_db: tuple[str, Engine],
    private_redis: RedisServer,
    key_prefix: str,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    rows: list[dict[str, Any]],
) -> None:
    db_url, engine = migrated_any_db
    caplog.set_level(logging.WARNING, logger="gateway_limiter")
    replace_rows(engine, CONF, [])
    lim.reload()  # an empty table between examples: every skip is news again
    replace_rows(engine, CONF, rows)
    check_reload(lim, engine, private_redis, key_prefix, caplog)
    check_conf_list(db_url, lim, capsys)
    # A plainly valid, unique, enabled row is always applied.
    snapshot = lim.registry.snapshot
    for row in rows:
        url = row["interfaceUrl"]
        plain = (
            row["status"] == 1
            and isinstance(url, str)
            and url
            and control_character(url) is None  # such a URL is skipped, naming it
            and row["rateLimit"] is not None
            and row["rateLimit"] >= 0
            and (row["cache"] is None or row["cache"] >= 0)
            and row["algorithm"] in (None, "token_bucket")
            and (row["maxPermits"] is None or row["maxPermits"] >= 1)
            # a bucket that fills within a year (periodSeconds is 1 here)
            and (row["maxPermits"] is None or row["maxPermits"] <= 365 * 86_400 * row["rateLimit"])
            and row["warmupPeriod"] is None
            and sum(r["interfaceUrl"] == url and r["status"] == 1 for r in rows) == 1
        )
        if plain:
            assert url in snapshot.rules


def untyped_table(engine: Engine) -> Table:
    """The limits table as SQLite sees it: columns that take any value."""
    columns = [
        Column(c.name, NullType() if c.name != "configId" else Integer, primary_key=c.primary_key)
        for c in RateLimitConf.__table__.columns
    ]
    return Table(CONF_TABLE, MetaData(), *columns)


@PROPERTY
@given(rows=st.lists(untyped_rows, min_size=1, max_size=6))
def test_any_value_sqlite_keeps_is_applied_or_skipped_never_a_failed_reload(
    sqlite_lim: GatewayLimiter,
    sqlite_db: str,
    sqlite_engine: Engine,
    private_redis: RedisServer,
    key_prefix: str,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    rows: list[dict[str, Any]],
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway_limiter")
    table = untyped_table(sqlite_engine)
    replace_rows(sqlite_engine, table, [])
    sqlite_lim.reload()
    replace_rows(sqlite_engine, table, rows)
    check_reload(sqlite_lim, sqlite_engine, private_redis, key_prefix, caplog)
    check_conf_list(sqlite_db, sqlite_lim, capsys)


@pytest.mark.parametrize(
    ("column", "value", "reason"),
    [
        ("rateLimit", "ten", "rateLimit 'ten' is not a whole number"),
        ("rateLimit", 2.5, "rateLimit 2.5 is not a whole number"),
        ("cache", "0.5s", "cache '0.5s' is not a number"),
        ("interfaceUrl", b"/ibe/x", "interfaceUrl b'/ibe/x' is not text"),
        ("maxPermits", "", "maxPermits '' is not a whole number"),
        ("warmupPeriod", "slow", "warmupPeriod 'slow' is not a number"),
    ],
)
def test_a_value_of_the_wrong_type_in_sqlite_skips_its_row_and_the_rest_apply(
    sqlite_lim: GatewayLimiter,
    sqlite_db: str,
    sqlite_engine: Engine,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    column: str,
    value: object,
    reason: str,
) -> None:
    # Before the fix, text in rateLimit raised TypeError out of reload() (and start()),
    # and text in cache a ValueError while reading: no limits in force at all; and
    # conf list died with a traceback on such a row.
    good = {"interfaceUrl": "/good", "rateLimit": 5, "cache": 0.1, "status": 1}
    bad = good | {"interfaceUrl": "/bad", column: value}
    replace_rows(sqlite_engine, untyped_table(sqlite_engine), [good, bad])
    caplog.set_level(logging.WARNING, logger="gateway_limiter")
    summary = sqlite_lim.reload()
    assert summary.ok
    assert list(sqlite_lim.registry.snapshot.rules) == ["/good"]
    named = "" if column == "interfaceUrl" else " (interfaceUrl '/bad')"  # when it is text
    assert [str(s) for s in summary.skipped] == [f"configId 2: {reason}{named}"]
    assert re.search(f"row skipped: configId 2: {re.escape(reason + named)}", caplog.text)
    check_conf_list(sqlite_db, sqlite_lim, capsys)


@pytest.mark.parametrize(
    ("column", "hex_bytes", "reason"),
    [
        ("interfaceUrl", "2f62ff", r"interfaceUrl b'/b\xff' is not text"),
        ("algorithm", "c3", r"algorithm b'\xc3' is not text"),
        ("callerKey", "80", r"callerKey b'\x80' is not text"),
        ("channelType", "fe", r"channelType b'\xfe' is not text"),
    ],
)
def test_text_that_is_not_utf8_skips_its_row_and_later_edits_still_load(
    sqlite_lim: GatewayLimiter,
    sqlite_db: str,
    sqlite_engine: Engine,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    column: str,
    hex_bytes: str,
    reason: str,
) -> None:
    # SQLite keeps text that is not UTF-8; reading it raised OperationalError ("Could not
    # decode to UTF-8 column") out of the whole query: "NO LIMITS IN FORCE", every other
    # row unenforced, and later edits never loaded.
    replace_rows(
        sqlite_engine,
        untyped_table(sqlite_engine),
        [
            {"interfaceUrl": "/good", "rateLimit": 5, "cache": 0.1, "status": 1},
            {"interfaceUrl": "/bad", "rateLimit": 5, "cache": 0.1, "status": 1, "perCaller": 1},
        ],
    )
    with sqlite_engine.begin() as conn:
        conn.exec_driver_sql(
            f"update {CONF_TABLE} set {column} = CAST(X'{hex_bytes}' AS TEXT) where configId = 2"
        )
    caplog.set_level(logging.WARNING, logger="gateway_limiter")
    summary = sqlite_lim.reload()
    assert summary.ok, summary.error
    assert list(sqlite_lim.registry.snapshot.rules) == ["/good"]
    named = "" if column == "interfaceUrl" else " (interfaceUrl '/bad')"  # when it is text
    assert [str(s) for s in summary.skipped] == [f"configId 2: {reason}{named}"]
    assert "NO LIMITS" not in caplog.text
    check_conf_list(sqlite_db, sqlite_lim, capsys)
    with sqlite_engine.begin() as conn:  # a later edit is loaded
        conn.exec_driver_sql(f"update {CONF_TABLE} set rateLimit = 7 where configId = 1")
    assert sqlite_lim.reload().ok
    assert sqlite_lim.registry.snapshot.rules["/good"].rate == 7
    assert "Traceback" not in caplog.text and not [
        r for r in caplog.records if r.levelno >= logging.ERROR
    ]


@pytest.mark.parametrize("warmup", [1e-305, 5e-324, 0.0009])
def test_a_warm_up_too_short_to_compute_is_skipped_naming_it_not_an_outage(
    sqlite_lim: GatewayLimiter, sqlite_engine: Engine, warmup: float
) -> None:
    # 1e-305 s was accepted: the warm-up slope overflowed, the script failed, the breaker
    # opened for every interface, and the fallback raised "cannot convert float NaN to
    # integer" to the caller.
    replace_rows(
        sqlite_engine,
        untyped_table(sqlite_engine),
        [
            {"interfaceUrl": "/good", "rateLimit": 5, "cache": 0.1, "status": 1},
            {
                "interfaceUrl": "/wu",
                "rateLimit": 1000,
                "cache": 0.1,
                "status": 1,
                "algorithm": "warm_up",
                "warmupPeriod": warmup,
            },
        ],
    )
    summary = sqlite_lim.reload()
    assert [str(s) for s in summary.skipped] == [
        f"configId 2: warm_up needs warmupPeriod from 0.001 to 3600 seconds, got {warmup!r}"
        " (interfaceUrl '/wu')"
    ]
    assert sqlite_lim.try_acquire("/wu", timeout=0) and sqlite_lim.try_acquire("/good", timeout=0)
    assert sqlite_lim.backend_healthy and sqlite_lim.backend_fallbacks == 0


@pytest.mark.parametrize(
    ("max_permits", "rate", "period"), [(2**53, 1, 1), (2**31 - 1, 1, 86_400), (366, 1, 86_400)]
)
def test_a_bucket_that_takes_over_a_year_to_fill_is_skipped_naming_it(
    sqlite_lim: GatewayLimiter, sqlite_engine: Engine, max_permits: int, rate: int, period: int
) -> None:
    # Its key's expiry (when it would be full again) was more than Redis takes: every
    # decision on the interface failed in the script.
    row = {"interfaceUrl": "/big", "rateLimit": rate, "cache": 0.5, "status": 1}
    replace_rows(
        sqlite_engine,
        untyped_table(sqlite_engine),
        [row | {"maxPermits": max_permits, "periodSeconds": period}],
    )
    summary = sqlite_lim.reload()
    assert [str(s) for s in summary.skipped] == [
        f"configId 1: maxPermits {max_permits} takes more than a year to fill at rateLimit "
        f"{rate} per {period} s (interfaceUrl '/big')"
    ]
    replace_rows(sqlite_engine, untyped_table(sqlite_engine), [row | {"maxPermits": 365}])
    assert sqlite_lim.reload().skipped == ()
    assert sqlite_lim.try_acquire("/big", permits=2, timeout=0.5)
    assert sqlite_lim.backend_healthy and sqlite_lim.backend_fallbacks == 0
