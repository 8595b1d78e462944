"""``slot.lua`` and ``slot_renew.lua`` on a real Redis and their Python model
(``tests/support/slot_model.py``, what the simulated fleet runs) answer alike and keep
alike: takes, releases that hand a slot over, renewals, lapsed leases and places.

The scripts read the server's clock (``TIME``); here they run as sent, but for ``TIME``
read from a hash the test drives, so both sides see the same milliseconds. The rate part
is a token bucket: ``bucket.lua`` on Redis, ``model/bucket.py`` in the model.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway_limiter.backends.scripts import SCRIPTS, Commands, ScriptCall
from gateway_limiter.backends.slots import release_call, renew_call, slot_keys, take_call
from gateway_limiter.config.rules import Rule
from gateway_limiter.model.bucket import BucketState, expiry_ms, reserve
from tests.support.services import RedisServer
from tests.support.slot_model import SlotModel

CLOCK = "pin:clock"
#: Redis' TIME read from CLOCK instead: {seconds, microseconds}, as TIME answers
DRIVEN = 'local function pin_time() return redis.call("HMGET", "pin:clock", "s", "u") end\n'
START_MS = 1_800_000_000_000


def driven(source: str) -> str:
    assert 'redis.call("TIME")' in source
    return DRIVEN + source.replace('redis.call("TIME")', "pin_time()")


SLOT = driven(SCRIPTS["slot"])
RENEW = driven(SCRIPTS["slot_renew"])


class BucketRate:
    """``bucket.lua`` as the model: its arguments decoded, its state kept by key."""

    def __init__(self) -> None:
        self.states: dict[str, tuple[BucketState, float]] = {}
        self.now_ms = 0.0

    def __call__(self, kind: str, keys: list[str], argv: list[Any]) -> bytes:
        assert kind == "bucket"
        rate, capacity, warmup = struct.unpack("<ddd", argv[0])
        timeout = str(argv[2])
        timeout_us = None if timeout == "-1" else float(timeout)
        now_us = self.now_ms * 1000.0
        kept = self.states.get(keys[0])
        state = kept[0] if kept is not None and kept[1] > now_us else None
        verdict, new = reserve(state, rate, capacity, int(argv[1]), timeout_us, now_us, warmup)
        if new is not None:
            self.states[keys[0]] = (new, now_us + expiry_ms(new, now_us) * 1000.0)
        return struct.pack(
            "<6d",
            1.0 if verdict.allowed else 0.0,
            verdict.wait_us,
            verdict.stored,
            verdict.next_free_us,
            verdict.factor,
            verdict.held_us,
        )


def _same_reply(ours: Any, theirs: Any) -> None:
    """Integers equal; the rate's reply: allowed equal, the doubles within rounding."""
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        if isinstance(a, bytes):
            mine, real = struct.unpack("<6d", a), struct.unpack("<6d", b)
            assert mine[0] == real[0]
            assert mine[1:] == pytest.approx(real[1:], rel=1e-9, abs=1e-3)
        else:
            assert int(a) == int(b), (ours, theirs)


OPS = st.lists(
    st.tuples(
        st.sampled_from([0, 0, 1, 7, 250, 600, 1_100, 2_500]),  # ms that pass first
        st.sampled_from(["take", "take", "take", "release", "renew"]),
        st.sampled_from(["a", "b", "c", "d", "e"]),  # whose lease
        st.sampled_from([0.0, 0.0, 0.3, 2.0]),  # the take's budget (s); 0: no place
        st.sampled_from([1, 2, 3]),  # maxConcurrent as sent
    ),
    min_size=1,
    max_size=30,
)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS, rate=st.sampled_from([1, 5, 1000]), lease_s=st.sampled_from([0.5, 1.5]))
def test_the_slot_scripts_answer_and_keep_as_the_model_does(
    redis_server: RedisServer,
    ops: list[tuple[int, str, str, float, int]],
    rate: int,
    lease_s: float,
) -> None:
    client: Any = redis_server.client()
    prefix = f"pin{uuid.uuid4().hex[:8]}"
    url = "/slots"
    rule = Rule(url, rate, 0.0, 1, capacity=2 if rate == 1 else 0, max_concurrent=2)
    commands = Commands(prefix)
    model, bucket = SlotModel(), BucketRate()
    keys = slot_keys(prefix, url)
    heard = client.pubsub(ignore_subscribe_messages=True)
    heard.subscribe(f"{prefix}:slot-free")
    heard.get_message(timeout=1.0)
    now_ms = START_MS
    for step, (passed, op, who, budget, cap) in enumerate(ops):
        now_ms += passed
        client.hset(CLOCK, mapping={"s": now_ms // 1000, "u": (now_ms % 1000) * 1000})
        bucket.now_ms = now_ms
        lease_id = f"{who}-{step % 3 if op == 'take' else 0}"
        call: ScriptCall
        if op == "take":
            call = take_call(commands, prefix, rule, budget, None, lease_id, lease_s, budget)
        elif op == "release":
            call = release_call(prefix, url, lease_id, cap, lease_s)
        else:
            call = renew_call(prefix, url, [f"{w}-{i}" for w in "abc" for i in range(3)], lease_s)
        if op == "take":  # maxConcurrent as sent: the row's, or a class's lower one
            call.args[1 + int(call.args[0]) + 1] = str(cap)
        source = RENEW if call.name == "slot_renew" else SLOT
        theirs = client.eval(source, *call.args)
        ours = model.run(call, float(now_ms), bucket)
        _same_reply(ours, theirs)
        # what each key holds
        iface = model.interfaces[keys[0]]
        assert {k.decode(): v for k, v in client.zrange(keys[0], 0, -1, withscores=True)} == {
            k: float(v) for k, v in iface.leases.items()
        }
        assert [k.decode() for k in client.zrange(keys[1], 0, -1)] == sorted(
            iface.queue, key=lambda w: iface.queue[w]
        )
        assert {k.decode(): v for k, v in client.zrange(keys[2], 0, -1, withscores=True)} == {
            k: float(v) for k, v in iface.lapses.items()
        }
        assert {k.decode() for k in client.hkeys(keys[4])} == set(iface.asks)
        assert {k.decode() for k in client.hkeys(keys[5])} == set(iface.grants)
    # every grant a release published, in order
    published = []
    while (message := heard.get_message(timeout=0.2)) is not None:
        published.append(message["data"])
    heard.close()
    assert [m.split(b"\n", 3)[:3] for m in published] == [
        m.split(b"\n", 3)[:3] for _, m in model.published
    ]
    client.delete(CLOCK)
