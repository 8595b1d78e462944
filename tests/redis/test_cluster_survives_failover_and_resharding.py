"""A Redis Cluster changing under traffic, from threads and asyncio at once: a master
killed and failed over raises nothing in callers (the failure policy decides meanwhile)
and limiting resumes on the promoted replica, whose missing script is loaded there;
a slot resharded mid-traffic (ASK, then MOVED) is followed without a single failure."""

from __future__ import annotations

from typing import Any

import redis
from sqlalchemy import Engine

from gateway_limiter.backends.scripts import SHAS
from gateway_limiter.backends.state import bucket_key
from tests.support.clusters import LocalCluster, wait_for
from tests.support.limiting import write_row
from tests.support.traffic import RATE, Traffic, flowing, limiting_resumes, stat


def master_of(cluster: LocalCluster, key: str) -> int:
    """Port of the master that serves ``key``'s slot now."""
    node = cluster.running()[0].client()
    slot = int(node.cluster("KEYSLOT", key))
    for start, end, master, *_ in node.cluster("SLOTS"):
        if start <= slot <= end:
            return int(master[1])
    raise AssertionError(f"slot {slot} is not served")


def command(client: redis.Redis, *args: Any) -> Any:
    """A raw command on one node (CLUSTER SETSLOT, MIGRATE...)."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def test_a_master_failover_mid_traffic_raises_nothing_and_limiting_resumes(
    migrated_db: tuple[str, Engine], redis_cluster: LocalCluster, key_prefix: str
) -> None:
    db_url, engine = migrated_db
    url = "/failover/search"
    write_row(engine, url, rateLimit=RATE, cache=0.0, status=1)
    victim = redis_cluster.node_on(master_of(redis_cluster, bucket_key(key_prefix, url)))
    # a generous read timeout: this test is about failover, not a starved host's timeouts
    traffic = Traffic(
        url,
        database_url=db_url,
        redis_url=redis_cluster.url,
        key_prefix=key_prefix,
        redis_timeout=0.5,
        on_backend_error="local",
    ).start()
    try:
        flowing(traffic, what="traffic on the cluster")
        assert traffic.fallbacks == 0
        victim.kill()
        # Callers refused in-process (the last reply named the next permit) ask no one:
        # the outage shows at the next call that asks, within a permit interval.
        wait_for("a caller to see the outage", lambda: traffic.fallbacks > 0, 10)
        try:
            redis_cluster.wait_healthy(10)  # a replica took over the victim's slots
        except RuntimeError:  # the election did not come on a starved host: call it
            redis_cluster.force_failover_of(victim)
            redis_cluster.wait_healthy()
        limiting_resumes(traffic)
        assert traffic.fallbacks > 0  # the outage was seen, and the policy decided
        promoted = redis_cluster.node_on(master_of(redis_cluster, bucket_key(key_prefix, url)))
    finally:
        traffic.stop()
        victim.start()  # rejoins as a replica of its successor
    assert traffic.errors == []
    assert promoted is not victim
    # scripts are not replicated: NOSCRIPT on the promoted node cost a SCRIPT LOAD there,
    # or an EVAL of the source (a call alone after NOSCRIPT on a cluster), which caches it
    node = promoted.client()
    assert stat(node, "script|load") + stat(node, "eval") >= 1
    assert node.script_exists(SHAS["bucket"]) == [True]
    redis_cluster.wait_healthy()


def test_a_node_that_lost_its_scripts_costs_a_script_load_not_a_failure(
    migrated_db: tuple[str, Engine], redis_cluster: LocalCluster, key_prefix: str
) -> None:
    db_url, engine = migrated_db
    url = "/noscript/search"
    write_row(engine, url, rateLimit=RATE, cache=0.0, status=1)
    node = redis_cluster.node_on(master_of(redis_cluster, bucket_key(key_prefix, url))).client()
    traffic = Traffic(
        url,
        database_url=db_url,
        redis_url=redis_cluster.url,
        key_prefix=key_prefix,
        redis_timeout=1.0,
        on_backend_error="deny",
    ).start()
    try:
        flowing(traffic, what="traffic on the cluster")
        loads = stat(node, "script|load") + stat(node, "eval")
        node.script_flush()
        wait_for(
            "the script loaded again",
            lambda: (
                stat(node, "script|load") + stat(node, "eval") > loads
                and node.script_exists(SHAS["bucket"]) == [True]
            ),
            10,
        )
        flowing(traffic, what="traffic after the flush")
    finally:
        traffic.stop()
    assert traffic.errors == [] and traffic.fallbacks == 0
    # the first caller after the FLUSH brought the script back: SCRIPT LOAD from a shared
    # round trip, or EVAL with its source from a call sent alone
    assert stat(node, "script|load") + stat(node, "eval") > loads
    assert node.script_exists(SHAS["bucket"]) == [True]


def test_a_slot_resharded_mid_traffic_is_followed_through_ask_and_moved(
    migrated_db: tuple[str, Engine], redis_cluster: LocalCluster, key_prefix: str
) -> None:
    db_url, engine = migrated_db
    url = "/reshard/search"
    write_row(engine, url, rateLimit=RATE, cache=0.0, status=1)
    key = bucket_key(key_prefix, url)
    source_port = master_of(redis_cluster, key)
    target_port = next(p for p in redis_cluster.master_ports() if p != source_port)
    source = redis_cluster.node_on(source_port).client()
    target = redis_cluster.node_on(target_port).client()
    slot = int(source.cluster("KEYSLOT", key))
    source_id = command(source, "CLUSTER", "MYID").decode()
    target_id = command(target, "CLUSTER", "MYID").decode()
    asking_before = stat(target, "asking")
    # generous timeouts: any failure here would be a redirect not followed
    traffic = Traffic(
        url,
        database_url=db_url,
        redis_url=redis_cluster.url,
        key_prefix=key_prefix,
        redis_timeout=1.0,
        redis_connect_timeout=2.0,
        on_backend_error="deny",
    ).start()
    try:
        flowing(traffic, what="traffic on the source")
        assert source.exists(key)
        command(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        flowing(traffic, what="traffic served on the source, its slot migrating")
        keys = command(source, "CLUSTER", "GETKEYSINSLOT", slot, 100)
        command(source, "MIGRATE", "127.0.0.1", target_port, "", 0, 5000, "KEYS", *keys)
        # the key gone from the source: ASK sends callers to the target
        wait_for("an ASK taken", lambda: stat(target, "asking") > asking_before, 10)
        flowing(traffic, what="traffic asking the target")
        for node in (target, source):
            command(node, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
        for port in redis_cluster.master_ports() - {source_port, target_port}:
            command(
                redis_cluster.node_on(port).client(), "CLUSTER", "SETSLOT", slot, "NODE", target_id
            )
        flowing(traffic, what="traffic told MOVED")  # callers learn the slot's new master
        assert master_of(redis_cluster, key) == target_port
        limiting_resumes(traffic, seconds=1.5)
    finally:
        traffic.stop()
    assert traffic.errors == []
    assert traffic.fallbacks == 0  # not one call failed over the whole resharding
    assert stat(target, "asking") > asking_before  # the ASK redirect was really taken
    # the bucket moved with its slot
    assert command(source, "CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    assert target.exists(key)
