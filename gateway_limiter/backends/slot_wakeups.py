"""The one subscriber per process that hears slots being given back.

A release (``slot.lua``) hands a freed slot to the first caller queued and announces the
grant on ``slots.channel(prefix)``: the message names the lease it went to
(``slots.parse_grant``). A daemon thread holds one subscription on its own connection
(a blocking read must not sit on the decision path's pool, whose read timeout is
milliseconds) and hands each message to ``on_grant``; ``core/slots.py`` wakes the one
waiter it names, if that waiter is in this process. After a lost connection it
subscribes again and calls ``on_grant(None)`` (wake every waiter to ask: a grant may
have been missed meanwhile). Works for ``redis://``, ``rediss://``, ``unix://``,
Sentinel (the master's address from the sentinels) and Cluster (PUBLISH reaches every
node, so any node will do).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from typing import Any

import redis

from gateway_limiter.backends.slots import channel
from gateway_limiter.config.settings import Settings
from gateway_limiter.observe.logs import log

#: Seconds between attempts to subscribe again after the connection is lost.
RESUBSCRIBE_S = 0.5
#: Seconds a read waits for a message before checking whether to stop.
POLL_S = 0.5


def subscriber_client(settings: Settings, decisions_client: Any) -> Any | None:
    """A client for the subscription, apart from the decision path's connections (None
    where none can be made from here: the asyncio Sentinel client, whose master is
    only known by awaiting it; waiters then ask again on their own, see core/slots.py)."""
    url = settings.redis_url
    scheme = url.partition("://")[0].lower()
    options: dict[str, Any] = {
        "socket_connect_timeout": settings.redis_connect_timeout,
        "socket_timeout": 5.0,
    }
    if scheme in ("redis", "rediss", "unix"):
        return redis.Redis.from_url(url, **options)
    random_node = getattr(decisions_client, "get_random_node", None)
    if random_node is not None:  # a cluster, sync or asyncio: PUBLISH reaches every node
        node = random_node()
        return redis.Redis(host=node.host, port=node.port, **options)
    pool = getattr(decisions_client, "connection_pool", None)
    master = getattr(pool, "get_master_address", None)
    if master is None or inspect.iscoroutinefunction(master):
        return None
    host, port = master()  # Sentinel: the same master as the decisions
    given = pool.connection_kwargs  # type: ignore[union-attr]
    for name in ("username", "password", "db"):
        if given.get(name) is not None:
            options[name] = given[name]
    return redis.Redis(host=host, port=port, **options)


class Subscriber:
    """One thread subscribed to the slots channel, calling ``on_grant(message)`` per
    message (``on_grant(None)`` after a reconnection)."""

    __slots__ = ("_channel", "_connect", "_on_grant", "_ready", "_stop", "_thread", "listening")

    def __init__(
        self,
        settings: Settings,
        connect: Callable[[], Any],
        on_grant: Callable[[bytes | None], None],
    ) -> None:
        self._channel = channel(settings.key_prefix)
        self._connect = connect
        self._on_grant = on_grant
        self._stop = threading.Event()
        self._ready = threading.Event()
        #: True while subscribed (False before, and after a lost connection)
        self.listening = False
        self._thread = threading.Thread(target=self._run, name="gateway-limiter-slots", daemon=True)

    def start(self, wait_s: float) -> bool:
        """Start listening; True once subscribed within ``wait_s`` seconds."""
        self._thread.start()
        return self._ready.wait(wait_s)

    def stop(self) -> None:
        """Stop listening and close the connection (within ``POLL_S``)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(POLL_S + 6.0)

    def _run(self) -> None:
        failed = False
        while not self._stop.is_set():
            client = None
            try:
                client = self._connect()
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(self._channel)
                pubsub.get_message(timeout=POLL_S)  # the subscription's confirmation
                self.listening = True
                self._ready.set()
                if failed:
                    failed = False
                    self._on_grant(None)
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=POLL_S)
                    if message is not None and message.get("type") == "message":
                        data = message["data"]
                        self._on_grant(
                            data
                            if isinstance(data, bytes)
                            else str(data).encode("utf-8", "surrogateescape")
                        )
                pubsub.close()
                self.listening = False
            except (redis.RedisError, OSError) as e:
                self.listening = False
                if not failed:
                    log.warning(
                        "slot grants not heard (%s); waiters fall back to asking again",
                        e,
                    )
                failed = True
                self._on_grant(None)
                self._stop.wait(RESUBSCRIBE_S)
            finally:
                if client is not None:
                    client.close()
