"""``redis://``, ``rediss://``, ``unix://``: the bucket script on a shared Redis.

One decision is one EVALSHA of ``bucket.lua``: no lock, no read-then-write from here.
The script is registered once; redis-py's Script reloads it after NOSCRIPT (a Redis
restart or SCRIPT FLUSH), so that costs one extra round trip, never an error.

The client is tuned for a hot path: a socket timeout of ``redis_timeout`` (a slow
Redis must not stall the gateway), no retries (the failure policy is the retry), and a
blocking pool sized for threads that waits at most ``redis_timeout`` for a connection.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..bucket import MICROS, WINDOW, BucketState, Verdict
from ..rules import SLIDING_WINDOW, Rule
from ..settings import Settings, mask_secrets
from . import BackendError, register, to_micros

BUCKET_LUA = resources.files(__package__).joinpath("bucket.lua").read_text(encoding="utf-8")
WINDOW_LUA = resources.files(__package__).joinpath("window.lua").read_text(encoding="utf-8")
#: Script name -> source; a backend registers each once.
SCRIPTS = {"bucket": BUCKET_LUA, "window": WINDOW_LUA}


def bucket_key(prefix: str, url: str) -> str:
    """The Redis key of ``url``'s bucket: prefix, then the URL as the cluster hash tag."""
    return f"{prefix}:{{{url}}}:tb"


def window_key(prefix: str, url: str) -> str:
    """The Redis key of ``url``'s sliding window (same hash tag as its bucket)."""
    return f"{prefix}:{{{url}}}:sw"


def script_call(
    prefix: str, rule: Rule, permits: int, timeout: float | None, now: float | None = None
) -> tuple[str, str, list[str]]:
    """(script name, key, ARGV) of one decision; shared by the sync and asyncio clients."""
    micros = to_micros(timeout)
    budget = "-1" if micros is None else repr(micros)
    clock = "" if now is None else repr(now)
    if rule.algorithm == SLIDING_WINDOW:
        return (
            "window",
            window_key(prefix, rule.url),
            [str(rule.rate), str(permits), budget, clock, repr(WINDOW)],
        )
    return (
        "bucket",
        bucket_key(prefix, rule.url),
        [str(rule.rate), str(rule.burst), str(permits), budget, clock, repr(rule.warmup * MICROS)],
    )


def script_args(rule: Rule, permits: int, timeout: float | None, now: float | None) -> list[str]:
    """ARGV for bucket.lua (shared by the sync and asyncio clients)."""
    micros = to_micros(timeout)
    return [
        str(rule.rate),
        str(rule.burst),
        str(permits),
        "-1" if micros is None else repr(micros),
        "" if now is None else repr(now),
    ]


def parse_reply(reply: Any) -> Verdict:
    """bucket.lua's reply as a Verdict (BackendError when it is not one)."""
    try:
        allowed, wait, stored = reply
        return Verdict(bool(int(allowed)), float(wait), float(stored))
    except (TypeError, ValueError) as e:
        raise BackendError(f"unexpected reply from the bucket script: {reply!r}") from e


def parse_state(raw: dict[Any, Any]) -> BucketState | None:
    """A bucket hash (HGETALL) as a BucketState, or None when empty."""
    if not raw:
        return None
    get = {(k.decode() if isinstance(k, bytes) else k): float(v) for k, v in raw.items()}
    return BucketState(get["s"], get["b"], get["r"], get["c"])


def client_options(settings: Settings) -> dict[str, Any]:
    """Connection options for the decision path (shared by sync and asyncio clients)."""
    return {
        "socket_timeout": settings.redis_timeout,
        "socket_connect_timeout": settings.redis_connect_timeout,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 0,
        "max_connections": settings.redis_pool_size,
    }


def redis_url(settings: Settings) -> str:
    """The URL redis-py understands for this backend."""
    return settings.redis_url


@register("redis", "rediss", "unix")
class RedisBackend:
    """The bucket scripts on one Redis server (a master)."""

    shared = True
    __slots__ = ("_client", "_prefix", "_scripts")

    def __init__(self, settings: Settings, client: redis.Redis | None = None) -> None:
        if client is None:
            try:
                pool = redis.BlockingConnectionPool.from_url(
                    redis_url(settings), timeout=settings.redis_timeout, **client_options(settings)
                )
            except ValueError as e:
                raise ValueError(f"redis_url {mask_secrets(settings.redis_url)}: {e}") from None
            client = redis.Redis(connection_pool=pool)
        self._client = client
        self._prefix = settings.key_prefix
        self._scripts = {name: client.register_script(src) for name, src in SCRIPTS.items()}

    @property
    def client(self) -> redis.Redis:
        """The redis-py client (for status and tests)."""
        return self._client

    def reserve(
        self, rule: Rule, permits: int, timeout: float | None, *, now: float | None = None
    ) -> Verdict:
        """One EVALSHA. ``now`` (µs) is for tests that drive the clock."""
        name, key, args = script_call(self._prefix, rule, permits, timeout, now)
        try:
            reply = self._scripts[name](keys=[key], args=args)
        except (redis.RedisError, OSError) as e:
            raise BackendError(f"{type(e).__name__}: {e}") from e
        return parse_reply(reply)

    def peek(self, rule: Rule) -> tuple[BucketState | None, float]:
        """HGETALL and TIME in one pipeline."""
        try:
            pipe = self._client.pipeline(transaction=False)
            pipe.hgetall(bucket_key(self._prefix, rule.url))
            pipe.time()
            raw, (sec, usec) = pipe.execute()
        except (redis.RedisError, OSError) as e:
            raise BackendError(f"{type(e).__name__}: {e}") from e
        return parse_state(raw), sec * 1_000_000.0 + usec

    def prepare(self) -> None:
        """SCRIPT LOAD now, so the first decision is one round trip, not NOSCRIPT + load."""
        try:
            for source in SCRIPTS.values():
                self._client.script_load(source)
        except (redis.RedisError, OSError) as e:
            raise BackendError(f"{type(e).__name__}: {e}") from e

    def close(self) -> None:
        """Close every pooled connection."""
        self._client.close()
        self._client.connection_pool.disconnect()
