"""Concurrent asyncio decisions share pipelined round trips, on a real redis-server, and
stay individual: each caller its own script call, reply or error; first come, first
served across batches; NOSCRIPT, a killed or silent Redis, cancellation and aclose in
the middle of a batch leave no caller hanging and no stale reply to be read later."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis

from gateway_limiter.backends.base import BackendError
from gateway_limiter.backends.redis_async import AsyncRedisBackend
from gateway_limiter.backends.scripts import SCRIPTS
from gateway_limiter.config.rules import Algorithm, Rule
from gateway_limiter.config.settings import Settings
from tests.support.limiting import evalsha_calls
from tests.support.services import AclUser, RedisServer
from tests.support.waiting import wait_for_async

#: Scheduling noise of a loaded 2-core host (as in test_async_survives_redis_outages).
NOISE = 0.45
#: A limit so large that every call is admitted.
OPEN = Rule("/open", 1_000_000_000, 0.0, 1)

Backends = Callable[..., AsyncRedisBackend]


@pytest.fixture
async def backends(private_redis: RedisServer, key_prefix: str) -> AsyncIterator[Backends]:
    """Asyncio backends on this test's own redis-server (closed afterwards). The read
    timeout is generous unless a test sets it: MONITOR and a loaded host can slow a
    batch of 128 scripts past 50 ms, and these tests are about batching, not timeouts."""
    made: list[AsyncRedisBackend] = []

    def make(**settings: Any) -> AsyncRedisBackend:
        options: dict[str, Any] = {
            "redis_url": private_redis.url,
            "key_prefix": key_prefix,
            "redis_timeout": 2.0,
        }
        backend = AsyncRedisBackend(Settings(**(options | settings)))
        made.append(backend)
        return backend

    yield make
    for backend in made:
        await backend.aclose()


@pytest.fixture
def admin(private_redis: RedisServer) -> redis.Redis:
    """A plain client on the private server, for the test's own checks."""
    return private_redis.client()


def evalsha_stats(client: redis.Redis) -> tuple[int, int]:
    """EVALSHA calls the server ran, and those of them that failed (NOSCRIPT, errors)."""
    stats: dict[str, Any] = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)), int(stats.get("failed_calls", 0))


def deciding(client: redis.Redis) -> set[str]:
    """The ids of the server's connections whose last command was an EVALSHA."""
    return {c["id"] for c in client.client_list() if c["cmd"] == "evalsha"}


def reads_processed(client: redis.Redis) -> int:
    """How many times the server has read from a client socket (INFO stats)."""
    return int(client.info("stats")["total_reads_processed"])


async def no_lanes_left() -> None:
    """Every task but the test's own has ended (lanes end with the queue)."""
    deadline = time.monotonic() + NOISE
    while asyncio.all_tasks() != {asyncio.current_task()}:
        assert time.monotonic() < deadline, f"tasks left: {asyncio.all_tasks()}"
        await asyncio.sleep(0.01)


def queued(backend: AsyncRedisBackend) -> int:
    """Decisions queued in ``backend``, not yet taken by a lane to be sent."""
    return len(backend._lanes._queue)


def all_taken(backend: AsyncRedisBackend) -> bool:
    """A lane took every queued decision and is on its round trip with them."""
    lanes = backend._lanes
    return lanes._active > 0 and not lanes._collecting and not lanes._queue


class Paused:
    """The server SIGSTOPped (up, connected, silent) until the block ends."""

    def __init__(self, server: RedisServer) -> None:
        assert server.proc is not None
        self.proc = server.proc

    def __enter__(self) -> Paused:
        self.proc.send_signal(signal.SIGSTOP)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)


async def test_concurrent_decisions_take_far_fewer_round_trips_than_decisions(
    backends: Backends, admin: redis.Redis, figures: Callable[..., None]
) -> None:
    backend = backends()
    await backend.prepare()
    assert (await backend.reserve(OPEN, 1, 0)).allowed  # a connection, as a gateway has

    calls, reads, evals = 1000, reads_processed(admin), evalsha_calls(admin)
    verdicts = await asyncio.gather(*(backend.reserve(OPEN, 1, 0) for _ in range(calls)))
    round_trips = reads_processed(admin) - reads - 1  # less the INFO of evalsha_calls
    evals = evalsha_calls(admin) - evals

    assert all(v.allowed for v in verdicts)
    assert evals == calls  # one script call per decision, as before
    # 1000 decisions at once: 8 batches of 128 (a batch may arrive in 2-3 reads)
    assert round_trips <= calls // 20
    figures("round trips for concurrent decisions", decisions=calls, reads=round_trips)

    await no_lanes_left()


@pytest.mark.parametrize("lanes", [1, 4])
@pytest.mark.parametrize("algorithm", ["token_bucket", Algorithm.SLIDING_WINDOW])
async def test_a_rate_of_k_admits_exactly_k_of_m_concurrent_callers(
    algorithm: str, lanes: int, backends: Backends
) -> None:
    # K an hour: no refill within the test, so the count is exact whatever the load.
    k, m = 25, 600
    rule = Rule("/k", k, 0.0, 2, algorithm=algorithm, period=3600)
    backend = backends(redis_pool_size=lanes)  # several batches; with 4, several lanes
    verdicts = await asyncio.gather(*(backend.reserve(rule, 1, 0) for _ in range(m)))
    allowed = [v.allowed for v in verdicts]
    assert sum(allowed) == k
    if lanes == 1:  # one lane: Redis runs the batches in arrival order, so the first k
        assert allowed == [True] * k + [False] * (m - k)
    # Several lanes write in arrival order, but Redis may interleave batches that are in
    # flight together (a write the socket takes in parts, on a loaded host): the count
    # is exact, not which callers (backends/redis_async.py says so).


@pytest.mark.parametrize("lanes", [1, 4])
async def test_per_caller_decisions_in_one_batch_stay_each_callers_own(
    lanes: int, backends: Backends
) -> None:
    k, callers, each = 7, 5, 60
    rule = Rule("/mine", k, 0.0, 3, period=3600, per_caller=True)
    backend = backends(redis_pool_size=lanes)
    keys = [f"caller-{i % callers}" for i in range(callers * each)]
    verdicts = await asyncio.gather(*(backend.reserve(rule, 1, 0, key) for key in keys))
    for caller in set(keys):
        mine = [v.allowed for v, key in zip(verdicts, keys, strict=True) if key == caller]
        assert sum(mine) == k  # each caller's own k, whichever other callers asked
        if lanes == 1:  # one lane: Redis runs the batches in arrival order
            assert mine == [True] * k + [False] * (each - k)
    # Several lanes: batches in flight together may interleave in Redis (as in the k-of-m
    # test above), so which of a caller's calls got its k is not fixed; how many is.


@pytest.mark.parametrize("lanes", [1, 4])
async def test_decisions_reach_redis_in_arrival_order_across_batches(
    lanes: int, backends: Backends, admin: redis.Redis
) -> None:
    backend = backends(redis_pool_size=lanes)
    await backend.prepare()
    calls = 700  # more than BATCH: several batches (on several lanes, if there are)
    seen: list[tuple[str, int]] = []  # (connection, permits) in the order Redis ran them
    monitor = admin.monitor()  # type: ignore[no-untyped-call]
    monitor.__enter__()  # MONITOR answered OK: every command from now on is reported

    def watch() -> None:
        # MONITOR reports commands in the order the server runs them. ``permits`` is
        # the bucket's next-to-last argument (before the budget) and tells the callers
        # apart; counted from the end, as the packed config before it may hold spaces.
        while len(seen) < calls:
            command = monitor.next_command()
            words = command["command"].split()
            if words[0].upper() == "EVALSHA":
                seen.append((command["client_port"], int(words[-2])))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        verdicts = await asyncio.gather(
            *(backend.reserve(OPEN, permits, 0) for permits in range(1, calls + 1))
        )
        await asyncio.to_thread(watcher.join, 10)
    finally:
        monitor.__exit__()
    assert all(v.allowed for v in verdicts)
    order = [permits for _, permits in seen]
    assert sorted(order) == list(range(1, calls + 1))  # each exactly once
    for connection in {c for c, _ in seen}:  # each lane sends its batches first come first
        mine = [permits for c, permits in seen if c == connection]
        assert mine == sorted(mine)
    # Across lanes, batches in flight together run in whatever order Redis reads their
    # connections; so a call runs at most the other lanes' batches early or late.
    assert max(abs(i + 1 - p) for i, p in enumerate(order)) <= (lanes - 1) * backend.BATCH


@pytest.mark.parametrize("lost", ["one script", "both scripts"])
async def test_noscript_in_a_batch_reloads_and_asks_again_never_an_error(
    lost: str, backends: Backends, admin: redis.Redis
) -> None:
    backend = backends()
    await backend.prepare()
    window = Rule("/window", 1_000_000_000, 0.0, 4, algorithm=Algorithm.SLIDING_WINDOW)
    admin.script_flush()  # Redis restarted, or an operator flushed the scripts ...
    if lost == "one script":  # ... and some client loaded the bucket again already
        admin.script_load(SCRIPTS["bucket"])
    calls, failed = evalsha_stats(admin)

    rules = [OPEN, window] * 150  # both scripts in one batch: NOSCRIPT mid-batch
    verdicts = await asyncio.gather(*(backend.reserve(rule, 1, 0) for rule in rules))

    assert all(v.allowed for v in verdicts)
    calls, failed = (a - b for a, b in zip(evalsha_stats(admin), (calls, failed), strict=True))
    assert calls - failed == 300  # every decision ran once, its NOSCRIPT asked again
    assert 0 < failed <= (150 if lost == "one script" else 300)  # only calls NOSCRIPT hit
    shas = backend._commands.shas
    assert admin.script_exists(shas["bucket"], shas["limits"]) == [True, True]


async def test_an_error_reply_to_one_call_fails_only_that_call(key_prefix: str) -> None:
    # An ACL user that may not touch /denied's keys: its EVALSHA gets an error
    # reply, in the same batch as calls that succeed.
    allowed = (f"~{key_prefix}:{{/open}}*", "+@all")
    server = RedisServer(user=AclUser("gateway", "gateway-password", allowed)).start()
    settings = Settings(redis_url=server.url, key_prefix=key_prefix, redis_timeout=2.0)
    backend = AsyncRedisBackend(settings)
    try:
        denied = Rule("/denied", 1_000_000_000, 0.0, 5)
        rules = [OPEN, denied] * 100
        outcomes = await asyncio.gather(
            *(backend.reserve(rule, 1, 0) for rule in rules), return_exceptions=True
        )
        for rule, outcome in zip(rules, outcomes, strict=True):
            if rule is denied:
                assert isinstance(outcome, BackendError)
                assert "no permissions" in str(outcome)
            else:
                assert not isinstance(outcome, BaseException)
                assert outcome.allowed
        # the connections stayed in step: the next batch is answered as usual
        after = await asyncio.gather(*(backend.reserve(OPEN, 1, 0) for _ in range(50)))
        assert all(v.allowed for v in after)
    finally:
        await backend.aclose()
        server.stop()


async def test_redis_killed_mid_batch_fails_every_caller_promptly(
    backends: Backends, private_redis: RedisServer
) -> None:
    # A generous redis_timeout: the failure must come from the kill, not from a timer.
    backend = backends(redis_timeout=5.0, redis_pool_size=2)
    await backend.prepare()
    assert (await backend.reserve(OPEN, 1, 0)).allowed
    with Paused(private_redis):
        calls = [asyncio.create_task(backend.reserve(OPEN, 1, 0)) for _ in range(400)]
        # a batch taken by a lane, sent and unanswered, the rest queued (the second lane
        # may be still connecting: a silent server does not answer its handshake)
        await wait_for_async(lambda: queued(backend) <= 400 - AsyncRedisBackend.BATCH, 5)
        await asyncio.sleep(0)  # a turn of the loop: the lanes' writes
        assert not any(c.done() for c in calls)
        killed_at = time.monotonic()
        await asyncio.to_thread(private_redis.kill)
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        took = time.monotonic() - killed_at
    assert all(isinstance(o, BackendError) for o in outcomes), outcomes[:3]
    assert took < NOISE
    await no_lanes_left()


async def test_a_silent_redis_fails_the_batch_within_the_timeout_and_no_stale_reply_is_read(
    backends: Backends, private_redis: RedisServer
) -> None:
    timeout = 0.1
    backend = backends(redis_timeout=timeout, redis_pool_size=2)
    await backend.prepare()
    assert (await backend.reserve(OPEN, 1, 0)).allowed
    with Paused(private_redis):
        started = time.monotonic()
        outcomes = await asyncio.gather(
            *(backend.reserve(OPEN, 1, 0) for _ in range(400)), return_exceptions=True
        )
        took = time.monotonic() - started
    assert all(isinstance(o, BackendError) for o in outcomes)
    assert took < timeout + NOISE

    # The server now runs what it had received and answers the dropped connections;
    # nobody reads those replies. A fresh bucket of 10 answers exactly in turn.
    fresh = Rule("/fresh", 10, 0.0, 6, period=3600)
    admitted = [(await backend.reserve(fresh, 1, 0)).allowed for _ in range(30)]
    assert admitted == [True] * 10 + [False] * 20
    await no_lanes_left()


async def test_callers_cancelled_in_flight_or_queued_leave_the_connection_in_step(
    backends: Backends, private_redis: RedisServer, admin: redis.Redis
) -> None:
    backend = backends(redis_timeout=5.0, redis_pool_size=1)  # one lane: the rest queue
    await backend.prepare()
    assert (await backend.reserve(OPEN, 1, 0)).allowed
    connections = deciding(admin)
    assert len(connections) == 1
    evals = evalsha_calls(admin)

    with Paused(private_redis):
        in_flight = [asyncio.create_task(backend.reserve(OPEN, 1, 0)) for _ in range(20)]
        await wait_for_async(lambda: all_taken(backend), 5, "the first 20 taken")
        await asyncio.sleep(0)  # a turn of the loop: the lane's write; sent, unanswered
        waiting = [asyncio.create_task(backend.reserve(OPEN, 1, 0)) for _ in range(20)]
        await wait_for_async(lambda: queued(backend) == 20, 5, "20 queued for the only lane")
        cancelled_at = time.monotonic()
        for task in in_flight[::2] + waiting[::2]:
            task.cancel()
        for task in in_flight[::2] + waiting[::2]:
            with pytest.raises(asyncio.CancelledError):
                await task
        assert time.monotonic() - cancelled_at < NOISE  # at once, Redis still silent
    answered = await asyncio.gather(*in_flight[1::2], *waiting[1::2])

    assert all(v.allowed for v in answered)
    # the in-flight batch ran whole; the cancelled queued callers were never sent
    assert evalsha_calls(admin) - evals == 20 + 10
    # ... and the same connection carries on: nothing was dropped or reopened
    assert deciding(admin) == connections
    await no_lanes_left()


async def test_aclose_mid_batch_fails_its_callers_and_leaves_no_task(
    backends: Backends, private_redis: RedisServer
) -> None:
    backend = backends(redis_timeout=5.0, redis_pool_size=1)
    await backend.prepare()
    with Paused(private_redis):
        calls = [asyncio.create_task(backend.reserve(OPEN, 1, 0)) for _ in range(300)]
        # a batch in flight on the only lane, the rest queued
        await wait_for_async(lambda: queued(backend) == 300 - AsyncRedisBackend.BATCH, 5)
        await asyncio.sleep(0)  # a turn of the loop: the lane's write
        await backend.aclose()
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(o, BackendError) for o in outcomes)
    await no_lanes_left()


async def test_a_peek_gets_a_connection_in_turn_under_a_steady_stream_of_decisions(
    backends: Backends,
) -> None:
    # Busy lanes keep taking the queue; one that finishes a round trip while a peek
    # waits hands its connection over instead, so the peek is not starved.
    backend = backends(redis_pool_size=1)  # more callers than a batch: always work queued
    await backend.prepare()
    stop = False
    decided = 0

    async def decide() -> None:
        nonlocal decided
        while not stop:
            assert (await backend.reserve(OPEN, 1, 0)).allowed
            decided += 1

    workers = [asyncio.create_task(decide()) for _ in range(3 * AsyncRedisBackend.BATCH)]
    try:
        # the lanes busy: every worker decided once, and the stream goes on
        await wait_for_async(lambda: decided > 3 * AsyncRedisBackend.BATCH, 5)
        slowest = 0.0
        for _ in range(10):
            started = time.monotonic()
            state, now = await asyncio.wait_for(backend.peek(OPEN), 5)  # starved: fails
            slowest = max(slowest, time.monotonic() - started)
            assert state is not None and now > 0
    finally:
        stop = True
        await asyncio.gather(*workers)
    assert decided > 0
    assert slowest < NOISE
    await no_lanes_left()
