"""Channel caps on a real Redis, from rows in MariaDB: a call on an interface of a capped
channel spends from its own limits and from the channel's in one script call, all or
nothing; keys keep the channel in one Cluster slot; an interface with no channel row
or named caller sends exactly what it sent before.

The all-or-nothing checks drive the clock through the script's ``now``, so the numbers
are exact on a loaded machine."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from redis.crc import key_slot
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.backends.redis import RedisBackend
from gateway_limiter.backends.scripts import Commands, ScriptCall, parse_state
from gateway_limiter.backends.state import state_key
from gateway_limiter.config.rules import CHANNEL_URL, Rule
from gateway_limiter.config.settings import Settings
from gateway_limiter.model.bucket import BucketState
from tests.support.limiting import write_row
from tests.support.services import RedisServer

SECOND = 1_000_000.0
T0 = 1_795_000_000 * SECOND


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    engine = limiter_db[1]
    write_row(engine, "/a", rateLimit=10, cache=0.0, channelType="IBE+")
    write_row(engine, "/b", rateLimit=10, cache=0.0, channelType="IBE+")
    write_row(engine, CHANNEL_URL, rateLimit=3, cache=0.0, channelType="IBE+")
    write_row(engine, "/plain", rateLimit=5, cache=0.0)
    return limiter_db


@pytest.fixture
def limiter_settings() -> dict[str, Any]:
    return {"reload_interval": 3600}


class Monitor:
    """What clients sent the server (MONITOR), without the commands scripts ran inside."""

    def __init__(self, server: RedisServer) -> None:
        self._client = server.client()
        self._client.ping()  # the connection stop() uses is open before MONITOR starts
        self._monitor = server.client().monitor()  # type: ignore[no-untyped-call]
        self._monitor.__enter__()  # MONITOR is on once this returns
        self.sent: list[str] = []

    def stop(self) -> list[str]:
        self._client.echo("monitor-stop")
        for entry in self._monitor.listen():
            command = str(entry["command"])
            if command == "ECHO monitor-stop":
                break
            if entry.get("client_type") != "lua":
                self.sent.append(command.split(" ", 1)[0].upper())
        self._monitor.__exit__(None, None, None)
        return self.sent


def test_the_channel_caps_its_interfaces_together_in_one_round_trip(
    lim: GatewayLimiter, redis_server: RedisServer
) -> None:
    refused_here = lim.local_refusals
    monitor = Monitor(redis_server)
    got = [lim.try_acquire(url) for url in ("/a", "/b", "/a", "/b", "/a")]
    sent = [c for c in monitor.stop() if c != "EVAL"]  # EVAL: a fleet heartbeat
    assert got == [True, True, True, False, False]  # 3 for the channel, 10 for each
    # one EVALSHA per decision that was not refused in-process, and nothing else
    assert sent == ["EVALSHA"] * (5 - (lim.local_refusals - refused_here))
    assert lim.try_acquire("/plain")  # another channel's interface is not capped


def test_a_refusal_by_either_reserves_nothing_in_both(redis_server: RedisServer) -> None:
    backend = RedisBackend(
        Settings(redis_url=redis_server.url, redis_timeout=5.0, key_prefix="aon")
    )
    cap = Rule(CHANNEL_URL, 4, 0.0, 9, channel="all-or-nothing")
    a = Rule("/a", 2, 0.0, 1, channel="all-or-nothing", also=(cap,))
    b = Rule("/b", 10, 0.0, 2, channel="all-or-nothing", also=(cap,))

    def stored(rule: Rule) -> float:
        state = parse_state(backend.client.get(state_key("aon", rule)))
        assert isinstance(state, BucketState)
        return state.stored

    try:
        backend.client.delete(*(state_key("aon", r) for r in (a, cap, b)))
        assert [backend.reserve(a, 1, 0.0, now=T0).allowed for _ in range(3)] == [True, True, False]
        # /a's own limit refused the third: the channel gave 2 of its 4, not 3
        assert stored(cap) == 2.0 and stored(a) == 0.0
        assert [backend.reserve(b, 1, 0.0, now=T0).allowed for _ in range(3)] == [True, True, False]
        # the channel refused /b's third: /b's own bucket gave 2 of its 10, not 3
        assert stored(cap) == 0.0 and stored(b) == 8.0
        # a call that would need more than the budget allows takes nothing either
        assert not backend.reserve(b, 3, 0.1, now=T0 + 0.5 * SECOND).allowed
        assert stored(b) == 8.0
        # the channel refills at its own rate for both: 4/s, so one permit per 250 ms
        assert backend.reserve(b, 1, 0.0, now=T0 + 0.25 * SECOND).allowed
        assert not backend.reserve(a, 1, 0.0, now=T0 + 0.25 * SECOND).allowed
    finally:
        backend.close()


def test_every_key_of_a_capped_channel_is_in_one_cluster_slot(lim: GatewayLimiter) -> None:
    rules = [lim.registry.snapshot.rules[u] for u in ("/a", "/b")]
    keys = {state_key("gwl", r) for rule in rules for r in rule.limits}
    assert keys == {"gwl:{=IBE+}:/a:tb", "gwl:{=IBE+}:/b:tb", "gwl:{=IBE+}:*:tb"}
    assert len({key_slot(k.encode()) for k in keys}) == 1


def test_an_interface_without_shares_sends_what_it_sent_before() -> None:
    # a single bucket's call carries nothing of a channel: its config, permits, budget
    make = Commands("p")
    plain = Rule("/x", 5, 0.5, 1)
    assert make(plain, 1, 0.0, None, None) == ScriptCall(
        "bucket", [1, "p:{/x}:tb", struct.pack("<ddd", 5.0, 5.0, 0.0), "1", "0"]
    )
    # several limits: the same keys, and every limit the interface's own (no channel's)
    two = Rule("/x", 5, 0.5, 1, also=(Rule("/x", 8, 0.5, 2, period=10),))
    layout = "<" + "d" * 13
    fields = (2.0, 1.0, 5.0, 5.0, 0.0, 0.0, 0.0, 1.0, 0.8, 8.0, 0.0, 0.0, 0.0)
    assert make(two, 1, 0.0, None, None) == ScriptCall(
        "limits",
        [
            3,
            "p:{/x}:tb",
            "p:{/x}:tb:10s",
            "p:{/x}:pb",
            "1",
            "0",
            "",
            layout.encode(),
            struct.pack(layout, *fields),
        ],
    )
