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
# 10 an hour, capacity 10: a fixed ``now`` stops refill, not the key's expiry, which
# runs on the server's clock (a second past full at 10/s); an hour's period keeps the
# state through a pause and a loaded host's stalls between the decisions counted on it.
RULE = Rule("/kept/x", 10, 0.0, 0, period=3600)


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
        redis_client.ping()  # answered once the pause is over
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


def test_a_write_larger_than_the_socket_takes_is_sent_whole(
    backend: RedisBackend, redis_client: redis.Redis, key_prefix: str
) -> None:
    """A decision connection writes with one system call (``following``); what the
    kernel does not take at once still goes, by the socket's sendall."""
    key, value = f"{key_prefix}:big", os.urandom(16 << 20)  # more than a socket buffer
    conn = backend._checked_out()
    try:
        conn.send_packed_command([backend._pack(("SET", key, value))], check_health=False)
        assert conn.read_response() == b"OK"
    finally:
        backend._give_back(conn)
    assert redis_client.strlen(key) == len(value)
    assert redis_client.get(key) == value
    assert backend.reserve(RULE, 1, 0.0, now=NOW_US).stored == 9.0  # still in step


def test_taking_what_the_socket_holds_neither_waits_nor_loses_a_reply(
    backend: RedisBackend,
) -> None:
    conn = backend._checked_out()
    try:
        started = time.monotonic()
        conn.take_ready()  # nothing sent: nothing there, and no wait for it
        # a wait would be the socket's 2 s timeout or more; a loaded host's stall (or a
        # full garbage collection) is well under a second
        assert time.monotonic() - started < 1.0
        conn.send_packed_command(
            [b"".join(backend._pack(("ECHO", str(i))) for i in range(3))], check_health=False
        )
        # the replies reach the socket when Redis gets a CPU: taken as they are there
        # (in the hiredis parser then: the one-readv path works with this redis-py; it
        # uses the parser's _reader and _buffer, and were they gone it would do nothing)
        deadline = time.monotonic() + 5
        while not conn._parser._reader.has_data():
            assert time.monotonic() < deadline, "take_ready never took the replies"
            time.sleep(0.01)
            conn.take_ready()
        assert [conn.read_response() for _ in range(3)] == [b"0", b"1", b"2"]
        assert not conn.can_read()  # nothing left over
    finally:
        backend._give_back(conn)
