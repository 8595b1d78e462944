# mypy: disable-error-code="no-untyped-call"
"""A cluster node's pool (``backends/cluster.py``, ``NodePool``): when redis-py refreshes
the slot map it drops each node's free connections, and a connection some thread has
just taken from the pool must not be among them. redis-py's blocking pool listed the
free ones, then closed them while other threads took connections: a call in flight had
its socket closed under it (EBADF or EOF), which lost decisions while a cluster failed
over. Real connections to a real Redis, threads racing the drop.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import redis

from gateway_limiter.backends.cluster import NodePool
from tests.support.services import RedisServer


def _race(pool: redis.BlockingConnectionPool, rounds: int) -> list[Exception]:
    """Four threads take a connection, PING on it and give it back, ``rounds`` times
    each, while a fifth drops the free connections over and over; what the four met.
    redis-py's own blocking pool, slowed alike, lost 158-166 of 1,200 PINGs here to
    "Connection closed by server" (2026-11-24)."""
    errors: list[Exception] = []
    done = threading.Event()

    def use() -> None:
        for _ in range(rounds):
            try:
                conn = pool.get_connection()
            except Exception as e:  # closed while the pool connected it
                errors.append(e)
                continue
            try:
                conn.send_command("PING")
                # real time: a race window held open, a round trip in flight (sent, unread)
                time.sleep(0.0005)
                assert conn.read_response() in (b"PONG", "PONG")
            except Exception as e:
                errors.append(e)
                conn.disconnect()
            finally:
                pool.release(conn)
            time.sleep(0.0002)  # real time: a race window, free a while for the drop to find it

    def drop() -> None:
        while not done.is_set():
            pool.disconnect_free_connections()
            time.sleep(0.0002)  # the users run between drops, as between slot-map refreshes

    dropper = threading.Thread(target=drop)
    users = [threading.Thread(target=use) for _ in range(4)]
    dropper.start()
    for t in users:
        t.start()
    for t in users:
        t.join(timeout=60)
    done.set()
    dropper.join(timeout=10)
    assert not any(t.is_alive() for t in [*users, dropper]), "a thread hangs"
    return errors


class _SlowToChoose(NodePool):
    """Slow to decide whether a free connection goes: the moment between listing the
    free connections and closing them, when another thread may take one, made wide."""

    def _should_update_connection(self, *args: Any, **kwargs: Any) -> bool:
        # real time: a race window held open
        time.sleep(0.001)
        return bool(super()._should_update_connection(*args, **kwargs))


def test_free_connections_are_dropped_without_closing_one_in_use(
    redis_server: RedisServer,
) -> None:
    pool = _SlowToChoose(host="127.0.0.1", port=redis_server.port, max_connections=8, timeout=5)
    try:
        assert _race(pool, 300) == []
        # and they are dropped: a connection given back, then the drop, is closed
        conn = pool.get_connection()
        pool.release(conn)
        pool.disconnect_free_connections()
        assert conn._sock is None
    finally:
        pool.disconnect()
