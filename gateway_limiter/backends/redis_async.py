"""``redis://``, ``rediss://``, ``unix://`` for asyncio: the scripts on ``redis.asyncio``.

How it works: docs/internals.md, section ``gateway_limiter.backends.redis_async``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis
import redis.asyncio.connection
from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, ResponseError

from gateway_limiter.backends import scripts
from gateway_limiter.backends.base import SYSTEM_CLOCKS, BackendError, Clocks, Heard, Listener
from gateway_limiter.backends.calls import Batch
from gateway_limiter.backends.connections import packer, round_trips
from gateway_limiter.backends.operations_async import AsyncOperations
from gateway_limiter.backends.readiness import Readiness
from gateway_limiter.backends.redis import (
    CLIENT_ERRORS,
    check_query_options,
    decision_path_options,
    eviction_policy,
)
from gateway_limiter.backends.round_trips import RoundTrips
from gateway_limiter.backends.schemes import register_async
from gateway_limiter.backends.subscriptions import listen, redis_connect
from gateway_limiter.config.settings import Settings
from gateway_limiter.observe.redact import url_error

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

    async def __aexit__(self, *exc_info: Any) -> None:
        if self._handle is not None:
            self._handle.cancel()
        await self._timeout.__aexit__(*exc_info)  # raises TimeoutError if it struck


def async_client_options(settings: Settings) -> dict[str, Any]:
    """Connection options: ``client_options`` with the asyncio Retry, and no socket
    timeouts of redis-py's own: ``Deadline`` times connecting and every round trip.

    Raises ValueError when ``redis_url``'s query names an option ``redis.asyncio``
    does not take (``check_query_options``).
    """
    check_query_options(settings.redis_url, redis.asyncio.connection)
    return (
        decision_path_options(settings)
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


class _Call:
    """One decision waiting for its reply: the script call, the caller's future, when it
    was written to Redis (monotonic s; 0 until then), and whether ASKING goes before it
    (a Redis Cluster's ASK redirect: the slot is being imported there)."""

    __slots__ = ("asking", "future", "script", "sent")

    def __init__(
        self, script: scripts.ScriptCall, future: asyncio.Future[Any], asking: bool = False
    ) -> None:
        self.script = script
        self.future = future
        self.sent = 0.0
        self.asking = asking


class Lanes:
    """Up to ``redis_pool_size`` lanes on one master's pool of connections, sending the
    queued script calls in batches (the module's docstring says how), and the turns of
    the other calls (``queued``: peek, prepare, heartbeats) for a connection of it."""

    __slots__ = (
        "_active",
        "_collecting",
        "_connect_seconds",
        "_failures",
        "_lanes",
        "_max_lanes",
        "_others",
        "_pack",
        "_pool",
        "_queue",
        "_round_trips",
        "_slots",
    )

    #: Decisions sent in one round trip at most (a batch of 128 runs ~1-2 ms in Redis).
    BATCH = 128

    def __init__(self, settings: Settings, pool: ConnectionPool, trips: RoundTrips) -> None:
        self._pool = pool
        self._connect_seconds = settings.redis_connect_timeout + settings.redis_timeout
        self._slots = asyncio.Semaphore(settings.redis_pool_size)  # FIFO, unlike the pool
        self._failures = 0  # calls failed so far: a queued caller compares before and after
        self._queue: deque[_Call] = deque()  # decisions not yet sent, first come first
        self._lanes: set[asyncio.Task[None]] = set()  # referenced while they run
        self._max_lanes = settings.redis_pool_size
        self._active = 0  # lanes not yet ended
        self._collecting = 0  # lanes on their way to take the queue (0 or 1)
        self._pack = packer(pool.connection_kwargs)
        self._others = 0  # peek/prepare calls waiting for a connection
        self._round_trips = trips  # a lane's read deadline

    async def queued(self, call: Callable[[], Awaitable[T]]) -> T:
        """Wait for a connection slot in turn, then ``call``; Redis errors -> BackendError."""
        failures = self._failures
        self._others += 1  # busy lanes hand their connection over after their round trip
        try:
            await self._slots.acquire()
        finally:
            self._others -= 1
        try:
            if self._failures != failures:
                raise BackendError("Redis failed while this call was queued for a connection")
            try:
                return await call()
            except CLIENT_ERRORS as e:  # OSError includes TimeoutError
                self._failed()
                raise BackendError(_describe(e)) from e
        finally:
            self._slots.release()

    def _failed(self, error: BackendError | None = None) -> None:
        """A call failed: every decision still queued gives up with it, now."""
        self._failures += 1
        if error is None:
            error = BackendError("Redis failed while this call was queued for a connection")
        while self._queue:
            _resolve(self._queue.popleft().future, error=error)

    def enqueue(self, script: scripts.ScriptCall, asking: bool = False) -> _Call:
        """``script`` queued with the decisions (see ``_lane``): its reply, or its error,
        comes in its ``future``. ``asking``: ASKING goes before it, in the same write (a
        cluster's ASK redirect)."""
        call = _Call(script, asyncio.get_running_loop().create_future(), asking)
        self._queue.append(call)
        self._start_lane()
        return call

    def _start_lane(self) -> None:
        """A lane for the queue, unless one is on its way or all are busy (then the first
        to finish its round trip takes the queue)."""
        if self._queue and not self._collecting and self._active < self._max_lanes:
            self._collecting += 1
            self._active += 1
            lane = asyncio.create_task(self._lane())
            self._lanes.add(lane)
            lane.add_done_callback(self._lanes.discard)

    async def _lane(self) -> None:
        """One connection sending batches: take every queued decision (up to BATCH), send
        their EVALSHAs in one write, read the replies in order, answer each caller; again
        while the queue holds more; then give the connection back and end."""
        batch: list[_Call] = []
        collecting = True
        try:
            async with self._slots:
                async with Deadline(self._connect_seconds):
                    conn = await self._pool.get_connection(*_POOL_ARGS)  # type: ignore[no-untyped-call]
                try:
                    while True:
                        # Taken and written with no await in between: lanes send in
                        # arrival order (Redis may interleave batches in flight together).
                        batch = self._take()
                        if collecting:
                            collecting = False
                            self._collecting -= 1
                        if not batch:
                            self._active -= 1  # before any await: an arrival starts a lane
                            return
                        if self._queue:  # more than a batch: another lane, alongside
                            self._start_lane()
                        await self._round_trip(conn, batch)
                        if self._others:  # a peek or prepare waits: its turn, then ours
                            self._active -= 1
                            self._start_lane()
                            return
                except BaseException as e:
                    self._stopped(batch, e)
                    await conn.disconnect()  # replies may be unread: never read them later
                    raise
                finally:
                    await self._pool.release(conn)
        except BaseException as e:
            if collecting:  # failed to connect, or cancelled before it could
                self._collecting -= 1
                self._stopped(batch, e)
            if not isinstance(e, CLIENT_ERRORS):
                raise  # cancelled (aclose, the loop shutting down); nobody is left hanging

    def _stopped(self, batch: list[_Call], e: BaseException) -> None:
        """A lane ends on an error: its batch fails, and so does every decision queued."""
        self._active -= 1
        if isinstance(e, CLIENT_ERRORS):  # OSError includes TimeoutError
            error, queued = BackendError(_describe(e)), None
        else:  # cancelled: aclose, or the loop shutting down
            error = queued = BackendError(f"the Redis backend stopped: {_describe(e)}")
        for call in batch:
            _resolve(call.future, error=error)
        self._failed(queued)

    def _take(self) -> list[_Call]:
        """The queued decisions still awaited, first come first, up to BATCH."""
        batch: list[_Call] = []
        queue = self._queue
        while queue and len(batch) < self.BATCH:
            call = queue.popleft()
            if not call.future.done():  # a caller cancelled while queued is never sent
                batch.append(call)
        return batch

    async def _round_trip(self, conn: AbstractConnection, batch: list[_Call]) -> None:
        """The batch's EVALSHAs in one write; each reply to its caller as it is read.

        An error reply is that caller's alone; NOSCRIPT (Redis restarted or flushed its
        scripts) loads the script and asks again in the next round trip.
        """
        rounds = scripts.Reloads(batch, lambda c: c.script.name)
        for sent_calls, names in rounds:
            # a caller cancelled since the last round is not asked again
            calls = [c for c in sent_calls if not c.future.done()]
            commands: list[tuple[Any, ...]] = [
                ("SCRIPT", "LOAD", scripts.SCRIPTS[n]) for n in names
            ]
            for c in calls:
                if c.asking:
                    commands.append(("ASKING",))
                commands.append(("EVALSHA", *c.script.evalsha))
            packed = b"".join([self._pack(command) for command in commands])
            sent = time.monotonic()
            for call in calls:
                call.sent = sent
            # The deadline follows the round trips seen (backends/round_trips.py).
            async with Deadline(self._round_trips.timeout_s):
                await conn.send_packed_command(packed, check_health=False)
                for _ in names:
                    await conn.read_response()
                for call in calls:
                    if call.asking:
                        await conn.read_response()  # OK
                    try:
                        reply = await conn.read_response()
                    except NoScriptError:
                        rounds.missing(call)
                    except ResponseError as e:  # this call's alone: its script failed
                        _resolve(call.future, error=self._reply_error(e))
                    else:
                        _resolve(call.future, reply)
            self._round_trips.observe(time.monotonic() - sent)
        error = BackendError(scripts.Reloads.error)
        for call in rounds.lost:
            _resolve(call.future, error=error)

    def _reply_error(self, error: ResponseError) -> Exception:
        """What a caller gets for an error reply to its call: its own BackendError."""
        return BackendError(_describe(error))

    async def stop(self) -> None:
        """Cancel the lanes running, and wait for them to end."""
        lanes = list(self._lanes)
        for lane in lanes:
            lane.cancel()
        await asyncio.gather(*lanes, return_exceptions=True)


@register_async("redis", "rediss", "unix")
class AsyncRedisBackend(AsyncOperations):
    """The scripts on one Redis server (a master), through ``redis.asyncio``: the
    transport (``call`` in the lanes' batches, ``batch`` in turn for a connection,
    ``subscribe``) under ``AsyncOperations``'s operations."""

    __slots__ = (
        "_client",
        "_connect_seconds",
        "_lanes",
        "_pool",
        "_read_seconds",
        "_readiness",
        "_settings",
    )

    #: Decisions sent in one round trip at most (``Lanes.BATCH``).
    BATCH = Lanes.BATCH

    def __init__(
        self,
        settings: Settings,
        clocks: Clocks = SYSTEM_CLOCKS,
        pool: ConnectionPool | None = None,
        trips: RoundTrips | None = None,
        lanes: type[Lanes] = Lanes,
    ) -> None:
        """``clocks``: the limiter's (``AsyncOperations._use``); ``pool``: connections to
        the master made elsewhere (Sentinel's, a cluster master's), instead of one built
        from ``redis_url``; ``trips``: the read deadline to follow and feed, when it is
        shared (a cluster's, by all its masters); ``lanes``: what sends the batches (a
        cluster master's read redirects)."""
        if pool is None:
            try:
                pool = BlockingConnectionPool.from_url(
                    settings.redis_url, timeout=None, **async_client_options(settings)
                )
            except ValueError as e:
                raise ValueError(f"redis_url {url_error(settings.redis_url, e)}") from None
        self._pool = pool
        self._client = Redis.from_pool(pool)  # for batches and prepare; owns the pool
        self._settings = settings
        self._use(settings, clocks)
        self._read_seconds = settings.redis_timeout
        self._connect_seconds = settings.redis_connect_timeout + settings.redis_timeout
        self._readiness = Readiness()
        self._lanes = lanes(settings, pool, trips or round_trips(settings))

    @property
    def client(self) -> Redis:
        """The redis.asyncio client (for status and tests)."""
        return self._client

    def enqueue(self, script: scripts.ScriptCall, asking: bool = False) -> _Call:
        """``script`` queued with the decisions (``Lanes.enqueue``)."""
        return self._lanes.enqueue(script, asking)

    async def _queued(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call`` in turn for a connection (``Lanes.queued``)."""
        return await self._lanes.queued(call)

    async def call(self, call: scripts.ScriptCall) -> tuple[Any, float]:
        """One EVALSHA, sent in one round trip with the other calls queued at that moment
        (``Lanes``); how long after it was asked for it was written."""
        entered_s = time.monotonic()
        if not self._readiness.ready:  # Redis was away at start: ready it once it answers
            self._readiness.in_background(self.prepare)
        queued = self.enqueue(call)
        reply = await queued.future  # cancelled: the lane skips or drops the reply
        return reply, queued.sent - entered_s

    async def batch(self, batch: Batch) -> list[Any]:
        """``batch``'s commands in one pipeline, in turn for a connection like a lane."""

        async def pipelined() -> list[Any]:
            async with Deadline(self._connect_seconds + self._read_seconds):
                pipe = self._client.pipeline(transaction=False)
                for name, args, keywords in batch.commands:
                    getattr(pipe, name)(*args, **keywords)
                return await pipe.execute(raise_on_error=False)

        return await self._queued(pipelined)

    def subscribe(self, channel: str, heard: Heard) -> Listener | None:
        """``channel`` heard on a synchronous client of its own, on its own thread."""
        return listen(self._settings, channel, lambda: redis_connect(self._settings), heard)

    async def prepare(self) -> None:
        """Once, on the first connection that works (``backends/readiness.py``): SCRIPT
        LOAD, so a decision is one round trip, not NOSCRIPT + load, and the eviction
        check. BackendError when Redis does not answer; the next caller tries again."""

        async def load() -> list[str | None]:
            async with Deadline(self._connect_seconds + self._read_seconds):
                for source in scripts.SCRIPTS.values():
                    await self._client.script_load(source)
                try:
                    return [eviction_policy(await self._client.config_get("maxmemory-policy"))]
                except ResponseError:  # CONFIG refused (ACL, renamed): nothing to check
                    return []

        await self._readiness.get_ready_async(lambda: self._queued(load))

    async def aclose(self) -> None:
        """Stop the lanes, then close the client and every pooled connection."""
        await self._readiness.cancel()
        await self._lanes.stop()
        await self._client.aclose()
        await self._pool.disconnect()


def _resolve(
    future: asyncio.Future[Any], reply: Any = None, *, error: Exception | None = None
) -> None:
    """Answer one caller, unless it stopped waiting (cancelled)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(reply)


def _describe(error: BaseException) -> str:
    if isinstance(error, TimeoutError) and not isinstance(error, redis.RedisError):
        return "TimeoutError: no answer within redis_timeout"
    return scripts.describe(error)
