"""The slot-grant subscriber on a real Redis whose server drops its connection: the loss
is seen (no silent reconnection inside redis-py), every waiter is woken to ask
(``on_grant(None)``), and the subscription comes back by itself and hears grants."""

from __future__ import annotations

import threading
import time

from gateway_limiter.backends.slots import channel
from gateway_limiter.backends.subscriptions import (
    POLL_S,
    SILENT_S,
    Subscriber,
    redis_connect,
)
from gateway_limiter.config.settings import Settings
from tests.support.clusters import wait_for
from tests.support.services import RedisServer, TcpProxy


def test_a_dropped_subscription_wakes_everyone_and_comes_back(
    private_redis: RedisServer,
) -> None:
    settings = Settings(redis_url=private_redis.url, key_prefix="sub")
    connect = redis_connect(settings)
    heard: list[bytes | None] = []
    lock = threading.Lock()

    def on_grant(message: bytes | None) -> None:
        with lock:
            heard.append(message)

    subscriber = Subscriber(channel("sub"), connect, on_grant)
    server = private_redis.client()
    try:
        assert subscriber.start(5.0)
        assert server.publish(channel("sub"), b"lease-1\n...") == 1
        wait_for("the first grant", lambda: heard == [b"lease-1\n..."], 5)

        assert server.client_kill_filter(_type="pubsub") == 1  # the server drops it
        # seen at once: every waiter woken to ask, since a grant may be missed meanwhile
        wait_for("the loss to wake everyone", lambda: None in heard, 5)

        def subscribed_again() -> bool:
            return subscriber.listening and server.pubsub_numsub(channel("sub"))[0][1] == 1

        wait_for("the subscription to come back", subscribed_again, 5)
        assert server.publish(channel("sub"), b"lease-2\n...") == 1
        wait_for("a grant after it", lambda: heard[-1] == b"lease-2\n...", 5)
    finally:
        subscriber.stop()
    assert server.pubsub_numsub(channel("sub"))[0][1] == 0  # stopped: nothing left


def test_a_silent_connection_is_noticed_and_replaced(private_redis: RedisServer) -> None:
    # A host that vanishes without a reset: the connection stays open and says nothing.
    proxy = TcpProxy("127.0.0.1", private_redis.port).start()
    settings = Settings(redis_url=f"redis://127.0.0.1:{proxy.port}", key_prefix="quiet")
    connect = redis_connect(settings)
    heard: list[bytes | None] = []
    subscriber = Subscriber(channel("quiet"), connect, heard.append)
    server = private_redis.client()
    try:
        assert subscriber.start(5.0)
        proxy.hang()
        silent = time.monotonic()
        # seen by the pings' missing replies (SILENT_S), not minutes later by TCP
        wait_for("the silence to count as a loss", lambda: not subscriber.listening, 10)
        assert time.monotonic() - silent < SILENT_S + 4 * POLL_S + 2.0
        assert None in heard  # every waiter woken to ask
        proxy.restore()
        wait_for("the subscription to come back", lambda: subscriber.listening, 10)
        assert server.publish(channel("quiet"), b"lease-3\n...") >= 1
        wait_for("a grant after it", lambda: heard[-1] == b"lease-3\n...", 5)
    finally:
        subscriber.stop()
        proxy.cut()
