"""The limiters a benchmark builds: a limit table on a temporary SQLite file, a
``GatewayLimiter`` on it, the floors it is compared with, and its peers on one Redis."""

from __future__ import annotations

import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import redis

from bench.harness.timing import Attempt, Call
from gateway_limiter import GatewayLimiter
from gateway_limiter.config.migrate import upgrade
from gateway_limiter.config.table import make_engine, upsert_conf

#: Decided on every call, never limited in practice: the throughput rows.
OPEN_RATE = 10_000_000
OPEN_URL = "/bench/open"

#: The Redis commands any bucket decision needs (server clock, read, write, expiry),
#: with no logic: what is left of the gap to the floor after this is our own cost.
STATE_COMMANDS_LUA = """
local t = redis.call("TIME")
local s = redis.call("GET", KEYS[1])
redis.call("SET", KEYS[1], ARGV[1], "PX", 2000)
return {1, "0", ARGV[2], "0"}
"""


def write_rows(database_url: str, rows: dict[str, dict[str, Any]]) -> None:
    """Create the tables at ``database_url`` and one enabled row per URL of ``rows``
    (url -> columns by their model names, e.g. ``rate_limit``, ``cache``)."""
    engine = make_engine(database_url)
    try:
        upgrade(engine)
        for url, columns in rows.items():
            upsert_conf(engine, url, channel_type="BENCH", status=1, **columns)
    finally:
        engine.dispose()


def sqlite_table(
    stack: ExitStack, rows: dict[str, dict[str, Any]], prefix: str = "gwl-bench-db-"
) -> str:
    """``write_rows`` on a SQLite file removed when ``stack`` closes; its URL."""
    workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))
    database_url = f"sqlite:///{workdir / 'limits.db'}"
    write_rows(database_url, rows)
    return database_url


def started_limiter(
    stack: ExitStack,
    database_url: str,
    redis_url: str,
    key_prefix: str,
    *,
    expect_rules: int | None = None,
    **settings: Any,
) -> GatewayLimiter:
    """A started ``GatewayLimiter``, closed when ``stack`` closes.

    No reload may land inside a measurement (the rows never change during a run), and
    a Redis error shows as a refusal, counted, never hidden behind the in-process
    fallback that ``local`` would measure instead of Redis; ``settings`` override both.
    """
    settings = {"reload_interval": 3600, "on_backend_error": "deny", **settings}
    limiter = GatewayLimiter(
        database_url=database_url, redis_url=redis_url, key_prefix=key_prefix, **settings
    )
    summary = limiter.start()
    stack.callback(limiter.close)
    if expect_rules is not None and summary.rules != expect_rules:
        raise SystemExit(
            f"gateway-limiter loaded {summary} instead of the {expect_rules} benchmark rows"
        )
    return limiter


def floors(limiter: GatewayLimiter, run_id: str) -> tuple[Call, Call]:
    """EVALSHA of ``return 1``, and of the bare state commands, on the limiter's own client."""
    client: redis.Redis = limiter.backend.client
    bare = client.register_script("return 1")
    state = client.register_script(STATE_COMMANDS_LUA)
    key = f"gwlbench{run_id}:{{/bench/state}}:tb"
    args = ["0123456789012345678901234567890123456789", "9999999"]  # 40 bytes, like a state

    def bare_call() -> bool:
        return bool(bare() == 1)

    def state_call() -> bool:
        return bool(state(keys=[key], args=args)[0] == 1)

    return bare_call, state_call


def limits_moving_window(
    stack: ExitStack, redis_url: str, run_id: str, contended_rate: int
) -> tuple[Call, Attempt]:
    """``limits``: ``MovingWindowRateLimiter.hit`` on its Redis storage, on an open
    limit (OPEN_RATE) and on a contended one (``contended_rate`` per second)."""
    from limits import RateLimitItemPerSecond
    from limits.storage import storage_from_string
    from limits.strategies import MovingWindowRateLimiter

    storage = storage_from_string(redis_url)
    stack.callback(_close_limits_storage, storage)
    strategy = MovingWindowRateLimiter(storage)
    open_item = RateLimitItemPerSecond(OPEN_RATE)
    contended_item = RateLimitItemPerSecond(contended_rate)
    open_key, contended_key = f"bench{run_id}:open", f"bench{run_id}:contended"

    def call() -> bool:
        return bool(strategy.hit(open_item, open_key))

    def attempt() -> tuple[bool, float]:
        return bool(strategy.hit(contended_item, contended_key)), 0.0

    return call, attempt


def _close_limits_storage(storage: Any) -> None:
    client = getattr(storage, "storage", None)
    if client is not None:
        client.close()
        client.connection_pool.disconnect()


def pyrate(
    stack: ExitStack, redis_url: str, run_id: str, contended_rate: int, *, token_bucket: bool
) -> tuple[Call, Attempt]:
    """pyrate-limiter 4: a ``RedisBucket`` (sliding-window log) or a Redis ``TokenBucket``,
    ``try_acquire(blocking=False)`` on an open limit and on a contended one."""
    from pyrate_limiter import (
        Duration,
        Limiter,
        Rate,
        RedisBucket,
        RedisStateStore,
        StateBucket,
        TokenBucket,
    )

    client = redis.Redis.from_url(redis_url)
    stack.callback(client.close)

    def limiter(rate: int, key: str) -> Any:
        rates = [Rate(rate, Duration.SECOND)]  # burst defaults to the limit
        if token_bucket:
            bucket: Any = StateBucket(rates, TokenBucket(), RedisStateStore(client, key))
        else:
            bucket = RedisBucket.init(rates, client, key)
        lim = Limiter(bucket)
        stack.callback(lim.close)
        return lim

    kind = "tb" if token_bucket else "log"
    open_lim = limiter(OPEN_RATE, f"bench{run_id}:pyrate-{kind}:open")
    contended_lim = limiter(contended_rate, f"bench{run_id}:pyrate-{kind}:contended")

    def call() -> bool:
        return bool(open_lim.try_acquire("open", blocking=False))

    def attempt() -> tuple[bool, float]:
        return bool(contended_lim.try_acquire("contended", blocking=False)), 0.0

    return call, attempt
