"""``redis+cluster://`` for asyncio: the scripts on a Redis Cluster, through
``redis.asyncio.cluster.RedisCluster``.

How it works: docs/internals.md, section ``gateway_limiter.backends.cluster_async``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis
from redis.asyncio import BlockingConnectionPool
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import AskError, MovedError, NoScriptError, ResponseError

from gateway_limiter.backends import scripts
from gateway_limiter.backends.base import SYSTEM_CLOCKS, BackendError, Clocks, Heard, Listener
from gateway_limiter.backends.calls import Batch
from gateway_limiter.backends.cluster import (
    Redirected,
    batch_error,
    cluster_options,
    cluster_policies,
)
from gateway_limiter.backends.connections import connection_failed, round_trips
from gateway_limiter.backends.operations_async import AsyncOperations
from gateway_limiter.backends.readiness import Readiness
from gateway_limiter.backends.redis import CLIENT_ERRORS
from gateway_limiter.backends.redis_async import (
    Deadline,
    Lanes,
    async_client_options,
)
from gateway_limiter.backends.schemes import register_async
from gateway_limiter.backends.subscriptions import cluster_connect, listen
from gateway_limiter.backends.topology import parse_endpoints
from gateway_limiter.config.settings import Settings

T = TypeVar("T")


class MasterLanes(Lanes):
    """The lanes of ``backends/redis_async.py`` on one master of a cluster: a redirect
    in a batch answers its caller with ``Redirected`` (any other error reply, as on one
    Redis, with its own BackendError)."""

    __slots__ = ()

    def _reply_error(self, error: ResponseError) -> Exception:
        return batch_error(error)

    async def aclose(self) -> None:
        """Stop the lanes, then close every pooled connection."""
        await self.stop()
        await self._pool.disconnect()


@register_async("redis+cluster")
class AsyncRedisClusterBackend(AsyncOperations):
    """The scripts on a Redis Cluster, awaited: each call on its interface's master,
    sharing round trips with the other calls to that master (the transport under
    ``AsyncOperations``'s operations)."""

    #: Redirects a call follows at most (a slot moving again and again) before it fails.
    REDIRECTS = 5
    __slots__ = (
        "_client",
        "_closed",
        "_connect_seconds",
        "_failures",
        "_lanes",
        "_lanes_options",
        "_readiness",
        "_round_trips",
        "_settings",
        "_slots",
        "_unanswered",
    )

    def __init__(self, settings: Settings, clocks: Clocks = SYSTEM_CLOCKS) -> None:
        endpoints = parse_endpoints(settings.redis_url)
        options = cluster_options(settings, endpoints) | async_client_options(settings)
        options["socket_connect_timeout"] = settings.redis_connect_timeout  # under Deadline
        # Built now, connected on first use (initialize), so start never fails on it.
        self._client = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in endpoints.nodes],
            **options,
        )
        self._use(settings, clocks)
        self._connect_seconds = settings.redis_connect_timeout
        self._round_trips = round_trips(settings)  # the read deadline, as it adapts
        self._slots = asyncio.Semaphore(settings.redis_pool_size)  # FIFO
        self._failures = 0
        self._readiness = Readiness()
        self._settings = settings
        #: each master's lanes, by node name ("host:port"), made on its first call
        self._lanes: dict[str, MasterLanes] = {}
        # the lanes' connections: the decision path's options (Deadlines time them)
        self._lanes_options = async_client_options(settings) | {
            "username": endpoints.username,
            "password": endpoints.password,
        }
        #: masters whose lanes failed: their calls go alone until one is answered
        self._unanswered: set[str] = set()
        self._closed = False  # aclose() began: no new lanes (their pools would leak)

    @property
    def client(self) -> RedisCluster:
        """The redis.asyncio cluster client (for status and tests)."""
        return self._client

    @property
    def read_deadline_s(self) -> float:
        """The read deadline now (``backends/round_trips.py``), in s."""
        return self._round_trips.timeout_s

    async def _queued(self, call: Callable[[], Awaitable[T]]) -> T:
        """In turn for a slot, ``call`` within the Deadline; Redis errors -> BackendError."""
        failures = self._failures
        async with self._slots:
            if self._failures != failures:
                raise BackendError("Redis failed while this call was queued for a connection")
            trips = self._round_trips
            try:
                sent = time.monotonic()
                async with Deadline(self._connect_seconds + trips.timeout_s):
                    result = await call()
                trips.observe(time.monotonic() - sent)
                return result
            except CLIENT_ERRORS as e:  # OSError includes TimeoutError
                self._failures += 1
                if isinstance(e, TimeoutError) and not isinstance(e, redis.RedisError):
                    raise BackendError("TimeoutError: no answer within the timeouts") from e
                raise BackendError(scripts.describe(e)) from e

    async def _evalsha(self, call: scripts.ScriptCall) -> Any:
        """EVALSHA, and after NOSCRIPT (``backends/scripts.py``) EVAL with the script's
        source: it goes where the key is, following MOVED and ASK, and leaves the script
        cached there (``RedisClusterBackend._again`` says why not SCRIPT LOAD)."""
        client = self._client
        try:
            return await client.evalsha(*call.evalsha)
        except NoScriptError:  # a promoted replica, a restarted or new node
            return await client.eval(call.source, *call.evalsha[1:])

    def _master_of(self, call: scripts.ScriptCall) -> ClusterNode | None:
        """The master of ``call``'s slot in the slot map; None before the client has one,
        or while the slot has no master in it."""
        try:
            return self._client.get_node_from_key(call.key)
        except CLIENT_ERRORS:
            return None

    def _lanes_of(self, node: ClusterNode) -> MasterLanes:
        """The lanes of the master ``node`` (made now on its first call)."""
        lanes = self._lanes.get(node.name)
        if lanes is None:
            if self._closed:
                raise BackendError("the limiter's Redis Cluster backend is closed")
            pool = BlockingConnectionPool(
                host=node.host, port=node.port, timeout=None, **self._lanes_options
            )
            lanes = self._lanes[node.name] = MasterLanes(
                self._settings, pool=pool, trips=self._round_trips
            )
        return lanes

    async def _ask(self, call: scripts.ScriptCall) -> tuple[Any, float]:
        """``call``'s reply, and how long after it was asked for it was written (s): in a
        batch of its master's lanes, after a redirect in the lanes of the node it names,
        or alone through the cluster client (see the module's doc)."""
        asked = time.monotonic()
        node, asking = self._master_of(call), False
        for _hop in range(self.REDIRECTS + 1):
            if node is None or node.name in self._unanswered:
                return await self._alone(call, node), time.monotonic() - asked
            queued = self._lanes_of(node).enqueue(call, asking)
            try:
                return await queued.future, queued.sent - asked  # cancelled: see _lane
            except Redirected as redirect:
                node, asking = await self._redirected(call, redirect.args[0])
            except BackendError as e:
                if connection_failed(e):
                    self._unanswered.add(node.name)
                raise
        raise BackendError(f"redirected more than {self.REDIRECTS} times: {call.key!r}")

    async def _redirected(
        self, call: scripts.ScriptCall, error: ResponseError
    ) -> tuple[ClusterNode | None, bool]:
        """Where ``call`` goes after ``error`` (a redirect), and whether ASKING goes first.
        MOVED: the slot map is updated as the cluster client does it, and the call goes
        to the slot's new master; ASK: to the node named, after ASKING; TRYAGAIN,
        CLUSTERDOWN: alone through the cluster client (None)."""
        if isinstance(error, MovedError):
            await self._client.nodes_manager.move_slot(error)
            return self._master_of(call), False
        if isinstance(error, AskError):
            return self._client.get_node(host=error.host, port=error.port), True
        return None, False

    async def _alone(self, call: scripts.ScriptCall, node: ClusterNode | None) -> Any:
        """``call`` alone through the cluster client; after it is answered, ``node``'s
        calls go in its lanes again (if it failed: it answers again, or its slot moved)."""
        reply = await self._queued(lambda: self._evalsha(call))
        if node is not None:
            self._unanswered.discard(node.name)
        return reply

    async def call(self, call: scripts.ScriptCall) -> tuple[Any, float]:
        """One EVALSHA on the master of its keys' slot, in one round trip with the other
        calls to that master queued at that moment (``_ask``)."""
        if not self._readiness.ready:  # the cluster was away at start: ready it once it answers
            self._readiness.in_background(self.prepare)
        return await self._ask(call)

    async def batch(self, batch: Batch) -> list[Any]:
        """``batch``'s commands one after the other through the cluster client, where its
        key lives (TIME on the node that holds it), in turn like ``_alone``."""

        async def each() -> list[Any]:
            replies: list[Any] = []
            for name, args, keywords in batch.commands:
                where = keywords
                if name == "time":
                    where = {"target_nodes": self._client.get_node_from_key(batch.key)}
                try:
                    replies.append(await getattr(self._client, name)(*args, **where))
                except ResponseError as e:  # this command's own (WRONGTYPE, a script's)
                    replies.append(e)
            return replies

        return await self._queued(each)

    def subscribe(self, channel: str, heard: Heard) -> Listener | None:
        """``channel`` heard on any node (PUBLISH reaches every one), on a synchronous
        client of its own, picked from this client's slot map at each connect."""
        client = self._client
        return listen(
            self._settings, channel, lambda: cluster_connect(self._settings, client), heard
        )

    async def prepare(self) -> None:
        """Once, when the cluster first answers (``backends/readiness.py``): SCRIPT LOAD on
        every master, and the eviction check of every master. BackendError when no node
        answers; the next caller tries again."""

        async def load() -> list[str | None]:
            for source in scripts.SCRIPTS.values():
                await self._client.script_load(source)
            try:
                replies = await self._client.config_get(
                    "maxmemory-policy", target_nodes=RedisCluster.PRIMARIES
                )
            except redis.ResponseError:  # CONFIG refused (ACL, renamed): nothing to check
                return []
            return cluster_policies(replies)

        await self._readiness.get_ready_async(lambda: self._queued(load))

    async def aclose(self) -> None:
        """Stop every master's lanes, and close every node's connections."""
        self._closed = True
        await self._readiness.cancel()
        lanes, self._lanes = list(self._lanes.values()), {}
        for master in lanes:
            await master.aclose()
        await self._client.aclose()
