"""``redis+sentinel://``: the scripts on the master that Redis Sentinel names.

Decisions go to the master only (a replica's state lags, and the scripts write). The
backend is the one-Redis backend (``RedisBackend``, ``AsyncRedisBackend``: same
scripts, timeouts, NOSCRIPT handling and, for asyncio, the same ``Deadline`` and FIFO
queue) on a pool whose connections ask a sentinel where the master is each time one is
opened. After a failover, connections to the old master fail once (BackendError: the
failure policy decides meanwhile), new ones go to the promoted replica, and its first
EVALSHA of each script costs a SCRIPT LOAD there (scripts are not replicated).

Sentinels are asked with the same timeouts as Redis. ``user:password`` in the URL is for
the Redis servers; sentinels are expected to need none.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.asyncio import sentinel as async_sentinel
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from gateway_limiter.backends.base import SYSTEM_CLOCKS, Clocks, Heard, Listener
from gateway_limiter.backends.redis import RedisBackend, client_options
from gateway_limiter.backends.redis_async import AsyncRedisBackend, async_client_options
from gateway_limiter.backends.schemes import register, register_async
from gateway_limiter.backends.subscriptions import READ_TIMEOUT_S, Connect, listen
from gateway_limiter.backends.topology import Endpoints, parse_endpoints
from gateway_limiter.config.settings import Settings


class BlockingSentinelConnectionPool(SentinelConnectionPool, redis.BlockingConnectionPool):
    """Sentinel's master pool that, like ``RedisBackend``'s, makes a thread wait up to
    ``timeout`` for a free connection rather than fail at once."""


def _credentials(endpoints: Endpoints) -> dict[str, Any]:
    return {"username": endpoints.username, "password": endpoints.password}


def _sentinel_options(options: dict[str, Any]) -> dict[str, Any]:
    """What the connections to the sentinels get: the timeouts, not the pool size or
    the Redis servers' password."""
    keep = ("socket_timeout", "socket_connect_timeout", "retry")
    return {k: v for k, v in options.items() if k in keep}


class SentinelMaster(redis.Redis):
    """A client on the master the sentinels name, asking them at each connect, whose
    ``close`` also closes its connections to the sentinels."""

    #: the sentinels it asks (set by ``master_client``)
    sentinels: Sentinel | None = None

    def close(self) -> None:
        """Close the master's connections and the sentinels'."""
        super().close()
        if self.sentinels is not None:
            for sentinel in self.sentinels.sentinels:
                sentinel.close()


def master_client(settings: Settings, socket_timeout: float) -> SentinelMaster:
    """A synchronous client of its own on the master of ``settings.redis_url`` (a
    ``redis+sentinel://`` URL), for a connection that is not a decision's (the slot
    grants' subscription, whose reads wait ``socket_timeout``, and which do not retry).
    Whether the decisions run on threads or asyncio, it asks the sentinels at each
    connect, so after a failover it follows the promoted master. The sentinels are
    asked as the decisions' client asks them: with the decision path's timeouts and no
    retries, so a sentinel that does not answer costs a connect, not a minute."""
    endpoints = parse_endpoints(settings.redis_url)
    options = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": settings.redis_connect_timeout,
        "retry": Retry(NoBackoff(), 0),
    }
    sentinels = Sentinel(  # type: ignore[no-untyped-call]
        list(endpoints.nodes), sentinel_kwargs=_sentinel_options(client_options(settings))
    )
    client: SentinelMaster = sentinels.master_for(  # type: ignore[no-untyped-call]
        endpoints.service_name, redis_class=SentinelMaster, **options, **_credentials(endpoints)
    )
    client.sentinels = sentinels
    return client


def sentinel_connect(settings: Settings) -> Connect:
    """Where a subscription connects (``backends/subscriptions.py``): a client of its own
    on the master, which asks the sentinels at each connect (threads and asyncio
    alike), so a resubscription after a failover finds the promoted master."""
    master = master_client(settings, READ_TIMEOUT_S)
    return lambda: master


@register("redis+sentinel")
class SentinelBackend(RedisBackend):
    """``RedisBackend`` on the master that the sentinels name."""

    __slots__ = ("_sentinel",)

    def __init__(self, settings: Settings, clocks: Clocks = SYSTEM_CLOCKS) -> None:
        endpoints = parse_endpoints(settings.redis_url)
        options = client_options(settings)
        self._sentinel = Sentinel(  # type: ignore[no-untyped-call]
            list(endpoints.nodes), sentinel_kwargs=_sentinel_options(options)
        )
        master = self._sentinel.master_for(  # type: ignore[no-untyped-call]
            endpoints.service_name,
            connection_pool_class=BlockingSentinelConnectionPool,
            timeout=settings.redis_timeout,
            **options,
            **_credentials(endpoints),
        )
        super().__init__(settings, clocks, client=master)

    def subscribe(self, channel: str, heard: Heard) -> Listener | None:
        """``channel`` heard on the master (``sentinel_connect``)."""
        return listen(self._settings, channel, lambda: sentinel_connect(self._settings), heard)

    def close(self) -> None:
        """Close the master's connections and the sentinels'."""
        super().close()
        for sentinel in self._sentinel.sentinels:
            sentinel.close()


@register_async("redis+sentinel")
class AsyncSentinelBackend(AsyncRedisBackend):
    """``AsyncRedisBackend`` on the master that the sentinels name."""

    __slots__ = ("_sentinel",)

    def __init__(self, settings: Settings, clocks: Clocks = SYSTEM_CLOCKS) -> None:
        endpoints = parse_endpoints(settings.redis_url)
        options = async_client_options(settings)
        # The Deadlines of AsyncRedisBackend time the master's connections; asking a
        # sentinel happens while one is opened, within the connect Deadline, and gets
        # timeouts of its own in case it is asked outside one.
        sentinel_options = _sentinel_options(client_options(settings)) | {"retry": options["retry"]}
        self._sentinel = async_sentinel.Sentinel(  # type: ignore[no-untyped-call]
            list(endpoints.nodes), sentinel_kwargs=sentinel_options
        )
        pool = async_sentinel.SentinelConnectionPool(  # type: ignore[no-untyped-call]
            endpoints.service_name,
            self._sentinel,
            is_master=True,
            **(self._sentinel.connection_kwargs | options | _credentials(endpoints)),
        )
        super().__init__(settings, clocks, pool=pool)

    def subscribe(self, channel: str, heard: Heard) -> Listener | None:
        """``channel`` heard on the master, on a synchronous client of its own
        (``sentinel_connect``)."""
        return listen(self._settings, channel, lambda: sentinel_connect(self._settings), heard)

    async def aclose(self) -> None:
        """Close the master's connections and the sentinels'."""
        await super().aclose()
        for sentinel in self._sentinel.sentinels:
            await sentinel.aclose()
