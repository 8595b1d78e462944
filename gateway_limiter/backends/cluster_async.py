"""``redis+cluster://`` for asyncio: the scripts on a Redis Cluster, through
``redis.asyncio.cluster.RedisCluster``.

The same decisions as ``backends/cluster.py`` (the script calls and reply parsing of
``backends/scripts.py``, with this module's I/O): one EVALSHA on the master of the
interface's slot; MOVED and ASK followed by redis-py within the call; no retry of a
failed node (BackendError, and the failure policy decides); NOSCRIPT answered by a
SCRIPT LOAD on that node.

As in ``backends/redis_async.py``, callers queue first come, first served for one of
``redis_pool_size`` slots, a call that fails makes the callers queued behind it give up
at once, and a ``Deadline`` rather than a socket timeout bounds each call, so a busy
loop does not blame Redis. One difference: the cluster client opens a node's
connections inside the call, so connecting and asking cannot be timed apart; a call
gets ``redis_connect_timeout + redis_timeout`` in all. A node that refuses fails at once;
one that hangs costs a caller that much (the breaker then keeps the others off it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import NoScriptError

from gateway_limiter.backends import scripts
from gateway_limiter.backends.base import BackendError
from gateway_limiter.backends.cluster import cluster_options, cluster_policies
from gateway_limiter.backends.fleet import (
    fleet_key,
    heartbeat_args,
    parse_heartbeat,
    parse_members,
)
from gateway_limiter.backends.readiness import Readiness
from gateway_limiter.backends.redis import CLIENT_ERRORS
from gateway_limiter.backends.redis_async import Deadline, async_client_options
from gateway_limiter.backends.schemes import register_async
from gateway_limiter.backends.state import state_key
from gateway_limiter.backends.topology import parse_endpoints
from gateway_limiter.config.rules import Rule
from gateway_limiter.config.settings import Settings
from gateway_limiter.model.bucket import BucketState, Verdict
from gateway_limiter.model.pushback import PushbackState

T = TypeVar("T")


@register_async("redis+cluster")
class AsyncRedisClusterBackend:
    """The scripts on a Redis Cluster, awaited: each call on its interface's master."""

    shared = True
    __slots__ = (
        "_client",
        "_commands",
        "_failures",
        "_prefix",
        "_readiness",
        "_seconds",
        "_slots",
    )

    def __init__(self, settings: Settings) -> None:
        endpoints = parse_endpoints(settings.redis_url)
        options = cluster_options(settings, endpoints) | async_client_options(settings)
        options["socket_connect_timeout"] = settings.redis_connect_timeout  # under Deadline
        # Built now, connected on first use (initialize), so start never fails on it.
        self._client = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in endpoints.nodes],
            **options,
        )
        self._prefix = settings.key_prefix
        self._seconds = settings.redis_connect_timeout + settings.redis_timeout
        self._slots = asyncio.Semaphore(settings.redis_pool_size)  # FIFO
        self._failures = 0
        self._commands = scripts.Commands(settings.key_prefix)
        self._readiness = Readiness()

    @property
    def client(self) -> RedisCluster:
        """The redis.asyncio cluster client (for status and tests)."""
        return self._client

    async def _queued(self, call: Callable[[], Awaitable[T]]) -> T:
        """In turn for a slot, ``call`` within the Deadline; Redis errors -> BackendError."""
        failures = self._failures
        async with self._slots:
            if self._failures != failures:
                raise BackendError("Redis failed while this call was queued for a connection")
            try:
                async with Deadline(self._seconds):
                    return await call()
            except CLIENT_ERRORS as e:  # OSError includes TimeoutError
                self._failures += 1
                if isinstance(e, TimeoutError) and not isinstance(e, redis.RedisError):
                    raise BackendError("TimeoutError: no answer within the timeouts") from e
                raise BackendError(scripts.describe(e)) from e

    async def _evalsha(self, call: scripts.ScriptCall) -> Any:
        """EVALSHA, and after NOSCRIPT (``backends/scripts.py``) SCRIPT LOAD on the master
        of the call's slot and EVALSHA again."""
        client = self._client
        try:
            return await client.evalsha(*call.evalsha)
        except NoScriptError:  # a promoted replica, a restarted node: load there
            node = client.get_node_from_key(call.key)
            await client.execute_command("SCRIPT LOAD", call.source, target_nodes=node)
            return await client.evalsha(*call.evalsha)

    async def reserve(
        self, rule: Rule, permits: int, timeout: float | None, caller: str | None = None
    ) -> Verdict:
        """One EVALSHA on the master of the interface's slot."""
        if not self._readiness.ready:  # the cluster was away at start: ready it once it answers
            self._readiness.in_background(self.prepare)
        call = self._commands(rule, permits, timeout, caller, None)
        return scripts.parse_reply(await self._queued(lambda: self._evalsha(call)))

    async def pushback(
        self, rule: Rule, retry_after: float | None, caller: str | None = None
    ) -> tuple[float, float]:
        """One EVALSHA of ``pushback.lua`` on the master of the interface's slot."""
        call = self._commands.pushback(rule, retry_after, caller, None)
        return scripts.parse_pushback(await self._queued(lambda: self._evalsha(call)))

    async def script(self, call: scripts.ScriptCall) -> Any:
        """Any other script call (``limiter.slot``'s), on the master of its keys' slot."""
        return await self._queued(lambda: self._evalsha(call))

    async def peek(self, rule: Rule) -> tuple[BucketState | None, float]:
        """GET, then TIME on the node that holds the key."""
        key = state_key(self._prefix, rule)

        async def both() -> tuple[Any, Any]:
            raw = await self._client.get(key)
            node = self._client.get_node_from_key(key)
            return raw, await self._client.time(target_nodes=node)

        raw, time_reply = await self._queued(both)
        return scripts.parse_state(raw), scripts.clock_us(time_reply)

    async def peek_pushback(self, rule: Rule) -> tuple[PushbackState | None, float]:
        """GET, then TIME on the node that holds the key, like ``peek``."""
        key, in_bucket = scripts.pushback_peek_key(self._prefix, rule)

        async def both() -> tuple[Any, Any]:
            raw = await self._client.get(key)
            node = self._client.get_node_from_key(key)
            return raw, await self._client.time(target_nodes=node)

        raw, time_reply = await self._queued(both)
        return scripts.parse_pushback_state(raw, in_bucket), scripts.clock_us(time_reply)

    async def prepare(self) -> None:
        """Once, when the cluster first answers (``backends/readiness.py``): SCRIPT LOAD on
        every master, and the eviction check of every master. BackendError when no node
        answers; the next caller tries again."""
        if not self._readiness.claim():
            return

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

        try:
            policies = await self._queued(load)
        except BaseException:
            self._readiness.release()
            raise
        self._readiness.done(policies)

    async def heartbeat(self, member: str, ttl_ms: int) -> int:
        """One EVAL of the fleet's heartbeat on the master of the set's slot."""
        args = heartbeat_args(self._prefix, member, ttl_ms)
        return parse_heartbeat(await self._queued(lambda: self._client.eval(*args)))

    async def members(self) -> tuple[list[tuple[str, float]], float]:
        """ZRANGE, then TIME on the node that holds the set."""
        key = fleet_key(self._prefix)

        async def both() -> tuple[Any, Any]:
            entries = await self._client.zrange(key, 0, -1, withscores=True)
            node = self._client.get_node_from_key(key)
            return entries, await self._client.time(target_nodes=node)

        entries, time_reply = await self._queued(both)
        live, now_ms = parse_members(entries, time_reply)
        return list(live), now_ms

    async def aclose(self) -> None:
        """Close every node's connections."""
        await self._readiness.cancel()
        await self._client.aclose()
