"""``redis://``, ``rediss://``, ``unix://``: the scripts on a shared Redis.

One decision is one EVALSHA: of ``bucket.lua`` for an interface that is one token
bucket (or warm-up), of ``limits.lua`` for every other (windows, several limits): no
lock, no read-then-write from here. The scripts are loaded at ``prepare()``; after
NOSCRIPT (a Redis restart or SCRIPT FLUSH) the script is loaded again and the call
repeated, so that costs one extra round trip, never an error. What is sent and what
each reply means is ``backends/calls.py`` and ``scripts.py`` (no I/O); ``ScriptBackend``
is the transport of the threaded backends that sends them (``call``, ``batch``,
``subscribe``), shared with Sentinel and Cluster, and ``Operations`` the operations
over it.

The client is tuned for a hot path: a socket timeout of ``redis_timeout`` (a slow
Redis must not stall the gateway), no retries (the failure policy is the retry), and a
blocking pool sized for threads that waits at most ``redis_timeout`` for a connection.
Its connections, and the pipelined round trips threads share on them, are
``backends/connections.py``'s.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any
from urllib.parse import parse_qs, urlparse

import redis
import redis.connection
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisClusterException, ResponseError
from redis.retry import Retry

from gateway_limiter.backends.base import SYSTEM_CLOCKS, BackendError, Clocks, Heard, Listener
from gateway_limiter.backends.calls import Batch
from gateway_limiter.backends.connections import (
    call_error,
    connection_failed,
    following,
    packer,
    read_pipelined,
    round_trips,
    write_pipelined,
)
from gateway_limiter.backends.operations import Operations
from gateway_limiter.backends.readiness import Readiness
from gateway_limiter.backends.schemes import register
from gateway_limiter.backends.scripts import SCRIPTS, ScriptCall, describe
from gateway_limiter.backends.shared_trips import Queued, RoundTripSharing
from gateway_limiter.backends.subscriptions import listen, redis_connect
from gateway_limiter.config.settings import Settings
from gateway_limiter.observe.redact import url_error

__all__ = [
    "CLIENT_ERRORS",
    "RedisBackend",
    "ScriptBackend",
    "backend_errors",
    "client_options",
    "redis_url",
]


#: What a call to Redis may raise when Redis is away or refuses: the client's errors,
#: the network's (OSError), and RedisClusterException, which redis-py does not derive
#: from RedisError (no node of a cluster answers, a node is not in cluster mode).
CLIENT_ERRORS = (redis.RedisError, RedisClusterException, OSError)


@contextmanager
def backend_errors() -> Iterator[None]:
    """Errors of the Redis client (``CLIENT_ERRORS``) as BackendError."""
    try:
        yield
    except CLIENT_ERRORS as e:
        raise BackendError(describe(e)) from e


def eviction_policy(reply: Any) -> str | None:
    """The ``maxmemory-policy`` in a CONFIG GET reply (a dict; bytes or str)."""
    if not isinstance(reply, dict):
        return None
    for name, value in reply.items():
        if _text(name) == "maxmemory-policy":
            return _text(value)
    return None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class ScriptBackend(Operations):
    """The transport the threaded Redis backends share (one Redis, Sentinel, Cluster):
    every operation is ``Operations``'s, over ``call`` and ``batch``. Each says where its
    client is (``client``), how a call that got NOSCRIPT runs again (``_again``), which
    server holds a key (``_server``), what each master's ``maxmemory-policy`` is
    (``_policies``) and where its subscriptions connect (``subscribe``)."""

    __slots__ = ()
    _readiness: Readiness
    _settings: Settings

    @property
    def client(self) -> Any:
        """The redis-py client."""
        raise NotImplementedError

    def _again(self, client: Any, call: ScriptCall) -> Any:
        """``call`` once more after NOSCRIPT: SCRIPT LOAD where it ran, then EVALSHA."""
        client.script_load(call.source)
        return client.evalsha(*call.evalsha)

    def _server(self, key: str) -> Any:
        """A client of the server that holds ``key``."""
        return self.client

    def _policies(self, client: Any) -> list[str | None]:
        """Each master's ``maxmemory-policy`` (CONFIG GET); none when CONFIG is refused
        (an ACL, a renamed command): that is not a failure, just nothing to check."""
        try:
            return [eviction_policy(client.config_get("maxmemory-policy"))]
        except ResponseError:
            return []

    def _get_ready(self, client: Any) -> None:
        """Once, on the first connection that works (``backends/readiness.py``): SCRIPT
        LOAD, and warn when Redis may evict the limiter's keys. Raises what the client
        raises; then the next caller tries again."""

        def load() -> list[str | None]:
            for source in SCRIPTS.values():
                client.script_load(source)
            return self._policies(client)

        self._readiness.get_ready(load)

    def call(self, call: ScriptCall) -> tuple[Any, float]:
        """``call``'s reply, and how long it waited for another thread's round trip
        before it was written (s; 0.0: sent at once, by this thread)."""
        return self._run(call), 0.0

    def _run(self, call: ScriptCall) -> Any:
        """One EVALSHA alone (a SCRIPT LOAD and a second one after NOSCRIPT)."""
        with backend_errors():
            client = self.client
            if not self._readiness.ready:  # Redis was away at start: ready it now, once
                self._get_ready(client)
            try:
                return client.evalsha(*call.evalsha)
            except NoScriptError:  # restarted, flushed, promoted: load there, ask again
                return self._again(client, call)

    def batch(self, batch: Batch) -> list[Any]:
        """``batch``'s commands in one pipeline, on the server that holds its key."""
        with backend_errors():
            pipe = self._server(batch.key).pipeline(transaction=False)
            for name, args, keywords in batch.commands:
                getattr(pipe, name)(*args, **keywords)
            return pipe.execute(raise_on_error=False)  # type: ignore[no-any-return]

    def subscribe(self, channel: str, heard: Heard) -> Listener | None:
        """``channel`` heard on a client of its own (``backends/subscriptions.py``)."""
        return listen(self._settings, channel, lambda: redis_connect(self._settings), heard)

    def prepare(self) -> None:
        """SCRIPT LOAD now (on every master), so the first decision is one round trip, not
        NOSCRIPT + load, and check the eviction policy. BackendError when Redis does not
        answer: the first decision that reaches it does this instead."""
        with backend_errors():
            self._get_ready(self.client)


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
    owned = [name for name in given if name in SETTINGS_OWN]
    if owned:
        # redis-py would let the query win over the setting, silently: a decision could
        # then wait seconds where redis_timeout promises milliseconds.
        raise ValueError(
            "the query sets "
            + ", ".join(f"{name} (use the setting {SETTINGS_OWN[name]})" for name in owned)
        )
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


#: Query options that the limiter's settings own: the decision path's timeouts and pool.
SETTINGS_OWN = {
    "socket_timeout": "redis_timeout",
    "socket_connect_timeout": "redis_connect_timeout",
    "max_connections": "redis_pool_size",
    "timeout": "redis_timeout (the pool's wait for a free connection)",
}


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
    return tuple(sorted((candidates & taken) - SETTINGS_OWN.keys()))


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


# redis-py < 5.3 needs a command name here; later versions warn when given one.
POOL_ARGS: tuple[str, ...] = (
    ("EVALSHA",)
    if inspect.signature(redis.ConnectionPool.get_connection).parameters["command_name"].default
    is inspect.Parameter.empty
    else ()
)


@register("redis", "rediss", "unix")
class RedisBackend(ScriptBackend):
    """The scripts on one Redis server (a master). Threads deciding at once share round
    trips (``backends/shared_trips.py``): one alone sends its EVALSHA at once, the
    others queue and go together, in one pipeline, after the round trip in flight."""

    __slots__ = (
        "_client",
        "_held",
        "_held_pid",
        "_holds",
        "_pack",
        "_readiness",
        "_round_trips",
        "_settings",
        "_sharing",
        "_wait_base_s",
    )

    def __init__(
        self, settings: Settings, clocks: Clocks = SYSTEM_CLOCKS, client: redis.Redis | None = None
    ) -> None:
        """``clocks``: the limiter's (``Operations._use``); ``client``: one made elsewhere
        (Sentinel's) instead of one built from ``redis_url``."""
        if client is None:
            try:
                pool = redis.BlockingConnectionPool.from_url(
                    redis_url(settings), timeout=settings.redis_timeout, **client_options(settings)
                )
            except ValueError as e:
                raise ValueError(f"redis_url {url_error(settings.redis_url, e)}") from None
            client = redis.Redis(connection_pool=pool)
        self._round_trips = round_trips(settings)
        connections = client.connection_pool
        connections.connection_class = following(connections.connection_class, self._round_trips)
        self._client = client
        self._settings = settings
        self._use(settings, clocks)
        self._readiness = Readiness()
        self._pack = packer(connections.connection_kwargs)
        # A follower waits for the round trip in flight, then for its own: each may
        # wait for a pooled connection (redis_timeout), open one and read replies.
        self._wait_base_s = settings.redis_timeout + settings.redis_connect_timeout
        self._sharing = RoundTripSharing(
            self._send_alone,
            self._write_batch,
            self._read_batch,
            self._follower_wait_s,
            connection_failed,
        )
        # The decision connection (see ``_checked_out``): kept out of the pool between
        # round trips, unless the pool has only the one connection to share.
        self._holds = getattr(connections, "max_connections", 1) > 1
        self._held: Any = None
        self._held_pid = 0

    @property
    def client(self) -> redis.Redis:
        """The redis-py client (for status and tests)."""
        return self._client

    def call(self, call: ScriptCall) -> tuple[Any, float]:
        """``call`` alone, or in one pipeline with other threads' (``shared_trips``)."""
        if not self._readiness.ready:  # Redis was away at start: ready it now, once
            with backend_errors():
                self._get_ready(self._client)
        return self._sharing.run(call)

    def _send_alone(self, call: ScriptCall) -> Any:
        """One call with no other thread's: its EVALSHA written on the decision
        connection (``_checked_out``) and its reply read, cheaper than redis-py's
        ``evalsha`` (a packed command kept, no pool check-out, no command parsing or
        response callbacks) and than a batch of one (no ``Queued``, no lock). After
        NOSCRIPT, the batch path: a SCRIPT LOAD and the EVALSHA again in one write."""
        with backend_errors():
            conn = self._checked_out()
            try:
                conn.send_packed_command(
                    [self._pack(("EVALSHA", *call.evalsha))], check_health=False
                )
                reply = conn.read_response()
            except NoScriptError:  # flushed or restarted: load, ask again (below)
                self._give_back(conn)
            except ResponseError as e:  # the script failed for this call only
                self._give_back(conn)
                raise call_error(e) from e
            except BaseException:
                self._drop(conn)
                raise
            else:
                self._give_back(conn)
                return reply
        alone, load = Queued(call), (call.name,)
        self._read_batch([alone], self._write_batch([alone], load=load))  # LOAD + EVALSHA
        if alone.error is not None:
            raise alone.error
        return alone.reply

    def _follower_wait_s(self) -> float:
        return self._wait_base_s + self._round_trips.timeout_s

    def _write_batch(
        self, batch: list[Queued], just_read: bool = False, load: tuple[str, ...] = ()
    ) -> Any:
        """The batch's EVALSHAs in one write on the decision connection (after a SCRIPT
        LOAD of each of ``load``: scripts known to be missing); what ``_read_batch``
        needs. ``just_read``: this thread has just read the replies of the round trip
        before on it, so it is not checked again (``_checked_out``). The connection is
        dropped when the write fails."""
        with backend_errors():
            conn = self._held
            if not just_read or conn is None:
                conn = self._checked_out()
            try:
                write_pipelined(conn, self._pack, batch, load)
            except BaseException:
                self._drop(conn)
                raise
        return conn, load

    def _read_batch(self, batch: list[Queued], written: Any) -> None:
        """The replies of a batch ``_write_batch`` wrote, each call settled with its own
        (NOSCRIPT: SCRIPT LOAD, and the calls it hit asked again). The connection is
        dropped when the round trip fails (replies may be unread: never read them
        later)."""
        conn, load = written
        with backend_errors():
            try:
                read_pipelined(conn, self._pack, batch, load)
            except BaseException:
                self._drop(conn)
                raise
            self._give_back(conn)

    def _checked_out(self) -> Any:
        """The connection of the round trip in flight (one at a time: ``shared_trips``).

        The same one is kept from one round trip to the next, out of the pool: the
        pool's check-out and check-in cost more Python than the rest of a decision. It
        is checked as the pool checks a connection it hands out: connected, nothing
        unread on it (a connection Redis closed, a restart, is opened again here), and
        opened in this process (after a fork the child takes its own from the pool).
        ``_write_batch`` skips the check when the thread has just read its replies.
        """
        conn = self._held
        if conn is None or self._held_pid != os.getpid():
            conn = self._client.connection_pool.get_connection(*POOL_ARGS)
            if self._holds:
                self._held, self._held_pid = conn, os.getpid()
            return conn
        try:
            if not conn.can_read():  # connects first when it is not connected
                return conn
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            pass
        try:  # closed by Redis, or data nobody asked for: start afresh
            conn.disconnect()
            conn.connect()
            if conn.can_read():
                raise redis.ConnectionError("Connection not ready")
        except BaseException:
            self._drop(conn)
            raise
        return conn

    def _give_back(self, conn: Any) -> None:
        """The round trip on ``conn`` is over: back to the pool unless it is kept."""
        if conn is not self._held:
            self._client.connection_pool.release(conn)

    def _drop(self, conn: Any) -> None:
        """The round trip on ``conn`` failed: replies may be unread, so never read them
        later; disconnected and back to the pool (kept no more)."""
        conn.disconnect()
        if conn is self._held:
            self._held = None
        self._client.connection_pool.release(conn)

    def close(self) -> None:
        """Close every pooled connection (the decision connection back among them)."""
        held, self._held = self._held, None
        if held is not None and self._held_pid == os.getpid():
            self._client.connection_pool.release(held)
        self._client.close()
        self._client.connection_pool.disconnect()
