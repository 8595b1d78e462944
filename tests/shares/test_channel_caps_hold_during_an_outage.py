"""While Redis is away, ``share`` keeps a channel cap over the fleet: a process's claim is
on one interface, so the channel's limit (which spans interfaces other processes claim)
is decided at 1/N of it, never at the interface's claim.

The claims come from a real redis-server's heartbeats; the outage is then decided by
each process's failure policy on a clock the test drives."""

from __future__ import annotations

import redis

from gateway_limiter.backends.base import Clocks
from gateway_limiter.backends.fleet import encode_demand, heartbeat_args, parse_heartbeat
from gateway_limiter.backends.memory import MemoryBackend
from gateway_limiter.config.rules import CHANNEL_URL, Rule, build_rules
from gateway_limiter.config.settings import Settings
from gateway_limiter.config.table import ConfRow
from gateway_limiter.core.failure import Policy
from gateway_limiter.core.fleet import Fleet
from tests.support.services import RedisServer

CAP = 30
RATE = 25


def row(config_id: int, url: str, rate: int, channel: str) -> ConfRow:
    return ConfRow(
        config_id=config_id,
        interface_url=url,
        rate_limit=rate,
        cache=0.0,
        status=1,
        channel_type=channel,
        interface_no=None,
    )


def rules() -> dict[str, Rule]:
    ruleset = build_rules(
        [row(1, "/a", RATE, "IBE+"), row(2, "/b", RATE, "IBE+"), row(3, CHANNEL_URL, CAP, "IBE+")],
        0.0,
    )
    return dict(ruleset.rules)


def fleet_after_heartbeats(client: redis.Redis, member: str, busy: str) -> Fleet:
    """A process whose demand is all on ``busy``, with the claims Redis answered."""
    fleet = Fleet(Settings(redis_url="redis://unused"), shared=True)
    demand = encode_demand({"/a": 0.01, "/b": 0.01} | {busy: float(RATE)})
    reply = parse_heartbeat(client.eval(*heartbeat_args("chan", member, 60_000, demand)))
    fleet.beat(reply)
    return fleet


def test_two_processes_on_two_interfaces_stay_within_their_channels_cap(
    private_redis: RedisServer,
) -> None:
    # Each process claimed nearly all of its own interface, and the same claim scaled
    # the channel cap: two processes admitted up to 2 x 25/s under a cap of 30/s.
    client = private_redis.client()
    fleets = {}
    for _ in range(3):  # a few rounds: the claims settle
        fleets = {
            "/a": fleet_after_heartbeats(client, "p-a", "/a"),
            "/b": fleet_after_heartbeats(client, "p-b", "/b"),
        }
    assert all(f.size == 2 for f in fleets.values())
    assert fleets["/a"].claims["/a"] > 0.9 and fleets["/b"].claims["/b"] > 0.9
    now = [0.0]
    admitted: dict[int, int] = {}
    for url, fleet in fleets.items():
        policy = Policy("share", MemoryBackend)
        policy.outage_began()
        policy.local = MemoryBackend(clocks=Clocks(lambda: now[0]))
        shared = fleet.share(rules()[url])
        for ms in range(4000):  # a call every millisecond for a 4 s outage
            now[0] = ms * 1000.0
            if policy.reserve(shared, 1, 0.0).allowed:
                admitted[ms // 1000] = admitted.get(ms // 1000, 0) + 1
    assert sum(admitted.values()) <= 4 * CAP
    assert max(admitted.values()) <= CAP
    for url, fleet in fleets.items():  # each at half the cap: N = 2
        channel = fleet.share(rules()[url]).limits[-1]
        assert channel.caps_channel and channel.per_second <= CAP / 2 + 1e-9
