"""The asyncio ``redis+cluster://`` backend's read deadline follows the round trips it
sees, like the other backends' (``backends/round_trips.py``): slow replies lengthen it
up to ``redis_timeout_ceiling``, instead of a fixed ``redis_timeout``. On a real
Redis Cluster, slowed with ``CLIENT PAUSE``.

Decisions go in their master's lanes, whose round trips get the read deadline alone
(as on one Redis: connecting is timed apart), so the pause is shorter than the floor:
the slow reply is admitted, and the deadline rises past the floor."""

from __future__ import annotations

import time

from sqlalchemy import Engine

from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.backends.cluster_async import AsyncRedisClusterBackend
from tests.support.clusters import LocalCluster
from tests.support.limiting import write_row

PAUSE_MS = 100


async def test_slow_replies_lengthen_the_read_deadline_up_to_the_ceiling(
    migrated_db: tuple[str, Engine], redis_cluster: LocalCluster, key_prefix: str
) -> None:
    url, engine = migrated_db
    write_row(engine, "/slow/cluster", rateLimit=1000, cache=0.0)
    async with AsyncGatewayLimiter(
        database_url=url,
        redis_url=redis_cluster.url,
        key_prefix=key_prefix,
        redis_timeout=0.2,
        redis_timeout_ceiling=0.8,
    ) as alim:
        backend = alim.backend
        assert isinstance(backend, AsyncRedisClusterBackend)
        for _ in range(5):
            assert (await alim.decide("/slow/cluster", timeout=0)).reason == "admitted"
        # (the first calls also connected to the nodes, which a loaded host may make
        # slow: the deadline may have risen already; with a fixed one it stays 0.2)
        assert 0.2 <= backend.read_deadline_s <= 0.8
        for port in redis_cluster.master_ports():
            redis_cluster.node_on(port).client().client_pause(PAUSE_MS, all=True)
        started = time.monotonic()
        slow = await alim.decide("/slow/cluster", timeout=0)
        took = time.monotonic() - started
        assert slow.reason == "admitted"  # a slow reply, not an outage
        assert took >= PAUSE_MS / 1000 * 0.5  # the pause did slow it
        # 3 x the slowest round trip, within the ceiling (the call's own overhead on a
        # loaded host, up to 20 ms, is not the round trip's)
        assert min(0.8, 3 * (took - 0.02)) <= backend.read_deadline_s <= 0.8 + 1e-9
        assert alim.backend_fallbacks == 0
