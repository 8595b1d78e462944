"""``redis://``, ``rediss://``, ``unix://``: the scripts on a shared Redis.

One decision is one EVALSHA: of ``bucket.lua`` for an interface that is one token
bucket (or warm-up), of ``limits.lua`` for every other (windows, several limits): no
lock, no read-then-write from here. The scripts are loaded at ``prepare()``; after
NOSCRIPT (a Redis restart or SCRIPT FLUSH) the script is loaded again and the call
repeated, so that costs one extra round trip, never an error.

The client is tuned for a hot path: a socket timeout of ``redis_timeout`` (a slow
Redis must not stall the gateway), no retries (the failure policy is the retry), and a
blocking pool sized for threads that waits at most ``redis_timeout`` for a connection.
"""

from __future__ import annotations

import functools
import inspect
import struct
from hashlib import sha1
from importlib import resources
from types import ModuleType
from typing import Any
from urllib.parse import parse_qs, urlparse

import redis
import redis.connection
from redis.backoff import NoBackoff
from redis.retry import Retry

from gateway_limiter.backends.base import BackendError
from gateway_limiter.backends.schemes import register
from gateway_limiter.backends.state import caller_part, limit, single_bucket, state_key
from gateway_limiter.config.rules import SLIDING_WINDOW, Rule
from gateway_limiter.config.settings import Settings, url_error
from gateway_limiter.model.bucket import MICROS, BucketState, Verdict

BUCKET_LUA = resources.files(__package__).joinpath("bucket.lua").read_text(encoding="utf-8")
LIMITS_LUA = resources.files(__package__).joinpath("limits.lua").read_text(encoding="utf-8")
#: Script name -> source; a backend registers each once.
SCRIPTS = {"bucket": BUCKET_LUA, "limits": LIMITS_LUA}


def bucket_key(prefix: str, url: str) -> str:
    """The Redis key of ``url``'s shared per-second bucket (the URL is the hash tag)."""
    return state_key(prefix, Rule(url, 1, 0.0, 0))


def window_key(prefix: str, url: str) -> str:
    """The Redis key of ``url``'s shared per-second sliding window (same hash tag)."""
    return state_key(prefix, Rule(url, 1, 0.0, 0, algorithm=SLIDING_WINDOW))


class _Plan:
    """What a decision on one Rule needs, computed once per Rule object."""

    __slots__ = ("args", "bucket", "key", "keyed", "keys", "per_caller", "rule")

    def __init__(self, rule: Rule, prefix: str) -> None:
        self.rule = rule
        self.bucket = single_bucket(rule)
        #: each limit's key without the caller part, and whether it takes one
        self.keys = [state_key(prefix, r) for r in rule.limits]
        self.per_caller = [r.per_caller for r in rule.limits]
        self.key = self.keys[0]  # the single bucket's
        self.keyed = any(self.per_caller)
        if self.bucket:
            rate = str(rule.rate) if rule.period == 1 else repr(rule.per_second)
            self.args = [rate, str(rule.burst)]
        else:
            self.args = [str(x) for r in rule.limits for x in _spec(r)]

    def keys_for(self, caller: str | None) -> list[str]:
        """The keys of every limit for ``caller`` (ignored by shared limits)."""
        part = caller_part(caller)
        return [k + part if p else k for k, p in zip(self.keys, self.per_caller, strict=True)]


def _spec(rule: Rule) -> tuple[str, str, str]:
    kind, rate, size = limit(rule)
    return kind, repr(rate), repr(size)


class Commands:
    """The EVALSHA of each decision, with what depends only on the rule computed once.

    A rule is immutable, so its script, keys and fixed arguments are kept per URL (and
    rebuilt when a reload hands over a new Rule object); a decision then adds only the
    permits, the budget and, for per-caller limits, the caller's part of the keys.
    Shared by the sync and asyncio clients.
    """

    __slots__ = ("_cache", "_prefix", "shas")

    #: Rules kept at most; past this the cache starts over (URLs of removed rows go).
    LIMIT = 65_536

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._cache: dict[str, _Plan] = {}
        #: script name -> SHA1 of its source
        self.shas = {name: sha1(src.encode()).hexdigest() for name, src in SCRIPTS.items()}

    def __call__(
        self,
        rule: Rule,
        permits: int,
        timeout: float | None,
        caller: str | None = None,
        now: float | None = None,
    ) -> tuple[str, list[Any]]:
        """(script name, EVALSHA arguments after the SHA: numkeys, keys, ARGV) of one
        decision. ``now`` (µs) drives the clock in tests."""
        plan = self._cache.get(rule.url)
        if plan is None or plan.rule is not rule:
            if len(self._cache) >= self.LIMIT:
                self._cache.clear()
            plan = self._cache[rule.url] = _Plan(rule, self._prefix)
        budget = "-1" if timeout is None else repr(timeout * MICROS)
        clock = "" if now is None else repr(now)
        if plan.bucket:
            key = plan.key + caller_part(caller) if plan.keyed else plan.key
            if rule.warmup:
                warmup = repr(rule.warmup * MICROS)
                return "bucket", [1, key, *plan.args, str(permits), budget, clock, warmup]
            if now is not None:
                return "bucket", [1, key, *plan.args, str(permits), budget, clock]
            return "bucket", [1, key, *plan.args, str(permits), budget]
        keys = plan.keys_for(caller) if plan.keyed else plan.keys
        return "limits", [len(keys), *keys, str(permits), budget, clock, *plan.args]


def parse_reply(reply: Any) -> Verdict:
    """A script's reply as a Verdict (BackendError when it is not one)."""
    try:
        allowed, wait, stored, next_free = reply
        return Verdict(allowed == 1, float(wait), float(stored), float(next_free))
    except (TypeError, ValueError) as e:
        raise BackendError(f"unexpected reply from the bucket script: {reply!r}") from e


#: A bucket's state in Redis: stored, balance, rate, capacity, refill (bucket.lua).
STATE = struct.Struct("<5d")


def parse_state(raw: object) -> BucketState | None:
    """A bucket's packed state (GET) as a BucketState, or None when there is none."""
    if not isinstance(raw, bytes) or len(raw) != STATE.size:
        return None
    return BucketState(*STATE.unpack(raw))


#: Options a ``redis_url`` query may set besides those redis-py converts from text
#: itself (its ``URL_QUERY_ARGUMENT_PARSERS``): texts the connection takes as they are.
TEXT_QUERY_OPTIONS = ("username", "password", "client_name", "lib_name", "lib_version")


def client_options(settings: Settings) -> dict[str, Any]:
    """Connection options for the decision path (shared by sync and asyncio clients).

    Raises ValueError when ``redis_url``'s query names an option redis-py would pass
    to the connection, to fail there with a TypeError on the first connect.
    """
    check_query_options(settings.redis_url, redis.connection)
    return decision_path_options(settings)


def decision_path_options(settings: Settings) -> dict[str, Any]:
    """The timeouts, retries and pool size every decision's connection gets."""
    return {
        "socket_timeout": settings.redis_timeout,
        "socket_connect_timeout": settings.redis_connect_timeout,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 0,
        "max_connections": settings.redis_pool_size,
    }


def check_query_options(url: str, connection: ModuleType) -> None:
    """Refuse a ``redis://``, ``rediss://`` or ``unix://`` URL whose query names an
    option ``connection`` (``redis.connection`` or ``redis.asyncio.connection``) does not
    take for that scheme: one line naming it and the options allowed.

    redis-py hands any query option to the connection as a keyword, so an unknown one
    is a TypeError at the first connect (``start()``), not an error about the URL.
    ``redis+cluster://`` and ``redis+sentinel://`` URLs take no query (their parser
    refuses one).
    """
    scheme = url.partition("://")[0].lower()
    if scheme not in _CONNECTIONS:
        return
    given = parse_qs(urlparse(url).query)  # as redis-py reads it: blank values left out
    allowed = allowed_query_options(scheme, connection)
    unknown = [name for name in given if name not in allowed]
    if not unknown:
        return
    hint = ""
    if scheme != "rediss" and any(name.startswith("ssl_") for name in unknown):
        hint = "; ssl_ options need a rediss:// URL"
    raise ValueError(
        f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} in the query "
        f"(allowed: {', '.join(allowed)}){hint}"
    )


# The connection class redis-py uses for each scheme, by name in either module.
_CONNECTIONS = {
    "redis": "Connection",
    "rediss": "SSLConnection",
    "unix": "UnixDomainSocketConnection",
}


@functools.cache
def allowed_query_options(scheme: str, connection: ModuleType) -> tuple[str, ...]:
    """The query options a ``scheme`` URL may have with this redis-py, sorted: those
    redis-py converts from text, plain texts, and for TLS the ``ssl_`` settings, each
    only if the scheme's connection class (or the pool) takes it."""
    taken = _keywords(getattr(connection, _CONNECTIONS[scheme]))
    taken |= _keywords(connection.BlockingConnectionPool)
    candidates = {*connection.URL_QUERY_ARGUMENT_PARSERS, *TEXT_QUERY_OPTIONS}
    candidates |= {name for name in taken if name.startswith("ssl_")}
    return tuple(sorted(candidates & taken))


def _keywords(cls: type) -> set[str]:
    """Every keyword the ``__init__`` of ``cls`` or of a class it derives from names."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        names.update(
            p.name
            for p in inspect.signature(init).parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
        )
    return names


def redis_url(settings: Settings) -> str:
    """The URL redis-py understands for this backend."""
    return settings.redis_url


@register("redis", "rediss", "unix")
class RedisBackend:
    """The scripts on one Redis server (a master)."""

    shared = True
    __slots__ = ("_client", "_commands", "_prefix")

    def __init__(self, settings: Settings, client: redis.Redis | None = None) -> None:
        if client is None:
            try:
                pool = redis.BlockingConnectionPool.from_url(
                    redis_url(settings), timeout=settings.redis_timeout, **client_options(settings)
                )
            except ValueError as e:
                raise ValueError(f"redis_url {url_error(settings.redis_url, e)}") from None
            client = redis.Redis(connection_pool=pool)
        self._client = client
        self._prefix = settings.key_prefix
        self._commands = Commands(settings.key_prefix)

    @property
    def client(self) -> redis.Redis:
        """The redis-py client (for status and tests)."""
        return self._client

    def reserve(
        self,
        rule: Rule,
        permits: int,
        timeout: float | None,
        caller: str | None = None,
        *,
        now: float | None = None,
    ) -> Verdict:
        """One EVALSHA (plus a SCRIPT LOAD after Redis lost its scripts).

        ``now`` (µs) is for tests that drive the clock.
        """
        name, args = self._commands(rule, permits, timeout, caller, now)
        sha = self._commands.shas[name]
        try:
            try:
                reply = self._client.evalsha(sha, *args)
            except redis.exceptions.NoScriptError:  # restarted or SCRIPT FLUSH: load, again
                self._client.script_load(SCRIPTS[name])
                reply = self._client.evalsha(sha, *args)
        except (redis.RedisError, OSError) as e:
            raise BackendError(f"{type(e).__name__}: {e}") from e
        return parse_reply(reply)

    def peek(self, rule: Rule) -> tuple[BucketState | None, float]:
        """GET and TIME in one pipeline (``rule``'s own limit, shared state)."""
        try:
            pipe = self._client.pipeline(transaction=False)
            pipe.get(state_key(self._prefix, rule))
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
