"""On a real Redis Cluster (3 masters, a replica each), threads deciding at once share
round trips to each master (``backends/shared_trips.py``, one queue per master), and
every decision is still its own script call: its own reply, error and NOSCRIPT retry;
a redirect (ASK, MOVED) in a batch is sent again alone and followed, never lost and
never counted twice; a held master holds only its own calls, a killed one fails only
its own.

A round trip is held in flight with ``CLIENT PAUSE`` on one master, so the calls to it
that arrive meanwhile are queued for certain and go together in the next. Decisions use
a fixed ``now``: no refill, so what is admitted is exact whatever the order of the
threads. The test that kills a master comes last (the module shares one cluster).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from gateway_limiter.backends.base import BackendError
from gateway_limiter.backends.cluster import RedisClusterBackend
from gateway_limiter.backends.scripts import SHAS, ScriptCall
from gateway_limiter.backends.state import bucket_key, state_key
from gateway_limiter.config.rules import Algorithm, Rule
from gateway_limiter.config.settings import Settings
from gateway_limiter.model.bucket import Verdict
from tests.support.cluster_nodes import command, errors, master_of, reads, urls_on
from tests.support.clusters import LocalCluster
from tests.support.traffic import stat
from tests.support.waiting import wait_for

NOW_US = 1_700_000_000_000_000.0
#: The period of the rows here. A fixed ``now`` stops refill, not the key's expiry, which
#: runs on the server's own clock (a second past full again): at 1,000 an hour, a state
#: outlives any stall of a loaded host between two decisions that count on it.
HOUR = 3600


def _backend(cluster: LocalCluster, prefix: str, timeout_s: float = 2.0) -> RedisClusterBackend:
    return RedisClusterBackend(
        Settings(
            redis_url=cluster.url,
            key_prefix=prefix,
            redis_timeout=timeout_s,
            redis_timeout_ceiling=timeout_s,
            redis_connect_timeout=2.0,
        )
    )


@pytest.fixture
def backend(redis_cluster: LocalCluster, key_prefix: str) -> Iterator[RedisClusterBackend]:
    b = _backend(redis_cluster, key_prefix)
    b.prepare()
    yield b
    b.close()


def _in_threads(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run each call on a thread of its own; each result, or the exception it raised."""
    results: list[Any] = [None] * len(calls)

    def one(i: int) -> None:
        try:
            results[i] = calls[i]()
        except Exception as e:
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a caller hangs"
    return results


def _paused_then(
    client: redis.Redis,
    pause_ms: int,
    first: Callable[[], Any],
    rest: list[Callable[[], Any]],
    in_flight: Callable[[], bool],
) -> list[Any]:
    """One master pauses; ``first`` goes (its round trip held in flight), then every call
    of ``rest`` arrives while it is held; the results, ``first``'s first. ``in_flight``
    says when the master's round trip is: the calls of ``rest`` wait for it."""
    command(client, "CLIENT", "PAUSE", pause_ms, "ALL")
    started = threading.Event()

    def lead() -> Any:
        started.set()
        return first()

    def follow(call: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            started.wait(5)
            wait_for(in_flight, 5, "the first call in flight", 0.001)
            return call()

        return run

    return _in_threads([lead, *[follow(c) for c in rest]])


def _busy(backend: RedisClusterBackend, port: int) -> Callable[[], bool]:
    """Whether the master on ``port`` has a round trip in flight (its calls queue)."""
    return lambda: any(
        sharing._busy for name, sharing in backend._sharing.items() if name.endswith(f":{port}")
    )


def _stored(results: list[Any]) -> list[int]:
    """The permits left after each decision, sorted (each one's own reply)."""
    assert all(isinstance(r, Verdict) for r in results), [
        r for r in results if not isinstance(r, Verdict)
    ]
    return sorted(round(r.stored) for r in results)


def test_threads_on_every_master_admit_exactly_and_share_round_trips(
    backend: RedisClusterBackend, redis_cluster: LocalCluster, key_prefix: str
) -> None:
    capacity, threads, each = 50, 8, 60
    urls = [
        u
        for us in urls_on(redis_cluster, key_prefix, "/cluster-share/exact", 2).values()
        for u in us
    ]
    # 2 interfaces on each master
    rules = [Rule(url, capacity, 0.0, 0, period=HOUR) for url in urls]
    nodes = [redis_cluster.node_on(port).client() for port in redis_cluster.master_ports()]
    read_before, evalshas = sum(map(reads, nodes)), sum(stat(n, "evalsha") for n in nodes)

    def caller(offset: int) -> Callable[[], list[tuple[str, bool]]]:
        def run() -> list[tuple[str, bool]]:
            asked = [rules[(offset + i) % len(rules)] for i in range(each)]
            return [(r.url, backend.reserve(r, 1, 0.0, now=NOW_US).allowed) for r in asked]

        return run

    results = _in_threads([caller(n) for n in range(threads)])

    assert not [r for r in results if isinstance(r, Exception)], results
    verdicts = [v for r in results for v in r]
    assert len(verdicts) == threads * each
    for url in urls:  # 80 asked each: exactly the capacity admitted, not one more or less
        assert sum(allowed for u, allowed in verdicts if u == url) == capacity, url
    # every decision is its own EVALSHA, and they went in fewer socket reads than calls
    assert sum(stat(n, "evalsha") for n in nodes) - evalshas == threads * each
    assert sum(map(reads, nodes)) - read_before < threads * each


def test_calls_queued_on_a_held_master_go_in_one_more_and_hold_no_other_master(
    backend: RedisClusterBackend, redis_cluster: LocalCluster, key_prefix: str
) -> None:
    by_master = urls_on(redis_cluster, key_prefix, "/cluster-share/held", 1)
    held_port, *other_ports = sorted(by_master)
    held = Rule(by_master[held_port][0], 1000, 0.0, 0, period=HOUR)
    others = [Rule(by_master[port][0], 1000, 0.0, 0, period=HOUR) for port in other_ports]
    node = redis_cluster.node_on(held_port).client()
    done: dict[str, list[float]] = {"held": [], "other": []}

    def ask(rule: Rule, kind: str) -> Callable[[], Verdict]:
        def run() -> Verdict:
            verdict = backend.reserve(rule, 1, 0.0, now=NOW_US)
            done[kind].append(time.monotonic())
            return verdict

        return run

    read_before = reads(node)
    rest = [ask(held, "held")] * 20 + [ask(r, "other") for r in others] * 5
    results = _paused_then(node, 1000, ask(held, "held"), rest, _busy(backend, held_port))

    held_results = [results[0], *results[1:21]]
    assert _stored(held_results) == list(range(1000 - 21, 1000))  # one permit each, in turn
    assert _stored(results[21:]) == sorted(list(range(1000 - 5, 1000)) * 2)
    # the first call's read, the batch's read or two, CLIENT PAUSE and INFO: not 21
    assert reads(node) - read_before <= 10
    # the other masters answered while this one was held: their calls did not queue here
    assert max(done["other"]) < min(done["held"])


def test_an_error_reply_and_a_lost_script_in_a_batch_are_each_callers_own(
    backend: RedisClusterBackend, redis_cluster: LocalCluster, key_prefix: str
) -> None:
    port, urls = next(
        iter(urls_on(redis_cluster, key_prefix, "/cluster-share/noscript", 2).items())
    )
    node = redis_cluster.node_on(port).client()
    bucket = Rule(urls[0], 1000, 0.0, 0, period=HOUR)
    windows = Rule(urls[1], 1000, 0.0, 0, period=HOUR, algorithm=Algorithm.SLIDING_WINDOW)
    node.script_flush()
    loads = stat(node, "script|load")
    evals = stat(node, "eval")
    # The first call runs limits.lua alone (EVAL with its source after NOSCRIPT, which
    # leaves it cached); the batch behind it then meets NOSCRIPT for bucket.lua and
    # pushback.lua, mid-pipeline, on that master, and loads them there.
    first = lambda: backend.reserve(windows, 1, 0.0, now=NOW_US)  # noqa: E731
    decide = lambda: backend.reserve(bucket, 1, 0.0, now=NOW_US)  # noqa: E731
    push = lambda: backend.pushback(bucket, None, now=NOW_US)  # noqa: E731
    # the path every decision takes, with a call Redis refuses: more keys than arguments
    refused = lambda: backend.call(ScriptCall("bucket", [3, bucket_key(key_prefix, urls[0])]))  # noqa: E731

    results = _paused_then(
        node, 400, first, [decide] * 10 + [push, refused] + [decide] * 10, _busy(backend, port)
    )

    errors = [r for r in results if isinstance(r, Exception)]
    assert len(errors) == 1 and isinstance(errors[0], BackendError), results
    assert "keys" in str(errors[0]).lower()
    decisions = [r for r in results[1:] if isinstance(r, Verdict)]
    assert len(decisions) == 20
    assert all(v.allowed for v in decisions)
    factor, _next_free = next(r for r in results if isinstance(r, tuple) and len(r) == 2)
    assert 0.0 < factor < 1.0  # the pushback was recorded
    used = [backend._commands.shas[name] for name in ("bucket", "limits", "pushback")]
    assert node.script_exists(*used) == [True] * 3  # loaded on that master
    after = stat(node, "script|load")
    assert after - loads == 2  # bucket.lua and pushback.lua, in the batch
    evals_after = stat(node, "eval")
    assert evals_after - evals == 1  # limits.lua, alone


def test_ask_and_moved_in_a_batch_are_followed_one_call_at_a_time_losing_none(
    backend: RedisClusterBackend, redis_cluster: LocalCluster, key_prefix: str
) -> None:
    """A redirect is answered at once, even to a paused client: so the round trip held
    in flight is another interface's on the same master, and the calls queued behind it
    meet the redirect in their batch."""
    by_master = urls_on(redis_cluster, key_prefix, "/cluster-share/moved", 2)
    source_port, target_port, third_port = sorted(by_master)
    rule, other = (Rule(url, 1000, 0.0, 0, period=HOUR) for url in by_master[source_port])
    key = state_key(key_prefix, rule)
    slot = key_slot(key.encode())
    if key_slot(state_key(key_prefix, other).encode()) == slot:
        pytest.skip("both interfaces hash to one slot")  # 1 in 16384
    source = redis_cluster.node_on(source_port).client()
    target = redis_cluster.node_on(target_port).client()
    third = redis_cluster.node_on(third_port).client()
    source_id = command(source, "CLUSTER", "MYID").decode()
    target_id = command(target, "CLUSTER", "MYID").decode()

    def decide() -> Verdict:
        return backend.reserve(rule, 1, 0.0, now=NOW_US)

    def hold() -> Verdict:
        return backend.reserve(other, 1, 0.0, now=NOW_US)

    assert round(decide().stored) == 999  # the bucket is on the source; so says the map
    sharing = next(s for n, s in backend._sharing.items() if n.endswith(f":{source_port}"))

    def held() -> bool:  # the source's round trip in flight: the calls after it queue
        return bool(sharing._busy)

    # ASK: the slot migrating, its key already on the target (the client's map unchanged)
    command(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
    command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
    command(source, "MIGRATE", "127.0.0.1", target_port, key, 0, 5000)
    asks = errors(source, "ASK")
    results = _paused_then(source, 1000, hold, [decide] * 20, held)
    assert round(results[0].stored) == 999
    assert _stored(results[1:]) == list(range(999 - 20, 999))  # each once: none lost or twice
    # each call met ASK twice: in the batch, and sent again alone (ASK leaves the map)
    assert errors(source, "ASK") - asks >= 40

    # MOVED: the slot the target's, the client's map still naming the source
    for node in (target, source, third):
        command(node, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
    moved = errors(source, "MOVED")
    results = _paused_then(source, 1000, hold, [decide] * 20, held)
    assert round(results[0].stored) == 998
    assert _stored(results[1:]) == list(range(999 - 40, 999 - 20))
    # all 20 in the batch, then the ones sent again before the client learnt the move
    assert errors(source, "MOVED") - moved >= 21
    assert master_of(redis_cluster, key) == target_port
    # the client follows the new map: the next call goes to the target at once
    moved = errors(source, "MOVED")
    assert round(decide().stored) == 999 - 41
    assert errors(source, "MOVED") == moved
    assert command(source, "CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    assert target.exists(key)


def test_a_call_asked_to_a_node_without_the_script_runs_there(
    backend: RedisClusterBackend, redis_cluster: LocalCluster, key_prefix: str
) -> None:
    """ASK to a node that never saw the script (a new master a slot is moving to): the
    call runs there, and the script stays cached there. A SCRIPT LOAD on the slot's
    master, which the map still names, would leave the call failing with NOSCRIPT."""
    by_master = urls_on(redis_cluster, key_prefix, "/cluster-share/asknoscript", 1)
    source_port, target_port, third_port = sorted(by_master)
    rule = Rule(by_master[source_port][0], 1000, 0.0, 0, period=HOUR)
    key = state_key(key_prefix, rule)
    slot = key_slot(key.encode())
    nodes = [redis_cluster.node_on(p).client() for p in (source_port, target_port, third_port)]
    source, target, _ = nodes
    source_id = command(source, "CLUSTER", "MYID").decode()
    target_id = command(target, "CLUSTER", "MYID").decode()
    assert round(backend.reserve(rule, 1, 0.0, now=NOW_US).stored) == 999
    command(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
    command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
    try:
        command(source, "MIGRATE", "127.0.0.1", target_port, key, 0, 5000)
        target.script_flush()  # as a new, empty master would be
        assert round(backend.reserve(rule, 1, 0.0, now=NOW_US).stored) == 998
        assert target.script_exists(SHAS["bucket"]) == [True]
    finally:  # the migration done: the slot the target's on every node
        for node in nodes:
            command(node, "CLUSTER", "SETSLOT", slot, "NODE", target_id)


def test_a_killed_master_fails_only_the_calls_to_it(
    redis_cluster: LocalCluster, key_prefix: str
) -> None:
    """Last in the module: the killed master is failed over, not brought back."""
    backend = _backend(redis_cluster, key_prefix, timeout_s=0.5)
    by_master = urls_on(redis_cluster, key_prefix, "/cluster-share/killed", 2)
    victim_port, *alive_ports = sorted(by_master)
    rules = {
        port: [Rule(url, 1000, 0.0, 0, period=HOUR) for url in urls]
        for port, urls in by_master.items()
    }
    try:
        backend.prepare()
        redis_cluster.node_on(victim_port).kill()

        def caller(offset: int) -> Callable[[], list[tuple[int, str, Any]]]:
            def run() -> list[tuple[int, str, Any]]:
                asked = [(p, r) for p in sorted(rules) for r in rules[p]]
                out: list[tuple[int, str, Any]] = []
                for i in range(24):
                    port, rule = asked[(offset + i) % len(asked)]
                    try:
                        out.append((port, rule.url, backend.reserve(rule, 1, 0.0, now=NOW_US)))
                    except BackendError as e:
                        out.append((port, rule.url, e))
                return out

            return run

        results = [x for r in _in_threads([caller(n) for n in range(6)]) for x in r]
    finally:
        backend.close()

    on_victim = [v for port, _, v in results if port == victim_port]
    on_alive = [v for port, _, v in results if port != victim_port]
    # every call to a live master was decided there, each once (1000 permits, fewer calls)
    bad = [v for v in on_alive if not (isinstance(v, Verdict) and v.allowed)]
    assert on_alive and not bad, bad
    for port in alive_ports:
        for rule in rules[port]:
            stored = [round(v.stored) for p, u, v in results if p == port and u == rule.url]
            assert sorted(stored) == list(range(1000 - len(stored), 1000))
    # the calls to the dead master failed (until a replica took over, if one did)
    failed = [v for v in on_victim if not isinstance(v, Verdict)]
    assert failed and all(isinstance(v, BackendError) for v in failed), on_victim
