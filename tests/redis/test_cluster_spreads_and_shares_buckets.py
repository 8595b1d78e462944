"""On a real Redis Cluster (3 masters, a replica each): the buckets of many interfaces
spread over every master, several processes share each bucket through the cluster, and
asyncio and threads decide on the same state. Bad cluster/sentinel URLs name the value."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.backends.topology import parse_endpoints
from tests.support.clusters import LocalCluster
from tests.support.limiting import state_keys, write_row

RATE = 20
URLS = [f"/supplier/{i}/search" for i in range(6)]
WORKER = textwrap.dedent("""
    import json, sys, threading, time
    from gateway_limiter import GatewayLimiter
    db, redis_url, prefix, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    urls = sys.argv[5].split(",")
    admitted, lock = {u: 0 for u in urls}, threading.Lock()
    # Generous timeouts: this test is about sharing; on a starved host a 50 ms timeout
    # fires falsely and sends the process to its local fallback.
    with GatewayLimiter(database_url=db, redis_url=redis_url, key_prefix=prefix,
                        redis_timeout=2.0, redis_connect_timeout=2.0) as lim:
        print("ready", flush=True)
        start_at = float(sys.stdin.readline())
        time.sleep(max(0.0, start_at - time.time()))
        def work(offset):
            i = offset
            while time.time() < start_at + seconds:
                url = urls[i % len(urls)]
                i += 1
                if lim.try_acquire(url, timeout=0):
                    with lock:
                        admitted[url] += 1
        threads = [threading.Thread(target=work, args=(n,)) for n in range(3)]
        for t in threads: t.start()
        for t in threads: t.join()
        print(json.dumps({"admitted": admitted, "fell_back": lim.backend_fallbacks,
                          "ended": time.time()}))
""")


def test_buckets_of_many_interfaces_spread_over_every_master(
    migrated_db: tuple[str, Engine], redis_cluster: LocalCluster, key_prefix: str
) -> None:
    db_url, engine = migrated_db
    urls = [f"/spread/{i}" for i in range(48)]
    for url in urls:
        write_row(engine, url, rateLimit=5, cache=0.0, status=1)
    with GatewayLimiter(
        database_url=db_url, redis_url=redis_cluster.url, key_prefix=key_prefix
    ) as lim:
        assert all(lim.try_acquire(url, timeout=0) for url in urls)
        assert lim.backend_fallbacks == 0
    masters = redis_cluster.master_ports()
    assert len(masters) == 3
    keys_on = {
        port: state_keys(redis_cluster.node_on(port).client(), key_prefix) for port in masters
    }
    assert sum(len(keys) for keys in keys_on.values()) == len(urls)
    # 48 interfaces hash to slots of all three masters (each is left out by chance
    # with probability (2/3)^48)
    assert all(len(keys) > 0 for keys in keys_on.values()), keys_on


def test_several_processes_share_each_bucket_through_the_cluster(
    migrated_db: tuple[str, Engine], redis_cluster: LocalCluster, key_prefix: str
) -> None:
    db_url, engine = migrated_db
    for url in URLS:
        write_row(engine, url, rateLimit=RATE, cache=0.0, status=1)
    seconds = 2.5
    env = os.environ | {"PYTHONPATH": str(Path(__file__).parents[2])}
    args = [db_url, redis_cluster.url, key_prefix, str(seconds), ",".join(URLS)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(3)
    ]
    try:
        for p in procs:  # imports and start() can take seconds on a loaded host
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready"
        start_at = time.time() + 0.2
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(f"{start_at}\n")
            p.stdin.close()
        results = []
        for p in procs:
            assert p.stdout is not None
            results.append(json.loads(p.stdout.read()))
            assert p.wait(60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [r["fell_back"] for r in results] == [0, 0, 0]  # the cluster decided each call
    span = max(r["ended"] for r in results) - start_at
    for url in URLS:
        counts = [r["admitted"][url] for r in results]
        total = sum(counts)
        # one bucket per interface, whichever process asks: a full bucket plus the rate
        assert total <= RATE + RATE * span + 1, (url, counts)
        # and the rate is used (9 threads ask far more often than 20/s per interface)
        assert total >= 0.8 * (RATE + RATE * (seconds - 0.2)), (url, counts)
        assert sum(1 for n in counts if n > 0) >= 2, (url, counts)  # shared, not taken by one


def test_asyncio_and_threads_decide_on_the_same_cluster_buckets(
    migrated_db: tuple[str, Engine], redis_cluster: LocalCluster, key_prefix: str
) -> None:
    db_url, engine = migrated_db
    write_row(engine, "/mixed", rateLimit=10, cache=0.0, status=1)
    settings = {"database_url": db_url, "redis_url": redis_cluster.url, "key_prefix": key_prefix}

    async def take_six() -> tuple[list[bool], int]:
        async with AsyncGatewayLimiter(**settings) as alim:
            got = [await alim.try_acquire("/mixed", timeout=0) for _ in range(6)]
            return got, alim.backend_fallbacks

    with GatewayLimiter(**settings) as lim:
        first = [lim.try_acquire("/mixed", timeout=0) for _ in range(6)]
        sync_done = time.monotonic()
        second, async_fallbacks = asyncio.run(take_six())
        # the bucket refills at 10/s from the sync limiter's last call to asyncio's last
        refill = 10 * (time.monotonic() - sync_done)
        assert lim.backend_fallbacks == 0
    assert async_fallbacks == 0
    assert first == [True] * 6
    # ten permits in the bucket: asyncio finds the four left, plus what refilled while
    # it started (a few round trips and a reload, slower on a loaded host), never more
    assert 4 <= second.count(True) <= 4 + refill + 1
    assert second[:4] == [True] * 4


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("redis+cluster://", "'' is not host:port"),
        ("redis+cluster://127.0.0.1", "'127.0.0.1' is not host:port"),
        ("redis+cluster://h:1,h:99999", "port '99999' of h"),
        ("redis+cluster://h:7000/3", "database 0 only"),
        ("redis+cluster://h:7000/?ssl=true", "options after '?'"),
        ("redis+sentinel://h:26379", "name the monitored service"),
        ("redis+sentinel://u:s3cret@h:26379", "name the monitored service"),
        ("redis+sentinel://u:s3cret@h:x/gwl", "port 'x' of h"),
    ],
)
def test_bad_urls_are_refused_naming_the_value(url: str, named: str) -> None:
    for open_limiter in (GatewayLimiter, AsyncGatewayLimiter):
        with pytest.raises(ValueError) as refused:
            open_limiter(database_url="sqlite://", redis_url=url)
        message = str(refused.value)
        assert named in message
        assert "s3cret" not in message
        assert url.replace("s3cret", "***") in message


def test_credentials_and_service_are_read_from_the_url() -> None:
    endpoints = parse_endpoints("redis+sentinel://gw:p%40ss@10.0.0.1:26379,[::1]:26380/orders")
    assert endpoints.nodes == (("10.0.0.1", 26379), ("::1", 26380))
    assert (endpoints.username, endpoints.password) == ("gw", "p@ss")
    assert endpoints.service_name == "orders"
