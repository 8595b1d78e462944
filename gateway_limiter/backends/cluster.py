"""``redis+cluster://``: the scripts on a Redis Cluster, through redis-py's ``RedisCluster``.

The decision is the one of ``backends/redis.py`` (its ``ScriptBackend``: the same script
calls and reply parsing, from ``backends/scripts.py``): one EVALSHA, sent to the master
that serves the slot of its keys. Every key of an interface carries the interface's
``{hash tag}`` (``backends/state.py``) and one call decides one interface, so every
call's keys lie in one slot and no configuration can make a CROSSSLOT.

What the cluster adds, and how each is met:

- **MOVED / ASK** (a slot resharded, a failover done): redis-py follows the redirect
  within the call, as Redis Cluster clients must, and updates its slot map. That is
  routing, not a retry: the call still fails at once when a node does not answer.
- **A node that fails** (refused, timed out): no retry here (the failure policy is the
  retry); redis-py refreshes its map of the cluster from the other nodes, and the call
  raises BackendError. While the cluster promotes a replica, the breaker and
  ``on_backend_error`` decide; afterwards the new master answers.
- **NOSCRIPT** (a promoted replica, a restarted node never saw SCRIPT LOAD; scripts are
  not replicated): SCRIPT LOAD on that node, and the EVALSHA again; never an error.
- **Timeouts**: ``redis_timeout`` per read and ``redis_connect_timeout`` per connect, on
  every node, as for one Redis.

The client is built on first use, not at start: ``RedisCluster`` asks a node for the
slot map when built, and an unreachable cluster at start must mean the failure policy,
not a gateway that does not start.
"""

from __future__ import annotations

import threading
from typing import Any

import redis
from redis.cluster import ClusterNode, RedisCluster

from gateway_limiter.backends.readiness import Readiness
from gateway_limiter.backends.redis import (
    ScriptBackend,
    backend_errors,
    client_options,
    eviction_policy,
    following,
    round_trips,
)
from gateway_limiter.backends.schemes import register
from gateway_limiter.backends.scripts import Commands, ScriptCall
from gateway_limiter.backends.topology import Endpoints, parse_endpoints
from gateway_limiter.config.settings import Settings


def cluster_options(settings: Settings, endpoints: Endpoints) -> dict[str, Any]:
    """``RedisCluster`` keywords: the decision path's options, for every node."""
    return client_options(settings) | {
        # redirects (MOVED, ASK) are followed; failures are not retried (retry: 0)
        "require_full_coverage": False,
        "username": endpoints.username,
        "password": endpoints.password,
    }


def cluster_policies(replies: Any) -> list[str | None]:
    """Each master's ``maxmemory-policy`` from CONFIG GET on the primaries: one node
    asked gives its reply; several, ``{node name: reply}``."""
    if isinstance(replies, dict) and all(isinstance(r, dict) for r in replies.values()):
        return [eviction_policy(r) for r in replies.values()]
    return [eviction_policy(replies)]


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@register("redis+cluster")
class RedisClusterBackend(ScriptBackend):
    """The scripts on a Redis Cluster: each call on the master of its interface's slot."""

    shared = True
    __slots__ = (
        "_client",
        "_commands",
        "_endpoints",
        "_lock",
        "_prefix",
        "_readiness",
        "_round_trips",
        "_settings",
    )

    def __init__(self, settings: Settings) -> None:
        self._endpoints = parse_endpoints(settings.redis_url)
        self._settings = settings
        self._prefix = settings.key_prefix
        self._commands = Commands(settings.key_prefix)
        self._client: RedisCluster | None = None
        self._lock = threading.Lock()
        self._readiness = Readiness()
        self._round_trips = round_trips(settings)

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
                # connection_pool_class: a blocking pool, so a thread waits up to
                # redis_timeout for a connection to a node, as with one Redis.
                url=f"redis://{_netloc(host, port)}",
                startup_nodes=[ClusterNode(h, p) for h, p in others],  # type: ignore[no-untyped-call]
                connection_pool_class=redis.BlockingConnectionPool,
                # every node's reads under the deadline of backends/round_trips.py
                connection_class=following(redis.Connection, self._round_trips),
                timeout=self._settings.redis_timeout,
                **cluster_options(self._settings, self._endpoints),
            )

    def _load(self, client: Any, call: ScriptCall) -> None:
        """SCRIPT LOAD on the master of the call's slot (a promoted replica, a restarted
        node: scripts are not replicated)."""
        node = client.get_node_from_key(call.key)
        client.execute_command("SCRIPT LOAD", call.source, target_nodes=node)

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

    def close(self) -> None:
        """Close every node's connections."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
