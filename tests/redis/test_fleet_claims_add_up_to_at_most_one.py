"""The fleet's claims (``backends/fleet.py``): demand-weighted, and at every moment the
claims the live members hold on an interface add up to at most 1, whatever order they
beat in, however their demand swings, and as members die. On a real redis-server."""

from __future__ import annotations

import random

import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway_limiter.backends.fleet import (
    Heartbeat,
    encode_demand,
    heartbeat_args,
    parse_heartbeat,
)
from tests.support.services import RedisServer

URLS = ["/a", "/b"]


def beat(
    client: redis.Redis, prefix: str, member: str, ttl_ms: int, demand: dict[str, float]
) -> Heartbeat:
    """One heartbeat of ``member`` with ``demand``: what it answered."""
    reply = client.eval(*heartbeat_args(prefix, member, ttl_ms, encode_demand(demand)))
    return parse_heartbeat(reply)


def test_claims_follow_demand(private_redis: RedisServer) -> None:
    client = private_redis.client()
    demand = {"m0": 40.0, "m1": 10 / 3, "m2": 10 / 3, "m3": 10 / 3}
    claims: dict[str, float] = {}
    for _ in range(3):  # a few rounds: the claims settle whatever the first order
        for member, rate in demand.items():
            claims[member] = beat(client, "p", member, 60_000, {"/a": rate}).claims["/a"]
    assert claims["m0"] > 0.7  # 0.95 x 80 % of the demand
    assert all(0.04 < claims[m] < 0.07 for m in ("m1", "m2", "m3"))
    assert sum(claims.values()) <= 1.0


@settings(max_examples=30, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.integers(0, 5),  # which member beats
            st.floats(0.0, 500.0),  # its demand on /a
            st.floats(0.0, 50.0),  # ... and on /b
            st.sampled_from([60_000, 60_000, 60_000, 0, 1]),  # renew, leave, or die soon
        ),
        min_size=1,
        max_size=40,
    )
)
def test_the_claims_held_never_add_up_to_more_than_one(
    redis_server: RedisServer, steps: list[tuple[int, float, float, int]]
) -> None:
    client = redis_server.client()
    prefix = f"h{random.getrandbits(40):x}"
    held: dict[str, dict[str, float]] = {}
    for who, a, b, ttl_ms in steps:
        member = f"m{who}"
        reply = beat(client, prefix, member, ttl_ms, {"/a": a + 0.01, "/b": b + 0.01})
        held[member] = reply.claims if ttl_ms > 0 else {}  # a member about to die holds its claims
        live = {str(m, "utf-8") for m in client.zrange(f"{prefix}:fleet", 0, -1)}  # type: ignore[arg-type]
        for url in URLS:
            total = sum(held.get(m, {}).get(url, 0.0) for m in live)
            assert total <= 1.0 + 1e-9, (url, held)
        assert all(0.0 <= c <= 1.0 for claims in held.values() for c in claims.values())
