"""Every Redis backend is a narrow transport (send a script call, send a batch, subscribe,
prepare, close) under the operations written once (``backends/operations_async.py`` and
its generated twin), and every backend is opened on the limiter's clocks."""

from __future__ import annotations

import asyncio
import inspect

import pytest
import redis

from gateway_limiter.backends.base import AsyncTransport, Clocks, Transport
from gateway_limiter.backends.calls import Calls
from gateway_limiter.backends.cluster import RedisClusterBackend
from gateway_limiter.backends.cluster_async import AsyncRedisClusterBackend
from gateway_limiter.backends.memory import AsyncMemoryBackend, MemoryBackend
from gateway_limiter.backends.operations import Operations
from gateway_limiter.backends.operations_async import AsyncOperations
from gateway_limiter.backends.redis import RedisBackend
from gateway_limiter.backends.redis_async import AsyncRedisBackend
from gateway_limiter.backends.schemes import open_async_backend, open_backend
from gateway_limiter.backends.sentinel import AsyncSentinelBackend, SentinelBackend
from gateway_limiter.backends.state import state_key
from gateway_limiter.config.rules import Rule
from gateway_limiter.config.settings import Settings
from tests.support.services import RedisServer

TRANSPORT = {"call", "batch", "subscribe", "prepare", "close"}
#: what the operations make of the transport: none of it is a transport's own
OPERATIONS = {"reserve", "pushback", "script", "peek", "peek_pushback", "heartbeat", "members"}


def _methods(protocol: type) -> set[str]:
    return {name for name in vars(protocol) if not name.startswith("_")}


def test_the_transport_is_five_methods() -> None:
    assert _methods(Transport) == TRANSPORT
    assert _methods(AsyncTransport) == TRANSPORT - {"close"} | {"aclose"}


@pytest.mark.parametrize(
    "backend",
    [RedisBackend, SentinelBackend, RedisClusterBackend, MemoryBackend],
)
def test_threaded_redis_backends_write_only_the_transport(backend: type) -> None:
    assert issubclass(backend, Operations)
    for name in OPERATIONS:  # each inherited from Operations, none written again
        assert getattr(backend, name) is getattr(Operations, name), name


@pytest.mark.parametrize(
    "backend",
    [AsyncRedisBackend, AsyncSentinelBackend, AsyncRedisClusterBackend, AsyncMemoryBackend],
)
def test_asyncio_redis_backends_write_only_the_transport(backend: type) -> None:
    assert issubclass(backend, AsyncOperations)
    for name in OPERATIONS:
        assert getattr(backend, name) is getattr(AsyncOperations, name), name
        assert inspect.iscoroutinefunction(getattr(backend, name))


def test_memory_is_opened_on_the_limiters_clock() -> None:
    now = [1_000_000.0]  # µs
    rule = Rule("/clocked", 1, 0.0, 0, period=10)  # one permit, one more every 10 s
    settings = Settings(redis_url="memory://")
    backend = open_backend(settings, Clocks(lambda: now[0]))
    assert isinstance(backend, MemoryBackend)
    assert backend.reserve(rule, 1, 0).allowed
    assert not backend.reserve(rule, 1, 0).allowed
    now[0] += 10_000_000.0  # 10 s later on the given clock, none on the system's
    assert backend.reserve(rule, 1, 0).allowed
    assert backend.subscribe("anything", lambda message: None) is None


def test_asyncio_memory_is_opened_on_the_limiters_clock() -> None:
    now = [1_000_000.0]
    rule = Rule("/clocked", 1, 0.0, 0, period=10)
    backend = open_async_backend(Settings(redis_url="memory://"), Clocks(lambda: now[0]))
    assert isinstance(backend, AsyncMemoryBackend)

    async def decide() -> list[bool]:
        first = await backend.reserve(rule, 1, 0)
        second = await backend.reserve(rule, 1, 0)
        now[0] += 10_000_000.0
        third = await backend.reserve(rule, 1, 0)
        return [first.allowed, second.allowed, third.allowed]

    assert asyncio.run(decide()) == [True, False, True]


def test_a_calendar_quotas_boundaries_follow_the_wall_clock_it_is_opened_with(
    redis_server: RedisServer, key_prefix: str
) -> None:
    wall = 1_700_000_000.0
    settings = Settings(redis_url=redis_server.url, key_prefix=key_prefix, redis_timeout=2.0)
    backend = open_backend(settings, Clocks(wall=lambda: wall))
    try:
        assert backend._commands.clock() == wall  # type: ignore[attr-defined]
    finally:
        backend.close()


def test_a_batch_answers_an_error_reply_as_lost_state_or_an_error(
    redis_server: RedisServer, redis_client: redis.Redis, key_prefix: str
) -> None:
    # The same batch and parser on threads and asyncio: a foreign value at a limit's key
    # is lost state (as the scripts treat it); the server's clock is read beside it.
    rule = Rule("/foreign", 10, 0.0, 0)
    redis_client.rpush(state_key(key_prefix, rule), "not a bucket")
    settings = Settings(redis_url=redis_server.url, key_prefix=key_prefix, redis_timeout=2.0)
    threaded = RedisBackend(settings)
    try:
        state, clock_us = threaded.peek(rule)
        assert state is None and clock_us > 0
        replies = threaded.batch(Calls(key_prefix).peek(rule))
        assert isinstance(replies[0], redis.ResponseError)  # WRONGTYPE, not raised
    finally:
        threaded.close()

    async def peek() -> tuple[object, float]:
        backend = AsyncRedisBackend(settings)
        try:
            return await backend.peek(rule)
        finally:
            await backend.aclose()

    awaited, server_us = asyncio.run(peek())
    assert awaited is None and server_us > 0
