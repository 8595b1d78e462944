"""What the cluster tests ask a node directly: which master serves what, how often it
read its sockets or sent a redirect, and raw commands (``CLUSTER SETSLOT``, ``MIGRATE``).
Command counts: ``tests.support.traffic.stat``."""

from __future__ import annotations

from typing import Any

import redis
from redis.crc import key_slot

from gateway_limiter.backends.state import bucket_key
from tests.support.clusters import LocalCluster


def masters(cluster: LocalCluster) -> dict[tuple[int, int], int]:
    """Each slot range and the port of the master that serves it now."""
    slots = cluster.running()[0].client().cluster("SLOTS")
    return {(int(start), int(end)): int(master[1]) for start, end, master, *_ in slots}


def master_of(cluster: LocalCluster, key: str) -> int:
    """The port of the master that serves ``key`` now."""
    slot = key_slot(key.encode())
    return next(port for (a, b), port in masters(cluster).items() if a <= slot <= b)


def urls_on(cluster: LocalCluster, prefix: str, path: str, each: int) -> dict[int, list[str]]:
    """``each`` interface URLs (``path/<n>``) per master whose bucket keys that master
    serves, by its port."""
    ranges = masters(cluster)
    found: dict[int, list[str]] = {port: [] for port in ranges.values()}
    i = 0
    while any(len(urls) < each for urls in found.values()):
        url = f"{path}/{i}"
        i += 1
        slot = key_slot(bucket_key(prefix, url).encode())
        port = next(port for (a, b), port in ranges.items() if a <= slot <= b)
        if len(found[port]) < each:
            found[port].append(url)
    return found


def reads(client: redis.Redis) -> int:
    """How many times this node read from its clients' sockets."""
    stats: dict[str, Any] = client.info("stats")
    return int(stats["total_reads_processed"])


def errors(client: redis.Redis, prefix: str) -> int:
    """How many error replies starting with ``prefix`` (MOVED, ASK) this node sent."""
    stats: dict[str, Any] = client.info("errorstats")
    return int(stats.get(f"errorstat_{prefix}", {}).get("count", 0))


def command(client: redis.Redis, *args: Any) -> Any:
    """A raw command on one node (CLUSTER SETSLOT, MIGRATE, CLIENT PAUSE...)."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]
