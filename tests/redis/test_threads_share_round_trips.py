"""Threads deciding at once share round trips (``backends/shared_trips.py``), and every
decision is still its own script call with its own reply, error, NOSCRIPT retry and
timeout, on a real Redis.

A round trip is held in flight with ``CLIENT PAUSE`` (Redis answers nothing meanwhile),
so the calls that arrive during it are queued for certain, and go together in the next.
Decisions use a fixed ``now``: no refill, so what is admitted is exact whatever the
order of the threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from gateway_limiter.backends.base import BackendError
from gateway_limiter.backends.redis import RedisBackend
from gateway_limiter.backends.scripts import ScriptCall
from gateway_limiter.backends.sentinel import SentinelBackend
from gateway_limiter.backends.shared_trips import Queued, RoundTripSharing
from gateway_limiter.config.rules import Algorithm, Rule
from gateway_limiter.config.settings import Settings
from gateway_limiter.model.bucket import Verdict
from tests.support.clusters import LocalSentinel
from tests.support.services import RedisServer
from tests.support.waiting import wait_for

NOW_US = 1_700_000_000_000_000.0
#: The period of the rows here. A fixed ``now`` stops refill, not the key's expiry, which
#: runs on the server's own clock (a second past full again): at 1,000 an hour, a state
#: outlives any stall of a loaded host between two decisions that count on it.
HOUR = 3600


def _backend(url: str, prefix: str, timeout_s: float = 2.0) -> RedisBackend:
    return RedisBackend(
        Settings(
            redis_url=url,
            key_prefix=prefix,
            redis_timeout=timeout_s,
            redis_timeout_ceiling=timeout_s,
        )
    )


@pytest.fixture
def backend(redis_server: RedisServer, key_prefix: str) -> Iterator[RedisBackend]:
    b = _backend(redis_server.url, key_prefix)
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


def _reads(client: redis.Redis) -> int:
    return int(client.info("stats")["total_reads_processed"])


def _evalsha_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def _paused_then(
    client: redis.Redis,
    pause_ms: int,
    first: Callable[[], Any],
    rest: list[Callable[[], Any]],
    backend: RedisBackend,
) -> list[Any]:
    """Redis pauses; ``first`` goes (its round trip held in flight), then every call of
    ``rest`` arrives while it is held (once ``backend`` has a round trip in flight, so
    they queue behind it); the results, ``first``'s first."""
    client.execute_command("CLIENT", "PAUSE", pause_ms, "ALL")  # type: ignore[no-untyped-call]
    started = threading.Event()

    def lead() -> Any:
        started.set()
        return first()

    def follow(call: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            started.wait(5)
            wait_for(lambda: backend._sharing._busy, 5, "the first call in flight", 0.001)
            return call()

        return run

    return _in_threads([lead, *[follow(c) for c in rest]])


def test_many_threads_admit_exactly_the_capacity_and_share_round_trips(
    backend: RedisBackend, redis_client: redis.Redis
) -> None:
    capacity, threads, each = 300, 8, 60
    rule = Rule("/share/exact", capacity, 0.0, 0, period=HOUR)
    reads, evalshas = _reads(redis_client), _evalsha_calls(redis_client)

    def caller() -> list[bool]:
        return [backend.reserve(rule, 1, 0.0, now=NOW_US).allowed for _ in range(each)]

    results = _in_threads([caller] * threads)

    verdicts = [v for r in results for v in r]
    assert len(verdicts) == threads * each
    assert sum(verdicts) == capacity  # exact: not one more, not one less
    # every decision is its own EVALSHA, and they went in fewer socket reads than calls
    assert _evalsha_calls(redis_client) - evalshas == threads * each
    assert _reads(redis_client) - reads < threads * each


def test_calls_queued_behind_a_round_trip_in_flight_go_in_one_more(
    backend: RedisBackend, redis_client: redis.Redis
) -> None:
    rule = Rule("/share/queued", 1000, 0.0, 0, period=HOUR)
    reads = _reads(redis_client)

    def call() -> Verdict:
        return backend.reserve(rule, 1, 0.0, now=NOW_US)

    results = _paused_then(redis_client, 400, call, [call] * 30, backend)

    assert all(isinstance(r, Verdict) and r.allowed for r in results), results
    # 31 decisions: reserved one permit each, one after the other
    assert sorted(round(r.stored) for r in results) == list(range(1000 - 31, 1000))
    # the first call's read, the batch's read or two, CLIENT PAUSE and INFO: not 31
    assert _reads(redis_client) - reads <= 10


def test_an_error_reply_is_that_callers_alone(
    backend: RedisBackend, redis_client: redis.Redis
) -> None:
    good = Rule("/share/good", 1000, 0.0, 0, period=HOUR)

    def ask() -> Verdict:
        return backend.reserve(good, 1, 0.0, now=NOW_US)

    def refused() -> Any:
        # the path every decision takes, with a call Redis refuses: more keys than args
        return backend.call(ScriptCall("bucket", [3, "only-one-key"]))

    results = _paused_then(redis_client, 300, ask, [ask] * 10 + [refused] + [ask] * 10, backend)

    errors = [r for r in results if isinstance(r, Exception)]
    assert len(errors) == 1
    assert isinstance(errors[0], BackendError)
    assert "keys" in str(errors[0]).lower()
    verdicts = [r for r in results if isinstance(r, Verdict)]
    assert len(verdicts) == 21
    assert sorted(round(v.stored) for v in verdicts) == list(range(1000 - 21, 1000))


def test_noscript_in_a_batch_loads_the_scripts_and_asks_again_for_those_calls(
    backend: RedisBackend, redis_client: redis.Redis
) -> None:
    bucket = Rule("/share/noscript", 1000, 0.0, 0, period=HOUR)
    windows = Rule(
        "/share/noscript-window", 1000, 0.0, 0, period=HOUR, algorithm=Algorithm.SLIDING_WINDOW
    )
    redis_client.script_flush()
    # The first call runs limits.lua and loads only that; the batch behind it then
    # meets NOSCRIPT for bucket.lua and pushback.lua, mid-pipeline.
    first = lambda: backend.reserve(windows, 1, 0.0, now=NOW_US)  # noqa: E731
    decide = lambda: backend.reserve(bucket, 1, 0.0, now=NOW_US)  # noqa: E731
    push = lambda: backend.pushback(bucket, None, now=NOW_US)  # noqa: E731

    results = _paused_then(
        redis_client, 300, first, [decide] * 12 + [push] + [decide] * 12, backend
    )

    assert not [r for r in results if isinstance(r, Exception)], results
    decisions = [r for r in results[1:] if isinstance(r, Verdict)]
    assert len(decisions) == 24
    assert all(v.allowed for v in decisions)
    factor, _next_free = next(r for r in results if isinstance(r, tuple) and len(r) == 2)
    assert 0.0 < factor < 1.0  # the pushback was recorded
    used = [backend._commands.shas[name] for name in ("bucket", "limits", "pushback")]
    assert redis_client.script_exists(*used) == [True] * 3


def test_a_hung_redis_fails_the_round_trip_and_the_queue_and_poisons_nothing_after(
    redis_server: RedisServer, redis_client: redis.Redis, key_prefix: str
) -> None:
    backend = _backend(redis_server.url, key_prefix, timeout_s=0.2)
    backend.prepare()
    after = Rule("/share/after", 3, 0.0, 0)
    try:
        began = time.monotonic()
        call = lambda: backend.reserve(Rule("/share/hung", 100, 0.0, 0), 1, 0.0)  # noqa: E731
        results = _paused_then(redis_client, 1500, call, [call] * 10, backend)
        took = time.monotonic() - began

        assert all(isinstance(r, BackendError) for r in results), results
        assert "Timeout" in str(results[0])
        # the queue gave up with the round trip it waited on, not 1.5 s later with Redis
        assert took < 1.4, took
        redis_client.ping()  # answered once the pause is over: Redis answers again

        # Nobody reads a stale reply: each decision gets its own, in order.
        verdicts = [backend.reserve(after, 1, 0.0, now=NOW_US) for _ in range(4)]
        assert [v.allowed for v in verdicts] == [True, True, True, False]
        assert [round(v.stored) for v in verdicts[:3]] == [2, 1, 0]
    finally:
        backend.close()


def test_one_thread_alone_is_sent_at_once_on_its_own_thread(backend: RedisBackend) -> None:
    rule = Rule("/share/alone", 10, 0.0, 0)
    sent_by: list[str] = []
    send_one = backend._sharing._send_one

    def spy(call: Any) -> Any:
        sent_by.append(threading.current_thread().name)
        return send_one(call)

    backend._sharing._send_one = spy
    verdicts = [backend.reserve(rule, 1, 0.0, now=NOW_US) for _ in range(3)]

    assert [v.allowed for v in verdicts] == [True, True, True]
    assert sent_by == [threading.current_thread().name] * 3


def test_sentinel_backend_shares_round_trips_exactly(
    redis_sentinel: LocalSentinel, key_prefix: str
) -> None:
    backend = SentinelBackend(
        Settings(
            redis_url=redis_sentinel.url,
            key_prefix=key_prefix,
            redis_timeout=2.0,
            redis_timeout_ceiling=2.0,
        )
    )
    rule = Rule("/share/sentinel", 200, 0.0, 0, period=HOUR)
    try:
        backend.prepare()

        def caller() -> list[bool]:
            return [backend.reserve(rule, 1, 0.0, now=NOW_US).allowed for _ in range(40)]

        results = _in_threads([caller] * 8)

        assert sum(v for r in results for v in r) == 200
    finally:
        backend.close()


def test_a_follower_whose_wait_runs_out_while_queued_gets_a_backend_error() -> None:
    """A round trip held in flight past a follower's whole wait: the follower leaves the
    queue with BackendError (it once raised ValueError, removed from the queue twice),
    is never sent, and the queue is empty for the next caller."""
    release = threading.Event()
    sent: list[ScriptCall] = []

    def send_one(call: ScriptCall) -> str:
        sent.append(call)
        release.wait(10)  # the leader's round trip, held
        return "leader's reply"

    def write(batch: list[Any], _checked: bool) -> None:
        sent.extend(queued.call for queued in batch)

    def read(batch: list[Any], _written: Any) -> None:
        for queued in batch:
            queued.settle("batched reply")

    sharing = RoundTripSharing(send_one, write, read, lambda: 0.1, lambda e: True)
    leader_call, follower_call = ScriptCall("bucket", [1, "a"]), ScriptCall("bucket", [1, "b"])
    leader = threading.Thread(target=sharing.run, args=(leader_call,))
    leader.start()
    deadline = time.monotonic() + 5
    while not sent and time.monotonic() < deadline:
        time.sleep(0.005)
    try:
        with pytest.raises(BackendError, match="no round trip to Redis within"):
            sharing.run(follower_call)
        assert follower_call not in sent  # never sent
        assert not sharing._queue
    finally:
        release.set()
        leader.join(5)
    assert sharing.run(ScriptCall("bucket", [1, "c"])) == ("leader's reply", 0.0)


def _until(condition: Callable[[], bool]) -> None:
    """A state of the threads below, looked for every 2 ms (they move in milliseconds)."""
    wait_for(condition, 5.0, every=0.002)


@pytest.mark.parametrize("reader_after", [8, 1])
def test_the_thread_that_read_a_round_trip_writes_the_next_before_it_wakes_anyone(
    monkeypatch: pytest.MonkeyPatch, reader_after: int
) -> None:
    """The leader's reply read, it writes the calls queued meanwhile itself, before it
    returns or wakes anyone (Redis runs them meanwhile); the batch's first caller is
    woken to read it, and writes the calls queued behind it the same way, before it
    wakes the others: one after the other, each by the one before it once awake, the
    next batch's reader after at most READER_AFTER of them (then it wakes the rest of
    the chain before it reads). Each caller gets its own reply."""
    monkeypatch.setattr(RoundTripSharing, "READER_AFTER", reader_after)
    release_one, release_read = threading.Event(), threading.Event()
    events: list[tuple[str, ...]] = []  # ("write", thread, *calls), ("wake", call, by thread)
    checks: list[bool] = []
    wake = Queued.wake

    def logged_wake(queued: Queued) -> None:
        events.append(("wake", str(queued.call.args[1]), threading.current_thread().name))
        wake(queued)

    monkeypatch.setattr(Queued, "wake", logged_wake)

    def send_one(call: ScriptCall) -> str:
        release_one.wait(10)  # the leader's round trip, held
        return f"reply {call.args[1]}"

    def write(batch: list[Any], checked: bool) -> int:
        events.append(("write", threading.current_thread().name, *(q.call.args[1] for q in batch)))
        checks.append(checked)
        return len(checks)

    def read(batch: list[Any], written: int) -> None:
        if written == 1:
            release_read.wait(10)  # the first batch's replies, held
        for queued in batch:
            queued.settle(f"reply {queued.call.args[1]}")

    sharing = RoundTripSharing(send_one, write, read, lambda: 5.0, lambda e: True)
    replies: dict[str, Any] = {}

    def start(*names: str) -> list[threading.Thread]:
        def run(name: str) -> None:
            replies[name] = sharing.run(ScriptCall("bucket", [1, name]))[0]

        started = [threading.Thread(target=run, args=(n,), name=n) for n in names]
        for t in started:
            t.start()
        return started

    threads = start("leader")
    _until(lambda: sharing._busy)
    threads += start("a", "b", "c")
    _until(lambda: len(sharing._queue) == 3)
    release_one.set()
    _until(lambda: len(checks) == 1)
    threads += start("d", "e")  # queued while the first batch's replies are held
    _until(lambda: len(sharing._queue) == 2)
    release_read.set()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)

    chain = [("wake", "b", "a"), ("wake", "c", "b"), ("wake", "d", "c")]  # "d" to read
    if reader_after == 1:  # "d" after one caller, and it wakes "c" before it reads
        chain = [("wake", "b", "a"), ("wake", "d", "b"), ("wake", "c", "d")]
    assert events == [
        ("write", "leader", "a", "b", "c"),  # by the leader, before it woke anyone
        ("wake", "a", "leader"),  # to read
        ("write", "a", "d", "e"),  # by the reader, before it woke its batch
        *chain,
        ("wake", "e", "d"),  # the queue empty: nothing to write
    ]
    assert checks == [True, True]  # on a connection just read: not checked again
    assert replies == {n: f"reply {n}" for n in ("leader", "a", "b", "c", "d", "e")}
    assert not sharing._busy  # stood down


def test_a_failed_write_fails_its_batch_and_the_queue_and_the_next_call_goes_alone() -> None:
    release_one = threading.Event()
    writes: list[list[Any]] = []

    def send_one(call: ScriptCall) -> str:
        release_one.wait(10)
        return "alone"

    def write(batch: list[Any], _checked: bool) -> None:
        writes.append(batch)
        raise ConnectionError("reset by peer")  # the backend has dropped the connection

    def read(batch: list[Any], _written: Any) -> None:
        raise AssertionError("a batch that was not written is never read")

    sharing = RoundTripSharing(send_one, write, read, lambda: 5.0, lambda e: True)
    leader = threading.Thread(target=sharing.run, args=(ScriptCall("bucket", [1, "l"]),))
    leader.start()
    _until(lambda: sharing._busy)
    results = []
    followers = [
        threading.Thread(
            target=lambda n=n: results.append(_outcome(sharing, n)),
        )
        for n in range(4)
    ]
    for t in followers:
        t.start()
    _until(lambda: len(sharing._queue) == 4)
    release_one.set()
    for t in [leader, *followers]:
        t.join(10)
    assert len(writes) == 1 and len(writes[0]) == 4
    assert len(results) == 4
    assert all(isinstance(r, BackendError) and "reset by peer" in str(r) for r in results)
    assert not sharing._queue and not sharing._busy
    assert sharing.run(ScriptCall("bucket", [1, "after"])) == ("alone", 0.0)


def _outcome(sharing: RoundTripSharing, n: int) -> Any:
    try:
        return sharing.run(ScriptCall("bucket", [1, str(n)]))
    except BackendError as e:
        return e


def test_callers_that_gave_up_are_left_out_of_the_chain_of_wake_ups() -> None:
    """Two callers whose wait ran out while their batch's replies were held: each gets
    BackendError, the reader its reply, and the wake-ups skip them, so the next batch's
    reader, behind them, is woken (nobody hangs)."""
    release_one, release_read = threading.Event(), threading.Event()

    def send_one(call: ScriptCall) -> str:
        release_one.wait(10)
        return "leader's"

    def read(batch: list[Any], _written: Any) -> None:
        release_read.wait(10)  # held past the followers' two waits of 0.2 s
        for queued in batch:
            queued.settle(f"reply {queued.call.args[1]}")

    def wait_s() -> float:  # "b" and "c" give up after 2 x 0.2 s, the others wait
        return 0.2 if threading.current_thread().name in ("b", "c") else 5.0

    sharing = RoundTripSharing(send_one, lambda b, c: None, read, wait_s, lambda e: True)
    results: dict[str, Any] = {}

    def run(name: str) -> None:
        try:
            results[name] = sharing.run(ScriptCall("bucket", [1, name]))[0]
        except BackendError as e:
            results[name] = e

    threads: list[threading.Thread] = []

    def start(*names: str) -> None:
        for name in names:
            threads.append(threading.Thread(target=run, args=(name,), name=name))
            threads[-1].start()

    start("leader")
    _until(lambda: sharing._busy)
    start("a", "b", "c")
    _until(lambda: len(sharing._queue) == 3)
    release_one.set()
    _until(lambda: "b" in results and "c" in results)  # gave up while "a" reads
    start("d", "e")  # queued behind: "d" reads the next batch, once woken
    _until(lambda: len(sharing._queue) == 2)
    release_read.set()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)
    assert results["leader"] == "leader's"
    assert results["a"] == "reply a"
    assert results["d"] == "reply d" and results["e"] == "reply e"
    for name in ("b", "c"):
        assert isinstance(results[name], BackendError)
        assert "no reply from Redis within" in str(results[name])
    assert not sharing._busy


def test_a_caller_that_gives_up_wakes_the_one_it_was_to_wake() -> None:
    sharing = RoundTripSharing(
        lambda c: None, lambda b, c: None, lambda b, t: None, lambda: 1.0, lambda e: True
    )
    first, second = Queued(ScriptCall("bucket", [1, "a"])), Queued(ScriptCall("bucket", [1, "b"]))
    first.after = second
    assert not second.wait(0.0)  # asleep
    sharing._pass_on(first)
    assert second.wait(0.0)  # woken in its place
    assert first.gave_up and first.after is None


class _QueuedBackend(RedisBackend):
    """A backend whose every call waited ``QUEUED_S`` behind another thread's round trip
    before it was written (as ``shared_trips`` reports it)."""

    __slots__ = ()
    QUEUED_S = 0.25

    def call(self, call: ScriptCall) -> tuple[Any, float]:
        reply, _ = super().call(call)
        return reply, self.QUEUED_S


def test_a_queued_reply_counts_its_next_free_and_its_hold_from_when_it_was_asked(
    redis_server: RedisServer, key_prefix: str, backend: RedisBackend
) -> None:
    # What a queued decision's reply says counts from when it was asked for, the same
    # way on every transport (scripts.queued_verdict; asyncio lanes do it too): both
    # the next free moment and what is left of a pushback's hold move by the queued time.
    settings = Settings(redis_url=redis_server.url, key_prefix=key_prefix, redis_timeout=2.0)
    queued = _QueuedBackend(settings)
    try:
        rule = Rule("/held", 1000, 60.0, 1, period=HOUR)
        backend.pushback(rule, 5.0, now=NOW_US)
        plain = backend.reserve(rule, 1, None, now=NOW_US)
        late = queued.reserve(rule, 1, None, now=NOW_US)
        assert plain.held_us == pytest.approx(5_000_000.0)
        assert late.held_us == pytest.approx(plain.held_us + _QueuedBackend.QUEUED_S * 1e6)
        # the hold drained the bucket: the second permit is one refill (3.6 s at 1,000
        # an hour) after the first, and counted from its asking, the queued time later
        refill_us = HOUR / 1000 * 1e6
        assert late.next_free_us == pytest.approx(plain.next_free_us + refill_us + 250_000.0)
    finally:
        queued.close()
