"""On a real Redis Cluster (3 masters, a replica each), concurrent asyncio decisions
share round trips to each master (the lanes of ``backends/redis_async.py``, one set per
master), and every decision is still its own script call: its own reply, error and
NOSCRIPT retry; a redirect (ASK, MOVED) in a batch is followed in the lanes of the node
it names, never lost and never counted twice; a held master holds only its own calls,
a killed one fails only its own.

A round trip is held in flight with ``CLIENT PAUSE`` on one master, so the calls to it
that arrive meanwhile go in a batch of their own. Limits refill once a day: what is
admitted within a test is exact whatever the order. The test that kills a master comes
last (the module shares one cluster).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from gateway_limiter.backends.base import BackendError
from gateway_limiter.backends.cluster_async import AsyncRedisClusterBackend
from gateway_limiter.backends.scripts import SHAS, ScriptCall
from gateway_limiter.backends.state import bucket_key, state_key
from gateway_limiter.config.rules import Algorithm, Rule
from gateway_limiter.config.settings import Settings
from gateway_limiter.model.bucket import Verdict
from tests.support.cluster_nodes import command, errors, reads, urls_on
from tests.support.clusters import LocalCluster
from tests.support.traffic import stat
from tests.support.waiting import wait_for_async

DAY = 86_400

Backend = AsyncRedisClusterBackend


def _backend(cluster: LocalCluster, prefix: str, timeout_s: float = 2.0) -> Backend:
    return AsyncRedisClusterBackend(
        Settings(
            redis_url=cluster.url,
            key_prefix=prefix,
            redis_timeout=timeout_s,
            redis_timeout_ceiling=timeout_s,
            redis_connect_timeout=2.0,
        )
    )


@pytest.fixture
async def backend(
    redis_cluster: LocalCluster, key_prefix: str
) -> AsyncIterator[AsyncRedisClusterBackend]:
    b = _backend(redis_cluster, key_prefix)
    await b.prepare()
    yield b
    await b.aclose()


def _rule(url: str, capacity: int, **more: Any) -> Rule:
    """``capacity`` permits that refill over a day: none within a test."""
    return Rule(url, capacity, 0.0, 0, period=DAY, **more)


def _sent(backend: AsyncRedisClusterBackend, port: int) -> bool:
    """A lane of the master on ``port`` took every queued call and is on its round trip
    with them (not connecting, not yet taking): calls that come now queue behind it."""
    lanes = [lanes for name, lanes in backend._lanes.items() if name.endswith(f":{port}")]
    return any(la._active > 0 and not la._collecting and not la._queue for la in lanes)


async def _held_then(
    client: redis.Redis,
    pause_ms: int,
    first: Callable[[], Awaitable[Any]],
    rest: Sequence[Callable[[], Awaitable[Any]]],
    sent: Callable[[], bool],
) -> list[Any]:
    """One master pauses; ``first`` goes (its round trip held in flight, once ``sent``
    says so), then every call of ``rest`` arrives while it is held; each result or
    error, ``first``'s first. The master's lanes must have a connection already: a
    paused master holds a new connection's handshake, ``first`` still queued."""
    command(client, "CLIENT", "PAUSE", pause_ms, "ALL")
    lead = asyncio.ensure_future(first())
    await wait_for_async(sent, 5, "the first call in flight", 0.001)
    await asyncio.sleep(0)  # a turn of the loop: the lane's write
    followers = [call() for call in rest]
    return await asyncio.gather(lead, *followers, return_exceptions=True)


def _stored(results: list[Any]) -> list[int]:
    """The permits left after each decision, sorted (each one's own reply)."""
    assert all(isinstance(r, Verdict) for r in results), [
        r for r in results if not isinstance(r, Verdict)
    ]
    return sorted(round(r.stored) for r in results)


async def test_calls_on_every_master_admit_exactly_and_share_round_trips(
    backend: AsyncRedisClusterBackend, redis_cluster: LocalCluster, key_prefix: str
) -> None:
    capacity, calls = 50, 480
    urls = [
        u
        for us in urls_on(redis_cluster, key_prefix, "/async-cluster-share/exact", 2).values()
        for u in us
    ]
    rules = [_rule(url, capacity) for url in urls]  # 2 interfaces on each master
    nodes = [redis_cluster.node_on(port).client() for port in redis_cluster.master_ports()]
    read_before, evalshas = sum(map(reads, nodes)), sum(stat(n, "evalsha") for n in nodes)

    asked = [rules[i % len(rules)] for i in range(calls)]
    verdicts = await asyncio.gather(*(backend.reserve(r, 1, 0.0) for r in asked))

    for url in urls:  # 80 asked each: exactly the capacity admitted, not one more or less
        assert sum(v.allowed for r, v in zip(asked, verdicts, strict=True) if r.url == url) == 50
    # every decision is its own EVALSHA, in far fewer socket reads than calls
    assert sum(stat(n, "evalsha") for n in nodes) - evalshas == calls
    assert sum(map(reads, nodes)) - read_before < calls / 4


async def test_calls_queued_on_a_held_master_go_together_and_hold_no_other_master(
    backend: AsyncRedisClusterBackend, redis_cluster: LocalCluster, key_prefix: str
) -> None:
    by_master = urls_on(redis_cluster, key_prefix, "/async-cluster-share/held", 2)
    held_port, *other_ports = sorted(by_master)
    held = _rule(by_master[held_port][0], 1000)
    await backend.reserve(_rule(by_master[held_port][1], 1000), 1, 0.0)  # lanes connected
    others = [_rule(by_master[port][0], 1000) for port in other_ports]
    node = redis_cluster.node_on(held_port).client()
    done: dict[str, list[float]] = {"held": [], "other": []}

    def ask(rule: Rule, kind: str) -> Callable[[], Awaitable[Verdict]]:
        async def run() -> Verdict:
            verdict = await backend.reserve(rule, 1, 0.0)
            done[kind].append(time.monotonic())
            return verdict

        return run

    read_before = reads(node)
    rest = [ask(held, "held")] * 20 + [ask(r, "other") for r in others] * 5
    results = await _held_then(
        node, 1000, ask(held, "held"), rest, lambda: _sent(backend, held_port)
    )

    assert _stored(results[:21]) == list(range(1000 - 21, 1000))  # one permit each, in turn
    assert _stored(results[21:]) == sorted(list(range(1000 - 5, 1000)) * 2)
    # the first call's read, the batch's read or two (a new lane's handshake), CLIENT
    # PAUSE and INFO: not 21
    assert reads(node) - read_before <= 12
    # the other masters answered while this one was held: their calls did not queue here
    assert max(done["other"]) < min(done["held"])


async def test_an_error_reply_and_a_lost_script_in_a_batch_are_each_callers_own(
    backend: AsyncRedisClusterBackend, redis_cluster: LocalCluster, key_prefix: str
) -> None:
    port, urls = next(
        iter(urls_on(redis_cluster, key_prefix, "/async-cluster-share/noscript", 2).items())
    )
    node = redis_cluster.node_on(port).client()
    bucket = _rule(urls[0], 1000)
    windows = _rule(urls[1], 1000, algorithm=Algorithm.SLIDING_WINDOW)
    await backend.reserve(bucket, 1, 0.0)  # the master's lanes connected
    node.script_flush()

    async def first() -> Verdict:
        return await backend.reserve(windows, 1, 0.0)

    async def decide() -> Verdict:
        return await backend.reserve(bucket, 1, 0.0)

    async def push() -> tuple[float, float]:
        return await backend.pushback(bucket, None)

    async def refused() -> Any:
        # the path every decision takes, with a call Redis refuses: more keys than arguments
        return await backend.script(ScriptCall("bucket", [3, bucket_key(key_prefix, urls[0])]))

    results = await _held_then(
        node,
        400,
        first,
        [decide] * 10 + [push, refused] + [decide] * 10,
        lambda: _sent(backend, port),
    )

    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(errors) == 1 and isinstance(errors[0], BackendError), results
    assert "keys" in str(errors[0]).lower()
    decisions = [r for r in results[1:] if isinstance(r, Verdict)]
    assert len(decisions) == 20
    assert all(v.allowed for v in decisions)
    factor, _next_free = next(r for r in results if isinstance(r, tuple) and len(r) == 2)
    assert 0.0 < factor < 1.0  # the pushback was recorded
    used = [backend._commands.shas[name] for name in ("bucket", "limits", "pushback")]
    assert node.script_exists(*used) == [True] * 3  # loaded on that master


async def test_ask_and_moved_in_a_batch_are_followed_losing_none(
    backend: AsyncRedisClusterBackend, redis_cluster: LocalCluster, key_prefix: str
) -> None:
    """A redirect is answered at once, even to a paused client: so the round trip held
    in flight is another interface's on the same master, and the calls that arrive
    meanwhile meet the redirect in their batch."""
    by_master = urls_on(redis_cluster, key_prefix, "/async-cluster-share/moved", 2)
    source_port, target_port, third_port = sorted(by_master)
    rule, other = (_rule(url, 1000) for url in by_master[source_port])
    key = state_key(key_prefix, rule)  # its period's bucket
    slot = key_slot(key.encode())
    if key_slot(state_key(key_prefix, other).encode()) == slot:
        pytest.skip("both interfaces hash to one slot")  # 1 in 16384
    source = redis_cluster.node_on(source_port).client()
    target = redis_cluster.node_on(target_port).client()
    third = redis_cluster.node_on(third_port).client()
    source_id = command(source, "CLUSTER", "MYID").decode()
    target_id = command(target, "CLUSTER", "MYID").decode()

    async def decide() -> Verdict:
        return await backend.reserve(rule, 1, 0.0)

    async def hold() -> Verdict:
        return await backend.reserve(other, 1, 0.0)

    assert round((await decide()).stored) == 999  # the bucket is on the source

    # ASK: the slot migrating, its key already on the target (the client's map unchanged)
    command(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
    command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
    command(source, "MIGRATE", "127.0.0.1", target_port, key, 0, 5000)
    asks, askings = errors(source, "ASK"), stat(target, "asking")

    results = await _held_then(
        source, 400, hold, [decide] * 20, lambda: _sent(backend, source_port)
    )
    assert _stored(results[:1]) == [999]
    assert _stored(results[1:]) == list(range(999 - 20, 999))  # each once: none lost or twice
    assert errors(source, "ASK") - asks == 20  # the batch's calls were redirected,
    assert stat(target, "asking") - askings >= 20  # and sent to the target after ASKING

    # MOVED: the slot the target's, the client's map still naming the source
    for node in (target, source, third):
        command(node, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
    moved = errors(source, "MOVED")
    results = await _held_then(
        source, 400, hold, [decide] * 20, lambda: _sent(backend, source_port)
    )
    assert _stored(results[:1]) == [998]
    assert _stored(results[1:]) == list(range(999 - 40, 999 - 20))
    assert errors(source, "MOVED") - moved == 20  # all 20 in the batch, once each
    # the client's map follows: the next call goes to the target's lanes at once
    moved = errors(source, "MOVED")
    assert round((await decide()).stored) == 999 - 41
    assert errors(source, "MOVED") == moved
    assert command(source, "CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    assert target.exists(key)


async def test_a_call_asked_to_a_node_without_the_script_runs_there(
    backend: AsyncRedisClusterBackend, redis_cluster: LocalCluster, key_prefix: str
) -> None:
    """ASK to a node that never saw the script (a new master a slot is moving to): the
    call runs there, and the script stays cached there."""
    by_master = urls_on(redis_cluster, key_prefix, "/async-cluster-share/asknoscript", 1)
    source_port, target_port, third_port = sorted(by_master)
    rule = _rule(by_master[source_port][0], 1000)
    key = state_key(key_prefix, rule)
    slot = key_slot(key.encode())
    nodes = [redis_cluster.node_on(p).client() for p in (source_port, target_port, third_port)]
    source, target, _ = nodes
    source_id = command(source, "CLUSTER", "MYID").decode()
    target_id = command(target, "CLUSTER", "MYID").decode()
    assert round((await backend.reserve(rule, 1, 0.0)).stored) == 999
    command(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
    command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
    try:
        command(source, "MIGRATE", "127.0.0.1", target_port, key, 0, 5000)
        target.script_flush()  # as a new, empty master would be
        assert round((await backend.reserve(rule, 1, 0.0)).stored) == 998
        assert target.script_exists(SHAS["bucket"]) == [True]
    finally:  # the migration done: the slot the target's on every node
        for node in nodes:
            command(node, "CLUSTER", "SETSLOT", slot, "NODE", target_id)


async def test_a_killed_master_fails_only_the_calls_to_it(
    redis_cluster: LocalCluster, key_prefix: str
) -> None:
    """Last in the module: the killed master is failed over, not brought back."""
    backend = _backend(redis_cluster, key_prefix, timeout_s=0.5)
    by_master = urls_on(redis_cluster, key_prefix, "/async-cluster-share/killed", 2)
    victim_port, *alive_ports = sorted(by_master)
    rules = [(port, _rule(url, 1000)) for port, urls in sorted(by_master.items()) for url in urls]
    try:
        await backend.prepare()
        redis_cluster.node_on(victim_port).kill()
        asked = [rules[i % len(rules)] for i in range(120)]
        results = await asyncio.gather(
            *(backend.reserve(rule, 1, 0.0) for _, rule in asked), return_exceptions=True
        )
    finally:
        await backend.aclose()

    outcomes = [(port, rule.url, v) for (port, rule), v in zip(asked, results, strict=True)]
    on_victim = [v for port, _, v in outcomes if port == victim_port]
    on_alive = [v for port, _, v in outcomes if port != victim_port]
    # every call to a live master was decided there, each once (1000 permits, fewer calls)
    assert all(isinstance(v, Verdict) and v.allowed for v in on_alive), on_alive
    for port in alive_ports:
        for url in by_master[port]:
            stored = _stored([v for p, u, v in outcomes if p == port and u == url])
            assert stored == list(range(1000 - len(stored), 1000))
    # every call to the dead master failed, with BackendError (the failure policy decides)
    assert on_victim and all(isinstance(v, BackendError) for v in on_victim), on_victim
