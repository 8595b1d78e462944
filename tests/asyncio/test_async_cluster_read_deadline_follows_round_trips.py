"""The asyncio ``redis+cluster://`` backend's read deadline follows the round trips it
sees, like the other backends' (``backends/round_trips.py``): slow replies lengthen it
up to ``redis_timeout_ceiling``, instead of a fixed ``redis_timeout``. On a real
Redis Cluster, slowed with ``CLIENT PAUSE``.

Decisions go in their master's lanes, whose round trips get the read deadline alone
(as on one Redis: connecting is timed apart), so the pause is shorter than the floor:
the slow reply is admitted, and the deadline rises past the floor.

The margins are for a loaded 2-core host. The pause is two thirds of the floor: a
host stall during the read of up to a third of the floor still gets the reply in
time, and one before the write of up to a third of the floor still leaves a round trip
that lifts the deadline past it (3 x more than a third). With a 0.2 s floor and a
0.1 s pause, a stall of over 100 ms once timed the read out."""

from __future__ import annotations

import time

from sqlalchemy import Engine

from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.backends.cluster_async import AsyncRedisClusterBackend
from tests.support.clusters import LocalCluster
from tests.support.limiting import write_row

FLOOR_S, CEILING_S = 0.9, 3.0
PAUSE_MS = 600


async def test_slow_replies_lengthen_the_read_deadline_up_to_the_ceiling(
    migrated_db: tuple[str, Engine], redis_cluster: LocalCluster, key_prefix: str
) -> None:
    url, engine = migrated_db
    write_row(engine, "/slow/cluster", rateLimit=1000, cache=0.0)
    async with AsyncGatewayLimiter(
        database_url=url,
        redis_url=redis_cluster.url,
        key_prefix=key_prefix,
        redis_timeout=FLOOR_S,
        redis_timeout_ceiling=CEILING_S,
    ) as alim:
        backend = alim.backend
        assert isinstance(backend, AsyncRedisClusterBackend)
        for _ in range(5):
            assert (await alim.decide("/slow/cluster", timeout=0)).reason == "admitted"
        # (the first calls also connected to the nodes, which a loaded host may make
        # slow: the deadline may have risen already; with a fixed one it stays put)
        before = backend.read_deadline_s
        assert FLOOR_S <= before <= CEILING_S
        # clients connected beforehand: the three pauses start within a few ms
        masters = [redis_cluster.node_on(p).client() for p in redis_cluster.master_ports()]
        for master in masters:
            master.ping()
        for master in masters:
            master.client_pause(PAUSE_MS, all=True)
        started = time.monotonic()
        slow = await alim.decide("/slow/cluster", timeout=0)
        took = time.monotonic() - started
        assert slow.reason == "admitted"  # a slow reply, not an outage
        assert took >= PAUSE_MS / 1000 * 0.5  # the pause did slow it
        after = backend.read_deadline_s
        # 3 x the slowest round trip: past the floor, and no more than 3 x what the
        # call took (its round trip was part of it), within the ceiling
        assert FLOOR_S < after <= CEILING_S
        assert after <= max(before, min(CEILING_S, 3 * took + 0.01))
        assert alim.backend_fallbacks == 0
