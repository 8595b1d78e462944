"""On Redis Cluster, a process hears slot grants on any node (PUBLISH reaches every
node); when the node it listens on dies, it listens on another, picked afresh from the
slot map, instead of trying the dead one for ever."""

from __future__ import annotations

import itertools

import pytest
import redis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.backends.slots import channel
from gateway_limiter.backends.subscriptions import cluster_connect
from gateway_limiter.config.settings import Settings
from tests.support.clusters import LocalCluster, wait_for
from tests.support.limiting import write_row
from tests.support.services import free_port
from tests.support.slots import handed_over_after_recovery

URL = "/supplier/heard-on-a-cluster"

pytestmark = pytest.mark.slow


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    write_row(limiter_db[1], URL, rateLimit=1000, cache=0.5, maxConcurrent=1)
    return limiter_db


def listeners(cluster: LocalCluster, prefix: str) -> dict[int, int]:
    """Per running node (by port): how many connections to it hear ``prefix``'s grants."""
    name = channel(prefix).encode()
    heard = {}
    for node in cluster.running():
        try:
            heard[node.port] = int(dict(node.client().pubsub_numsub(name))[name])
        except redis.ConnectionError:  # stopping
            continue
    return heard


def test_each_connection_is_to_another_node_with_the_urls_credentials(
    redis_cluster: LocalCluster,
) -> None:
    # (first in this module: the next test kills a node)
    url = redis_cluster.url.replace("redis+cluster://", "redis+cluster://gw:s%40cret@")
    decisions = redis_cluster.client()
    connect = cluster_connect(Settings(redis_url=url), decisions)
    assert connect is not None
    known = {(node.host, int(node.port)) for node in decisions.get_nodes()}  # type: ignore[no-untyped-call]
    picked = []
    for _ in range(6):
        client = connect()
        given = client.connection_pool.connection_kwargs
        assert (given["username"], given["password"]) == ("gw", "s@cret")
        picked.append((given["host"], given["port"]))
        client.close()
    assert set(picked) <= known
    assert all(a != b for a, b in itertools.pairwise(picked))  # never twice running


def test_the_subscription_moves_off_a_dead_node(
    limiter_db: tuple[str, Engine], redis_cluster: LocalCluster, key_prefix: str
) -> None:
    with GatewayLimiter(
        database_url=limiter_db[0],
        redis_url=redis_cluster.url,
        key_prefix=key_prefix,
        reload_interval=3600,
        on_backend_error="local",
    ) as lim:
        with lim.slot(URL):
            pass
        wait_for("the subscription", lambda: lim._slotting.listening, 5)  # its own thread
        on = [port for port, n in listeners(redis_cluster, key_prefix).items() if n]
        assert len(on) == 1, listeners(redis_cluster, key_prefix)
        dead = redis_cluster.node_on(on[0])
        was_master = dead.port in redis_cluster.master_ports()
        dead.kill()
        if was_master:  # its replica takes its slots (not Redis' election: a starved
            redis_cluster.force_failover_of(dead)  # host can delay that past any bound)
        redis_cluster.wait_healthy()

        def heard_elsewhere() -> bool:
            return sum(listeners(redis_cluster, key_prefix).values()) == 1

        wait_for("a subscriber on a live node", heard_elsewhere, 15)
        wait_for("the limiter to hear grants again", lambda: lim._slotting.listening, 5)

        # a grant published now reaches a waiter of this process, once decisions go to
        # the slot's master again
        client = redis_cluster.client()
        handed_over_after_recovery(lim, URL, key_prefix, client, "in the cluster again")
        assert lim._slotting.listening


def test_a_cluster_client_that_knows_no_node_yet_is_a_connect_to_try_again() -> None:
    # an asyncio cluster client before its first call: its table of nodes is empty
    url = f"redis+cluster://127.0.0.1:{free_port()}"
    unstarted = AsyncRedisCluster(host="127.0.0.1", port=free_port())
    connect = cluster_connect(Settings(redis_url=url), unstarted)
    assert connect is not None
    with pytest.raises(OSError, match="no cluster node to subscribe on yet"):
        connect()  # what the Subscriber treats as a lost connection: it tries again
