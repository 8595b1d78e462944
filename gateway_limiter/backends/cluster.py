"""``redis+cluster://``: the scripts on a Redis Cluster, through redis-py's ``RedisCluster``.

How it works: docs/internals.md, section ``gateway_limiter.backends.cluster``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import AskError, ClusterDownError, ResponseError, TryAgainError
from redis.maint_notifications import MaintNotificationsConfig

from gateway_limiter.backends.base import SYSTEM_CLOCKS, Clocks, Heard, Listener
from gateway_limiter.backends.connections import (
    call_error,
    connection_failed,
    following,
    read_pipelined,
    round_trips,
    write_pipelined,
)
from gateway_limiter.backends.readiness import Readiness
from gateway_limiter.backends.redis import (
    CLIENT_ERRORS,
    POOL_ARGS,
    ScriptBackend,
    backend_errors,
    client_options,
    eviction_policy,
)
from gateway_limiter.backends.schemes import register
from gateway_limiter.backends.scripts import Packer, ScriptCall
from gateway_limiter.backends.shared_trips import Queued, RoundTripSharing
from gateway_limiter.backends.subscriptions import cluster_connect, listen
from gateway_limiter.backends.topology import Endpoints, parse_endpoints
from gateway_limiter.config.settings import Settings


def cluster_options(settings: Settings, endpoints: Endpoints) -> dict[str, Any]:
    """``RedisCluster`` keywords: the decision path's options, for every node."""
    return client_options(settings) | {
        # redirects (MOVED, ASK) are followed; failures are not retried (retry: 0)
        "require_full_coverage": False,
        # Off, as for asyncio (redis_async.py): redis-py's handler of a slot-migration
        # notice closes a node's free connections the racy way NodePool exists to avoid,
        # and "auto" also skips the pool's check that a pooled connection is still open.
        "maint_notifications_config": MaintNotificationsConfig(enabled=False),
        "username": endpoints.username,
        "password": endpoints.password,
    }


def cluster_policies(replies: Any) -> list[str | None]:
    """Each master's ``maxmemory-policy`` from CONFIG GET on the primaries: one node
    asked gives its reply; several, ``{node name: reply}``."""
    if isinstance(replies, dict) and all(isinstance(r, dict) for r in replies.values()):
        return [eviction_policy(r) for r in replies.values()]
    return [eviction_policy(replies)]


#: Error replies that say where or when to ask, not what the script said: the node did
#: not run the call (MOVED and ASK name another node; TRYAGAIN, CLUSTERDOWN: not now).
REDIRECTS = (AskError, TryAgainError, ClusterDownError)  # MovedError is an AskError


class Redirected(Exception):
    """A call of a shared round trip that the node did not run (``REDIRECTS``, the
    error reply its argument): its caller sends it again (threads: alone, through
    redis-py; asyncio, ``cluster_async.py``: where the redirect says)."""


def batch_error(error: ResponseError) -> Exception:
    """What a call of a batch gets for an error reply: ``Redirected`` for a redirect,
    else its own BackendError."""
    return Redirected(error) if isinstance(error, REDIRECTS) else call_error(error)


class NodePool(redis.BlockingConnectionPool):
    """A node's pool: redis-py's blocking pool, whose free connections are dropped with
    none taken meanwhile.

    redis-py drops a node's free connections when it refreshes the slot map (after a
    call failed to connect, and on every refresh of the map). The blocking pool lists
    the free ones under its own lock and closes them after, while ``get_connection``
    takes one from the queue without that lock: a thread that took a connection in
    between had it closed under it, mid-call (a shared round trip read EBADF or EOF,
    and its callers lost their decisions while the cluster was only failing over).
    Here they are closed under the queue's own lock, which ``get_connection`` takes.
    """

    def disconnect_free_connections(self, moving_address_src: str | None = None) -> None:
        # The pool's lock first, as every caller in redis-py already holds it and as its
        # own get_connection takes them: one order, whoever calls.
        with self._lock, self.pool.mutex:
            for conn in self.pool.queue:
                if conn is not None and self._should_update_connection(
                    conn, "connected_address", moving_address_src
                ):
                    conn.disconnect()


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@register("redis+cluster")
class RedisClusterBackend(ScriptBackend):
    """The scripts on a Redis Cluster: each call on the master of its interface's slot.
    Threads deciding at once share round trips to each master (``shared_trips``)."""

    __slots__ = (
        "_client",
        "_endpoints",
        "_lock",
        "_pack",
        "_readiness",
        "_round_trips",
        "_settings",
        "_sharing",
        "_wait_base_s",
    )

    def __init__(self, settings: Settings, clocks: Clocks = SYSTEM_CLOCKS) -> None:
        self._endpoints = parse_endpoints(settings.redis_url)
        self._settings = settings
        self._use(settings, clocks)
        self._client: RedisCluster | None = None
        self._lock = threading.Lock()
        self._readiness = Readiness()
        self._round_trips = round_trips(settings)
        #: each master's leader/follower queue, by node name ("host:port")
        self._sharing: dict[str, RoundTripSharing] = {}
        self._pack = Packer()  # the cluster's connections: redis-py's default encoding
        # A follower waits for the round trip in flight, then for its own: each may
        # wait for a pooled connection (redis_timeout), open one and read replies.
        self._wait_base_s = settings.redis_timeout + settings.redis_connect_timeout

    @property
    def client(self) -> RedisCluster:
        """The redis-py cluster client (built now if need be; BackendError if no node
        answers)."""
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._connect()
                client = self._client
        return client

    def _connect(self) -> RedisCluster:
        (host, port), *others = self._endpoints.nodes
        with backend_errors():
            return RedisCluster(
                # Given a URL, RedisCluster builds each node's pool with
                # connection_pool_class: NodePool, a blocking pool: so a thread waits up to
                # redis_timeout for a connection to a node, as with one Redis.
                url=f"redis://{_netloc(host, port)}",
                startup_nodes=[ClusterNode(h, p) for h, p in others],  # type: ignore[no-untyped-call]
                connection_pool_class=NodePool,
                # every node's reads under the deadline of backends/round_trips.py
                connection_class=following(redis.Connection, self._round_trips),
                timeout=self._settings.redis_timeout,
                **cluster_options(self._settings, self._endpoints),
            )

    def call(self, call: ScriptCall) -> tuple[Any, float]:
        """``call`` alone, or in one pipeline with other threads' calls to the same
        master (``shared_trips``); a redirect in a batch sends it again alone."""
        asked = time.monotonic()
        with backend_errors():
            client = self.client
            if not self._readiness.ready:  # the cluster was away at start: ready it, once
                self._get_ready(client)
            try:
                name = client.get_node_from_key(call.key).name  # type: ignore[no-untyped-call]
            except CLIENT_ERRORS:  # the slot has no master now: redis-py's own path
                return self._run(call), 0.0
        sharing = self._sharing.get(name)
        if sharing is None:
            sharing = self._shared_on(name)
        try:
            return sharing.run(call)
        except Redirected:  # not run where it was sent: redis-py follows the redirect
            return self._run(call), time.monotonic() - asked

    def _shared_on(self, name: str) -> RoundTripSharing:
        """The queue of the master called ``name`` (made on its first call)."""
        with self._lock:
            sharing = self._sharing.get(name)
            if sharing is None:
                sharing = self._sharing[name] = RoundTripSharing(
                    self._run,  # a leader's call: alone, through redis-py
                    lambda batch, _just_read: self._write_batch(name, batch),
                    self._read_batch,
                    self._follower_wait_s,
                    connection_failed,
                )
        return sharing

    def _follower_wait_s(self) -> float:
        return self._wait_base_s + self._round_trips.timeout_s

    def _write_batch(self, name: str, batch: list[Queued]) -> Any:
        """The batch's EVALSHAs in one write to the master called ``name``, on one of
        its pooled connections; what ``_read_batch`` needs (None: nothing written, each
        call answered with ``Redirected``: the master is gone from the slot map since
        the calls were queued). The connection is dropped when the write fails."""
        with backend_errors():
            client = self.client
            node = client.get_node(node_name=name)  # type: ignore[no-untyped-call]
            if node is None:
                for waiting in batch:
                    waiting.settle(error=Redirected(name))
                return None
            pool = client.get_redis_connection(node).connection_pool
            conn = pool.get_connection(*POOL_ARGS)
            try:
                write_pipelined(conn, self._pack, batch)
            except BaseException:
                conn.disconnect()  # type: ignore[no-untyped-call]
                pool.release(conn)
                raise
        return pool, conn

    def _read_batch(self, batch: list[Queued], written: Any) -> None:
        """The replies of a batch ``_write_batch`` wrote, each caller's its own, a
        redirected one ``Redirected``. The connection is dropped when the round trip
        fails (replies may be unread: never read them later)."""
        if written is None:
            return
        pool, conn = written
        with backend_errors():
            try:
                read_pipelined(conn, self._pack, batch, reply_error=batch_error)
            except BaseException:
                conn.disconnect()
                pool.release(conn)
                raise
            pool.release(conn)

    def _again(self, client: Any, call: ScriptCall) -> Any:
        """``call`` once more after NOSCRIPT (a promoted replica, a restarted or new node:
        scripts are not replicated), as EVAL with the script's source. EVAL goes where
        the key is, following MOVED and ASK as EVALSHA did, and leaves the script cached
        on the node that ran it. A SCRIPT LOAD on the slot's master would miss while the
        slot migrates: ASK sends the call to a node the slot map does not name yet."""
        return client.eval(call.source, *call.evalsha[1:])

    def _policies(self, client: Any) -> list[str | None]:
        """Every master's ``maxmemory-policy`` (none when CONFIG is refused)."""
        try:
            replies = client.config_get("maxmemory-policy", target_nodes=RedisCluster.PRIMARIES)
        except redis.ResponseError:
            return []
        return cluster_policies(replies)

    def _server(self, key: str) -> Any:
        """A connection to the node that holds ``key``."""
        client = self.client
        return client.get_redis_connection(client.get_node_from_key(key))  # type: ignore[no-untyped-call]

    def subscribe(self, channel: str, heard: Heard) -> Listener | None:
        """``channel`` heard on any node (PUBLISH reaches every one), a client of its own
        (``backends/subscriptions.py``)."""
        client = self.client
        return listen(
            self._settings, channel, lambda: cluster_connect(self._settings, client), heard
        )

    def close(self) -> None:
        """Close every node's connections."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
