"""``redis://``, ``rediss://``, ``unix://`` for asyncio: the scripts on ``redis.asyncio``.

The same scripts, keys, arguments and reply parsing as ``backends/redis.py`` (imported
from there, not copied); one decision is one EVALSHA on one pooled connection, awaited,
and a NOSCRIPT (Redis restarted, SCRIPT FLUSH) costs a SCRIPT LOAD and a second
EVALSHA, never an error. The connections have the sync client's options (connect
timeout ``redis_connect_timeout``, no retries: the failure policy is the retry).

Three things are done differently on an event loop, on purpose:

1. **Timeouts do not blame Redis for the loop's own lateness.** A timer on a loop runs
   late when the loop is busy (a burst of callers, the application's own work), and a
   plain socket timeout of 50 ms then fires on replies that came back in 1 ms but were
   not read yet: the breaker would open on a healthy Redis. So each round trip runs
   under a ``Deadline`` of ``redis_timeout``, which gives back time the loop was held
   and lets the loop take one more turn before it strikes (see ``Deadline``). A Redis
   that really does not answer costs a caller ``redis_timeout`` plus one turn of an
   idle loop.
2. **Connecting and asking are timed apart** (DESIGN.md section 4): taking a connection
   from the pool, which may open one and introduce the client, gets
   ``redis_connect_timeout + redis_timeout``; each round trip on it gets
   ``redis_timeout``. Both are Deadlines, so a loop busy while a connection was being
   opened does not count against Redis either.
3. **Waiting for a connection is queueing, not failure.** Threads that wait for a
   pooled connection mean too many threads; coroutines that do mean only that more
   decisions are in flight than there are connections, which is normal in a burst (a
   thousand coroutines, ``redis_pool_size`` connections) and says nothing about Redis.
   So callers queue first come, first served (an ``asyncio.Semaphore``: redis-py's pool
   wakes waiters in no fixed order, and in a burst some would starve). The queue moves
   at least ``redis_pool_size`` calls per deadline, even when Redis hangs, and a call
   that fails makes every caller queued behind it give up at once with BackendError:
   a dead or hung Redis costs a queued caller nothing beyond the failure it waited on.

Cancellation: a caller cancelled while its EVALSHA is in flight gets CancelledError at
once, and redis-py drops that connection (its reply will never be read), so the pool
stays clean. Whether the script ran is unknown; if it did, the permits it reserved stay
spent (see ``gateway_limiter.aio``).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, TypeVar

import redis
from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError

from ..bucket import BucketState, Verdict
from ..rules import Rule
from ..settings import Settings, url_error
from . import BackendError
from .aio import register_async
from .redis import SCRIPTS, Commands, client_options, parse_reply, parse_state
from .state import state_key

T = TypeVar("T")


class Deadline:
    """``asyncio.timeout(seconds)`` that does not charge Redis for the loop's own delays.

    A timer on a busy loop fires late, and by then a reply that came back in time may be
    sitting unread, or a connection may be open with its handshake not yet sent. So:

    - if the timer fires late, the loop was held for that long (application code, a
      burst of callers): that time is given back once, up to ``seconds`` more;
    - when the time is up, the timeout strikes only after the loop's next turn. In the
      turn where the timer fires the loop has already polled the sockets, so a reply
      that arrived in time has woken its reader, which runs before the strike.

    A Redis that really does not answer costs a caller ``seconds`` plus one turn of an
    idle loop; on a held loop, at most twice ``seconds`` beyond the holding itself.
    Raises TimeoutError.
    """

    __slots__ = ("_extended", "_handle", "_seconds", "_timeout", "_when")

    #: Lateness of the timer itself below this is the loop's normal jitter.
    JITTER = 0.002

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._timeout = asyncio.timeout(None)
        self._handle: asyncio.TimerHandle | None = None
        self._when = 0.0
        self._extended = False

    async def __aenter__(self) -> None:
        await self._timeout.__aenter__()
        loop = asyncio.get_running_loop()
        self._when = loop.time() + self._seconds
        self._handle = loop.call_at(self._when, self._time_is_up)

    def _time_is_up(self) -> None:
        loop = asyncio.get_running_loop()
        late = loop.time() - self._when
        if late > self.JITTER and not self._extended:
            self._extended = True
            self._when = loop.time() + min(late, self._seconds)
            self._handle = loop.call_at(self._when, self._time_is_up)
            return
        # A timeout due now runs via call_soon: after the wake-ups already queued.
        self._timeout.reschedule(loop.time())

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
        await self._timeout.__aexit__(exc_type, exc, tb)  # raises TimeoutError if it struck


def async_client_options(settings: Settings) -> dict[str, Any]:
    """Connection options: ``client_options`` with the asyncio Retry, and no socket
    timeouts of redis-py's own: ``Deadline`` times connecting and every round trip."""
    return (
        client_options(settings)
        | {"retry": Retry(NoBackoff(), 0), "socket_timeout": None, "socket_connect_timeout": None}
        | _newer_redis_py_options()
    )


@functools.cache
def _newer_redis_py_options() -> dict[str, Any]:
    options: dict[str, Any] = {}
    try:
        from redis.driver_info import DriverInfo
    except ImportError:  # older redis-py looks its version up once, at import
        pass
    else:
        # redis-py >= 7 builds CLIENT SETINFO's version for every new connection by
        # parsing its package metadata (~1.5 ms of CPU): a burst that opens 50
        # connections would hold the loop for tens of ms. One DriverInfo serves them all.
        options["driver_info"] = DriverInfo()
    try:
        from redis.maint_notifications import MaintNotificationsConfig
    except ImportError:
        pass
    else:
        # With maintenance notifications on "auto" (the default), the pool skips its
        # check that a pooled connection is still open: after a Redis restart every
        # idle connection would fail once, each failure opening the breaker again.
        # They are a Redis Enterprise/Cloud feature this client has no use for.
        options["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)
    return options


# redis-py < 5.3 needs a command name here; later versions warn when given one.
_POOL_ARGS: tuple[str, ...] = (
    ("EVALSHA",)
    if inspect.signature(BlockingConnectionPool.get_connection).parameters["command_name"].default
    is inspect.Parameter.empty
    else ()
)


@register_async("redis", "rediss", "unix")
class AsyncRedisBackend:
    """The bucket script on one Redis server (a master), through ``redis.asyncio``."""

    shared = True
    __slots__ = (
        "_client",
        "_commands",
        "_connect_seconds",
        "_failures",
        "_pool",
        "_prefix",
        "_read_seconds",
        "_slots",
    )

    def __init__(self, settings: Settings, pool: ConnectionPool | None = None) -> None:
        """``pool``: connections to the master made elsewhere (Sentinel's), instead of
        one built from ``redis_url``."""
        if pool is None:
            try:
                pool = BlockingConnectionPool.from_url(
                    settings.redis_url, timeout=None, **async_client_options(settings)
                )
            except ValueError as e:
                raise ValueError(f"redis_url {url_error(settings.redis_url, e)}") from None
        self._pool = pool
        self._client = Redis.from_pool(pool)  # for peek and prepare; owns and closes the pool
        self._prefix = settings.key_prefix
        self._read_seconds = settings.redis_timeout
        self._connect_seconds = settings.redis_connect_timeout + settings.redis_timeout
        self._slots = asyncio.Semaphore(settings.redis_pool_size)  # FIFO, unlike the pool
        self._failures = 0  # calls failed so far: a queued caller compares before and after
        self._commands = Commands(settings.key_prefix)

    @property
    def client(self) -> Redis:
        """The redis.asyncio client (for status and tests)."""
        return self._client

    async def _queued(self, call: Callable[[], Awaitable[T]]) -> T:
        """Wait for a connection slot in turn, then ``call``; Redis errors -> BackendError."""
        failures = self._failures
        async with self._slots:
            if self._failures != failures:
                raise BackendError("Redis failed while this call was queued for a connection")
            try:
                return await call()
            except (redis.RedisError, OSError) as e:  # OSError includes TimeoutError
                self._failures += 1
                raise BackendError(_describe(e)) from e

    async def _evalsha(self, name: str, args: list[Any]) -> Any:
        sha = self._commands.shas[name]
        async with Deadline(self._connect_seconds):
            conn = await self._pool.get_connection(*_POOL_ARGS)  # type: ignore[no-untyped-call]
        try:
            try:
                return await self._ask(conn, "EVALSHA", sha, *args)
            except NoScriptError:  # Redis restarted or flushed its scripts: load, ask again
                await self._ask(conn, "SCRIPT", "LOAD", SCRIPTS[name])
                return await self._ask(conn, "EVALSHA", sha, *args)
        finally:
            await self._pool.release(conn)  # redis-py has dropped it if it failed

    async def _ask(self, conn: AbstractConnection, *command: Any) -> Any:
        async with Deadline(self._read_seconds):
            await conn.send_command(*command)
            return await conn.read_response()

    async def reserve(
        self,
        rule: Rule,
        permits: int,
        timeout: float | None,
        caller: str | None = None,
        *,
        now: float | None = None,
    ) -> Verdict:
        """One EVALSHA. ``now`` (µs) is for tests that drive the clock."""
        name, args = self._commands(rule, permits, timeout, caller, now)
        return parse_reply(await self._queued(lambda: self._evalsha(name, args)))

    async def peek(self, rule: Rule) -> tuple[BucketState | None, float]:
        """GET and TIME in one pipeline."""

        async def both() -> list[Any]:
            async with Deadline(self._connect_seconds + self._read_seconds):
                pipe = self._client.pipeline(transaction=False)
                pipe.get(state_key(self._prefix, rule))
                pipe.time()
                return await pipe.execute()

        raw, (sec, usec) = await self._queued(both)
        return parse_state(raw), sec * 1_000_000.0 + usec

    async def prepare(self) -> None:
        """SCRIPT LOAD now, so the first decision is one round trip, not NOSCRIPT + load."""

        async def load() -> None:
            async with Deadline(self._connect_seconds + self._read_seconds):
                for source in SCRIPTS.values():
                    await self._client.script_load(source)

        await self._queued(load)

    async def aclose(self) -> None:
        """Close the client and every pooled connection."""
        await self._client.aclose()
        await self._pool.disconnect()


def _describe(error: BaseException) -> str:
    if isinstance(error, TimeoutError) and not isinstance(error, redis.RedisError):
        return "TimeoutError: no answer within redis_timeout"
    return f"{type(error).__name__}: {error}"
