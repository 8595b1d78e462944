"""The threaded Redis backend keeps its decision connection from one round trip to the
next, out of the pool (``RedisBackend._checked_out``), and still behaves as a pooled
one: a connection Redis closed is opened again, a failed round trip's connection is
dropped (never read again), a pool of one is not starved, and a forked child opens its own.

Decisions use a fixed ``now``: no refill, so what each reply says is exact.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
import redis

from gateway_limiter.backends.base import BackendError
from gateway_limiter.backends.redis import RedisBackend
from gateway_limiter.config.rules import Rule
from gateway_limiter.config.settings import Settings
from tests.support.services import RedisServer

NOW_US = 1_700_000_000_000_000.0
RULE = Rule("/kept/x", 10, 0.0, 0)  # 10/s, capacity 10


def _backend(url: str, prefix: str, timeout_s: float = 2.0, pool: int = 64) -> RedisBackend:
    backend = RedisBackend(
        Settings(
            redis_url=url,
            key_prefix=prefix,
            redis_timeout=timeout_s,
            redis_timeout_ceiling=timeout_s,
            redis_pool_size=pool,
        )
    )
    backend.prepare()
    return backend


@pytest.fixture
def backend(redis_server: RedisServer, key_prefix: str) -> Iterator[RedisBackend]:
    b = _backend(redis_server.url, key_prefix)
    yield b
    b.close()


def _connections(client: redis.Redis) -> int:
    return int(client.info("stats")["total_connections_received"])


def test_decisions_go_over_one_connection(backend: RedisBackend, redis_client: redis.Redis) -> None:
    backend.reserve(RULE, 1, 0.0, now=NOW_US)
    before = _connections(redis_client)
    stored = [backend.reserve(RULE, 1, 0.0, now=NOW_US).stored for _ in range(8)]
    assert stored == [8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]
    assert _connections(redis_client) == before  # no connection opened meanwhile


def test_a_connection_redis_closed_is_opened_again(
    private_redis: RedisServer, key_prefix: str
) -> None:
    backend = _backend(private_redis.url, key_prefix)
    admin = private_redis.client()
    try:
        assert backend.reserve(RULE, 1, 0.0, now=NOW_US).allowed
        before = _connections(admin)
        # Redis drops every client but this one (a restart, an idle timeout, CLIENT KILL).
        assert admin.client_kill_filter(_type="normal", skipme=True) >= 1
        verdict = backend.reserve(RULE, 1, 0.0, now=NOW_US)  # no BackendError: reopened
        assert verdict.allowed and verdict.stored == 8.0
        assert _connections(admin) == before + 1
    finally:
        backend.close()
        admin.close()


def test_a_timed_out_round_trip_drops_its_connection(
    redis_server: RedisServer, redis_client: redis.Redis, key_prefix: str
) -> None:
    backend = _backend(redis_server.url, key_prefix, timeout_s=0.1)
    try:
        assert backend.reserve(RULE, 1, 0.0, now=NOW_US).stored == 9.0
        before = _connections(redis_client)
        redis_client.execute_command("CLIENT", "PAUSE", 400, "ALL")  # type: ignore[no-untyped-call]
        with pytest.raises(BackendError):
            backend.reserve(RULE, 1, 0.0, now=NOW_US)
        assert backend._held is None  # dropped: its reply may still come, unread
        time.sleep(0.5)  # the pause is over
        verdict = backend.reserve(RULE, 1, 0.0, now=NOW_US)
        assert _connections(redis_client) == before + 1  # on a new connection
        # Its own reply: Redis dropped the timed-out call with its connection, unrun.
        assert verdict.stored == 8.0
    finally:
        backend.close()


def test_a_pool_of_one_is_not_starved_by_the_decisions(
    redis_server: RedisServer, key_prefix: str
) -> None:
    backend = _backend(redis_server.url, key_prefix, timeout_s=1.0, pool=1)
    try:
        assert backend.reserve(RULE, 1, 0.0, now=NOW_US).allowed
        started = time.monotonic()
        state, _now = backend.peek(RULE)  # needs the pool's one connection
        assert time.monotonic() - started < 0.5  # not a wait of redis_timeout for it
        assert state is not None
        assert backend.reserve(RULE, 1, 0.0, now=NOW_US).stored == 8.0
    finally:
        backend.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_opens_its_own_connection(backend: RedisBackend) -> None:
    assert backend.reserve(RULE, 1, 0.0, now=NOW_US).stored == 9.0
    parents = backend._checked_out()
    backend._give_back(parents)
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only when its decision went over its own connection
        code = 1
        try:
            own = backend._checked_out()
            backend._give_back(own)
            verdict = backend.reserve(RULE, 1, 0.0, now=NOW_US)
            code = 0 if own is not parents and verdict.stored == 8.0 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert backend._checked_out() is parents  # the parent's is still its own
    backend._give_back(parents)
    assert backend.reserve(RULE, 1, 0.0, now=NOW_US).stored == 7.0
