"""Subscribe: what every Redis transport's ``subscribe`` runs (a channel heard on a
connection of its own, by a thread of its own), whatever it hears.

The one user is the slots' wake-ups: a release (``slot.lua``) hands a freed slot to the
first caller queued and announces the grant on ``slots.channel(prefix)``;
``core/slots.py`` subscribes through its backend (``subscribe``) and wakes the one
waiter a message names, if that waiter is in this process. A daemon thread holds one
subscription on its own connection (a blocking read must not sit on the decision
path's pool, whose read timeout is milliseconds) and hands each message to
``on_grant``. After a lost connection it subscribes again and calls ``on_grant(None)``
(wake every waiter to ask: a message may have been missed meanwhile). Each transport
says where its connections go (``redis_connect``; Sentinel's ``sentinel_connect``: the
master's address asked of the sentinels at each connect, so a resubscription after a
failover finds the promoted master, for asyncio limiters too, since this thread's
client is a synchronous one of its own; ``cluster_connect``: PUBLISH reaches every
node, so any node will do).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from gateway_limiter.backends.base import Heard
from gateway_limiter.backends.topology import parse_endpoints
from gateway_limiter.config.settings import Settings
from gateway_limiter.observe.logs import log

#: What gives a subscription a synchronous client at each (re)connection, apart from the
#: decision path's connections (a blocking read must not sit on their pool).
Connect = Callable[[], Any]

#: Seconds between attempts to subscribe again after the connection is lost.
RESUBSCRIBE_S = 0.5
#: Seconds a read waits for a message before checking whether to stop.
POLL_S = 0.5
#: The subscription's socket timeout: well beyond POLL_S, so only a dead server trips it.
READ_TIMEOUT_S = 5.0
#: Seconds between PINGs on the subscription, and without any reply before it counts as
#: lost: a host that vanishes without a reset leaves an idle subscription silent, not
#: broken, and TCP alone would notice it late, if at all.
PING_S = 1.0
SILENT_S = 3.0


def subscription_options(settings: Settings) -> dict[str, Any]:
    """A subscription's connection: the decision path's connect timeout, a read timeout
    of ``READ_TIMEOUT_S``, and no retries (``Retry(NoBackoff(), 0)``): a lost connection
    raises, so the ``Subscriber`` says it is not listening, wakes every waiter to ask,
    and subscribes again itself."""
    return {
        "socket_connect_timeout": settings.redis_connect_timeout,
        "socket_timeout": READ_TIMEOUT_S,
        "retry": Retry(NoBackoff(), 0),
    }


def redis_connect(settings: Settings) -> Connect:
    """``redis://``, ``rediss://``, ``unix://``: a client of its own on ``redis_url``."""
    client = redis.Redis.from_url(settings.redis_url, **subscription_options(settings))
    return lambda: client


def cluster_connect(settings: Settings, decisions_client: Any) -> Connect | None:
    """``redis+cluster://``, where every node hears every message: each connection is to
    a node picked afresh from the decision client's slot map (sync or asyncio), the last
    one used left out while there are others, so a node that died is not tried again
    and again. None when the client keeps no slot map."""
    if not hasattr(decisions_client, "get_nodes"):
        return None
    endpoints = parse_endpoints(settings.redis_url)
    options = subscription_options(settings) | {
        "username": endpoints.username,
        "password": endpoints.password,
    }
    return AnyNode(decisions_client, options)


def listen(
    settings: Settings, channel: str, connect: Callable[[], Connect | None], heard: Heard
) -> Subscriber | None:
    """A started ``Subscriber`` to ``channel`` calling ``heard`` per message (it waits up
    to a connect and a read to be subscribed) on the connections ``connect()`` gives (a
    transport's ``subscribe``), or None when no subscription can be made."""
    try:
        connection = connect()
    except (ValueError, OSError):
        connection = None
    if connection is None:
        return None
    subscriber = Subscriber(channel, connection, heard)
    subscriber.start(settings.redis_connect_timeout + settings.redis_timeout)
    return subscriber


class AnyNode:
    """A client on one node of a cluster at each call, picked at random from the nodes
    ``cluster`` (a redis-py cluster client, sync or asyncio) knows, other than the one
    picked last time where it knows others. OSError when it knows none yet."""

    __slots__ = ("_cluster", "_last", "_options")

    def __init__(self, cluster: Any, options: dict[str, Any]) -> None:
        self._cluster = cluster
        self._options = options
        self._last: tuple[str, int] | None = None

    def __call__(self) -> redis.Redis:
        # from the subscriber's thread: get_nodes copies the client's table in one step
        known = [(node.host, int(node.port)) for node in self._cluster.get_nodes()]
        others = [address for address in known if address != self._last] or known
        if not others:  # an asyncio client before its first call
            raise OSError("no cluster node to subscribe on yet")
        host, port = self._last = random.choice(others)
        return redis.Redis(host=host, port=port, **self._options)


class Subscriber:
    """One thread subscribed to the slots channel, calling ``on_grant(message)`` per
    message (``on_grant(None)`` after a reconnection)."""

    __slots__ = ("_channel", "_connect", "_on_grant", "_ready", "_stop", "_thread", "listening")

    def __init__(
        self, channel: str, connect: Connect, on_grant: Callable[[bytes | None], None]
    ) -> None:
        self._channel = channel
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
                # Its PONG says the subscription is live (the confirmation is not shown).
                pubsub.ping()
                last_heard = next_ping = time.monotonic()
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=POLL_S)
                    now = time.monotonic()
                    if message is None:
                        # A host gone silent (no reset) leaves an idle read waiting: the
                        # pings' PONGs are what show the connection still works.
                        if now - last_heard > SILENT_S:
                            raise redis.ConnectionError(f"no reply from Redis in {SILENT_S:g} s")
                    else:
                        last_heard = now
                        if not self.listening:
                            self.listening = True
                            self._ready.set()
                            if failed:
                                failed = False
                                self._on_grant(None)
                        if message.get("type") == "message":
                            data = message["data"]
                            self._on_grant(
                                data
                                if isinstance(data, bytes)
                                else str(data).encode("utf-8", "surrogateescape")
                            )
                    if now - next_ping >= PING_S:
                        pubsub.ping()
                        next_ping = now
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
