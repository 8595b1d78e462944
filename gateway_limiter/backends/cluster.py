"""``redis+cluster://``: the scripts on a Redis Cluster, through redis-py's ``RedisCluster``.

The decision is the one of ``backends/redis.py`` (same ``Commands``, same scripts, same
reply parsing): one EVALSHA, sent to the master that serves the slot of its keys. Every
key of an interface carries the interface's ``{hash tag}`` (``backends/state.py``) and
one call decides one interface, so every call's keys lie in one slot and no
configuration can make a CROSSSLOT.

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

from gateway_limiter.backends.base import BackendError
from gateway_limiter.backends.redis import (
    SCRIPTS,
    Commands,
    client_options,
    parse_reply,
    parse_state,
)
from gateway_limiter.backends.schemes import register
from gateway_limiter.backends.state import state_key
from gateway_limiter.backends.topology import Endpoints, parse_endpoints
from gateway_limiter.config.rules import Rule
from gateway_limiter.config.settings import Settings
from gateway_limiter.model.bucket import BucketState, Verdict


def cluster_options(settings: Settings, endpoints: Endpoints) -> dict[str, Any]:
    """``RedisCluster`` keywords: the decision path's options, for every node."""
    return client_options(settings) | {
        # redirects (MOVED, ASK) are followed; failures are not retried (retry: 0)
        "require_full_coverage": False,
        "username": endpoints.username,
        "password": endpoints.password,
    }


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@register("redis+cluster")
class RedisClusterBackend:
    """The scripts on a Redis Cluster: each call on the master of its interface's slot."""

    shared = True
    __slots__ = ("_client", "_commands", "_endpoints", "_lock", "_prefix", "_settings")

    def __init__(self, settings: Settings) -> None:
        self._endpoints = parse_endpoints(settings.redis_url)
        self._settings = settings
        self._prefix = settings.key_prefix
        self._commands = Commands(settings.key_prefix)
        self._client: RedisCluster | None = None
        self._lock = threading.Lock()

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
        try:
            return RedisCluster(
                # Given a URL, RedisCluster builds each node's pool with
                # connection_pool_class: a blocking pool, so a thread waits up to
                # redis_timeout for a connection to a node, as with one Redis.
                url=f"redis://{_netloc(host, port)}",
                startup_nodes=[ClusterNode(h, p) for h, p in others],  # type: ignore[no-untyped-call]
                connection_pool_class=redis.BlockingConnectionPool,
                timeout=self._settings.redis_timeout,
                **cluster_options(self._settings, self._endpoints),
            )
        except (redis.RedisError, OSError) as e:
            raise BackendError(f"{type(e).__name__}: {e}") from e

    def reserve(
        self,
        rule: Rule,
        permits: int,
        timeout: float | None,
        caller: str | None = None,
        *,
        now: float | None = None,
    ) -> Verdict:
        """One EVALSHA on the master of the interface's slot (plus a SCRIPT LOAD there
        when that node lacks the script). ``now`` (µs) is for tests that drive the clock."""
        name, args = self._commands(rule, permits, timeout, caller, now)
        sha = self._commands.shas[name]
        try:
            client = self.client
            try:
                reply = client.evalsha(sha, *args)
            except redis.exceptions.NoScriptError:  # a promoted replica, a restarted node
                node = client.get_node_from_key(args[1])  # type: ignore[no-untyped-call]
                client.execute_command(  # type: ignore[no-untyped-call]
                    "SCRIPT LOAD", SCRIPTS[name], target_nodes=node
                )
                reply = client.evalsha(sha, *args)
        except (redis.RedisError, OSError) as e:
            raise BackendError(f"{type(e).__name__}: {e}") from e
        return parse_reply(reply)

    def peek(self, rule: Rule) -> tuple[BucketState | None, float]:
        """GET and TIME in one pipeline, on the node that holds the key."""
        key = state_key(self._prefix, rule)
        try:
            client = self.client
            node = client.get_redis_connection(client.get_node_from_key(key))  # type: ignore[no-untyped-call]
            pipe = node.pipeline(transaction=False)
            pipe.get(key)
            pipe.time()
            raw, (sec, usec) = pipe.execute()
        except (redis.RedisError, OSError) as e:
            raise BackendError(f"{type(e).__name__}: {e}") from e
        return parse_state(raw), sec * 1_000_000.0 + usec

    def prepare(self) -> None:
        """SCRIPT LOAD on every master now, so first decisions are one round trip."""
        try:
            client = self.client
            for source in SCRIPTS.values():
                client.script_load(source)
        except (redis.RedisError, OSError) as e:
            raise BackendError(f"{type(e).__name__}: {e}") from e

    def close(self) -> None:
        """Close every node's connections."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
