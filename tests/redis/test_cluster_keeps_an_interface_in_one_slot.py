"""Redis Cluster refuses a script whose keys lie in different hash slots (CROSSSLOT), even
when one node serves every slot. Every key of one interface (each period, each caller)
carries the interface's {hash tag}, so its limits are decided in one script call there."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from sqlalchemy import Engine

from gateway_limiter.backends.scripts import LIMITS_LUA, limits_args
from gateway_limiter.config.rules import Rule
from gateway_limiter.core.quotas import LOCK_SUFFIX
from tests.support.limiting import limiter, state_keys, write_row
from tests.support.services import RedisServer, free_port


@pytest.fixture
def cluster_node() -> Iterator[RedisServer]:
    """A one-node Redis Cluster holding all 16384 slots."""
    server = RedisServer(
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        # the bus port defaults to port + 10000, past 65535 for a high free port
        "--cluster-port",
        str(free_port()),
    )
    server.start()
    try:
        client = server.client()
        client.cluster("ADDSLOTSRANGE", 0, 16383)
        deadline = time.monotonic() + 10
        while client.cluster("INFO").get("cluster_state") != "ok":
            if time.monotonic() > deadline:
                pytest.fail("the one-node cluster did not reach cluster_state:ok")
            time.sleep(0.05)
        yield server
    finally:
        server.stop()


def test_limits_of_one_interface_are_decided_in_one_slot(
    migrated_db: tuple[str, Engine], cluster_node: RedisServer, key_prefix: str
) -> None:
    _, engine = migrated_db
    write_row(engine, "/ibe/flight/search", rateLimit=5, cache=0.0)
    write_row(engine, "/ibe/flight/search", add=True, rateLimit=200, cache=0.0, periodSeconds=60)
    write_row(
        engine,
        "/ibe/flight/search",
        add=True,
        rateLimit=3,
        cache=0.0,
        periodSeconds=10,
        perCaller=1,
        algorithm="fixed_window",
    )
    client: redis.Redis = cluster_node.client()
    # The check is real: keys of two interfaces in one call are refused.
    with pytest.raises(redis.ResponseError, match="hash to the same slot"):  # CROSSSLOT
        two = Rule("/a", 1, 0.0, 1, also=(Rule("/a", 1, 0.0, 2, period=10),))
        client.eval(LIMITS_LUA, 2, "{/a}:tb", "{/b}:tb", "1", "-1", "", *limits_args(two))

    # deny, so a decision Redis did not make shows; a patient deadline, so a loaded host
    # does not make one
    lim = limiter(
        migrated_db[0],
        cluster_node.url,
        key_prefix,
        on_backend_error="deny",
        redis_timeout=2.0,
        redis_timeout_ceiling=2.0,
    )
    try:
        outcomes = [
            lim.try_acquire("/ibe/flight/search", timeout=0, key=caller)
            for caller in ("10.0.0.1", "10.0.0.1", "a caller with spaces", None)
        ]
        assert outcomes == [True, True, True, True]
        assert lim.backend_healthy and lim.backend_fallbacks == 0  # Redis decided each
    finally:
        lim.close()
    keys = state_keys(client, key_prefix)
    assert len(keys) == 2 + 3  # the two shared limits, the fixed window of 3 callers
    slots = {client.cluster("KEYSLOT", key) for key in keys}
    assert len(slots) == 1


@pytest.mark.parametrize("url", ["}ibe/search", "}", "}}{x}"])
def test_an_interface_whose_url_begins_with_a_closing_brace_stays_in_one_slot(
    migrated_db: tuple[str, Engine], cluster_node: RedisServer, key_prefix: str, url: str
) -> None:
    # "{}" is an empty hash tag: Redis hashed each key whole, the limits of one call
    # landed in different slots (CROSSSLOT) and the breaker opened for every interface.
    _, engine = migrated_db
    write_row(engine, url, rateLimit=5, cache=0.0, maxConcurrent=2)
    write_row(engine, url, add=True, rateLimit=200, cache=0.0, periodSeconds=60, perCaller=1)
    lim = limiter(
        migrated_db[0],
        cluster_node.url,
        key_prefix,
        on_backend_error="deny",
        redis_timeout=2.0,
        redis_timeout_ceiling=2.0,
    )
    try:
        assert [lim.try_acquire(url, timeout=0, key=k) for k in ("a", "b c", None)] == [True] * 3
        lim.pushback(url, key="a")
        with lim.slot(url, timeout=0, key="a") as held:
            assert held.in_flight == 1
        assert lim.in_flight(url) == 0
        assert lim.backend_healthy and lim.backend_fallbacks == 0  # Redis decided each
    finally:
        lim.close()
    client: redis.Redis = cluster_node.client()
    keys = state_keys(client, key_prefix)
    assert len(keys) >= 2
    assert len({client.cluster("KEYSLOT", key) for key in keys}) == 1


def test_a_calendar_quota_and_a_channel_quota_are_decided_in_one_slot(
    migrated_db: tuple[str, Engine], cluster_node: RedisServer, key_prefix: str
) -> None:
    _, engine = migrated_db
    url = "/ibe/flight/search"
    write_row(engine, url, rateLimit=100, cache=0.0, channelType="IBE+")
    for quota in ({"quotaPeriod": "day", "timeZone": "Asia/Shanghai"}, {"perCaller": 1}):
        columns = {"quotaPeriod": "day", "timeZone": "America/New_York"} | quota
        write_row(engine, url, add=True, rateLimit=3, cache=0.0, channelType="IBE+", **columns)
    write_row(  # paced: its bucket beside its count, in the same slot
        engine,
        "*",
        rateLimit=1000,
        cache=0.0,
        channelType="IBE+",
        quotaPeriod="month",
        quotaPacing=1,
        maxPermits=100,
    )
    lim = limiter(
        migrated_db[0],
        cluster_node.url,
        key_prefix,
        on_backend_error="deny",
        redis_timeout=2.0,
        redis_timeout_ceiling=2.0,
    )
    try:
        decisions = [lim.decide(url, timeout=0, key="k") for _ in range(4)]
        assert [d.allowed for d in decisions] == [True, True, True, False]
        assert decisions[-1].reset_at is not None and decisions[-1].limit == 3
        assert lim.backend_healthy and lim.backend_fallbacks == 0  # Redis decided each
    finally:
        lim.close()
    client: redis.Redis = cluster_node.client()
    keys = state_keys(client, key_prefix)
    counters = [k for k in keys if ":cq:" in k and not k.endswith(LOCK_SUFFIX)]
    assert len(counters) == 3  # the two daily quotas, the channel's month
    (month,) = [k for k in counters if k.endswith(":cq:month")]
    assert len(client.get(month) or b"") == 32  # paced: the count and the pacing bucket
    # the shared counters' checkpoint locks, beside them (the per-caller one: not seen yet)
    assert sum(k.endswith(LOCK_SUFFIX) for k in keys) <= 2
    assert len({client.cluster("KEYSLOT", key) for key in keys}) == 1
