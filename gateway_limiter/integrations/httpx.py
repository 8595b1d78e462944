"""httpx transports that keep a client within the fleet's limits (the ``httpx`` extra)."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.integrations.supplier import (
    ClassOf,
    PriorityOption,
    admit,
    default_interface,
    observations,
    pushbacks,
)
from gateway_limiter.limiter import GatewayLimiter

__all__ = ["AsyncLimiterTransport", "Interface", "LimiterTransport"]

#: Maps a request to the interfaceUrl that limits it, or None: not limited.
Interface = Callable[[httpx.Request], str | None]


def path_of(request: httpx.Request) -> str | None:
    """The default ``interface``: the request URL's path."""
    return default_interface(request.url.path)


class LimiterTransport(httpx.BaseTransport):
    """An httpx transport that decides with a ``GatewayLimiter`` before each request and
    pushes back after a 429 or 503.

    After a response that says what is left of the supplier's quota (``RateLimit``, or
    ``X-RateLimit-Remaining`` with ``X-RateLimit-Reset``), it calls ``limiter.observe``,
    so the fleet's calendar quotas follow the supplier's own count.

    Args:
        limiter: a started ``GatewayLimiter``; the row's ``cache`` is the wait budget.
        transport: what sends the request; default a new ``httpx.HTTPTransport()``.
        interface: maps a request to its ``interfaceUrl``; default: the URL's path.
            A function that returns None leaves that request unlimited.
        priority: each request's class (see priority classes): one ``Priority``, a
            mapping of ``interfaceUrl`` to class, or a function of the request
            (None: the row's); default: the row's.

    Raises:
        gateway_limiter.Refused: from ``client.get(...)`` and the like, when refused;
            the request never reaches the supplier.

    Example:
        ```python
        client = httpx.Client(transport=LimiterTransport(limiter),
                              base_url="https://supplier.example")
        client.get("/ibe/flight/search")   # decided as "/ibe/flight/search"
        ```
    """

    def __init__(
        self,
        limiter: GatewayLimiter,
        transport: httpx.BaseTransport | None = None,
        interface: Interface | None = None,
        priority: PriorityOption[httpx.Request] = None,
    ) -> None:
        self.limiter = limiter
        self.priority = ClassOf[httpx.Request](priority)
        self.transport = transport if transport is not None else httpx.HTTPTransport()
        self.interface = interface if interface is not None else path_of

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Decide, send (if admitted), and push back on 429/503."""
        url = self.interface(request)
        if url is not None:
            admit(url, self.limiter.decide(url, priority=self.priority(request, url)))
        response = self.transport.handle_request(request)
        for seen in observations(url, response.headers):
            self.limiter.observe(*seen)
        for push in pushbacks(url, response.status_code, response.headers.get("Retry-After")):
            self.limiter.pushback(*push)
        return response

    def close(self) -> None:
        """Close the wrapped transport (the limiter is the caller's to close)."""
        self.transport.close()


class AsyncLimiterTransport(httpx.AsyncBaseTransport):
    """``LimiterTransport`` for ``httpx.AsyncClient``, with an ``AsyncGatewayLimiter``.

    After a response that says what is left of the supplier's quota (``RateLimit``, or
    ``X-RateLimit-Remaining`` with ``X-RateLimit-Reset``), it calls ``limiter.observe``,
    so the fleet's calendar quotas follow the supplier's own count.

    Args:
        limiter: a started ``AsyncGatewayLimiter``; the row's ``cache`` is the wait budget.
        transport: what sends the request; default a new ``httpx.AsyncHTTPTransport()``.
        interface: maps a request to its ``interfaceUrl``; default: the URL's path.
            A function that returns None leaves that request unlimited.
        priority: each request's class (see priority classes): one ``Priority``, a
            mapping of ``interfaceUrl`` to class, or a function of the request
            (None: the row's); default: the row's.

    Raises:
        gateway_limiter.Refused: when refused; the request never reaches the supplier.

    Example:
        ```python
        client = httpx.AsyncClient(transport=AsyncLimiterTransport(async_limiter))
        await client.get("https://supplier.example/ibe/flight/search")
        ```
    """

    def __init__(
        self,
        limiter: AsyncGatewayLimiter,
        transport: httpx.AsyncBaseTransport | None = None,
        interface: Interface | None = None,
        priority: PriorityOption[httpx.Request] = None,
    ) -> None:
        self.limiter = limiter
        self.priority = ClassOf[httpx.Request](priority)
        self.transport = transport if transport is not None else httpx.AsyncHTTPTransport()
        self.interface = interface if interface is not None else path_of

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """``LimiterTransport.handle_request``, awaited."""
        url = self.interface(request)
        if url is not None:
            admit(url, await self.limiter.decide(url, priority=self.priority(request, url)))
        response = await self.transport.handle_async_request(request)
        for seen in observations(url, response.headers):
            await self.limiter.observe(*seen)
        for push in pushbacks(url, response.status_code, response.headers.get("Retry-After")):
            await self.limiter.pushback(*push)
        return response

    async def aclose(self) -> None:
        """Close the wrapped transport (the limiter is the caller's to close)."""
        await self.transport.aclose()
