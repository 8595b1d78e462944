"""httpx transports that keep a client within the fleet's limits (the ``httpx`` extra)."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.integrations import supplier
from gateway_limiter.integrations.documented import documented
from gateway_limiter.limiter import GatewayLimiter

__all__ = ["AsyncLimiterTransport", "Interface", "LimiterTransport"]

#: Maps a request to the interfaceUrl that limits it, or None: not limited.
Interface = Callable[[httpx.Request], str | None]


def path_of(request: httpx.Request) -> str | None:
    """The default ``interface``: the request URL's path."""
    return supplier.default_interface(request.url.path)


@documented
class LimiterTransport(supplier.Seam[httpx.Request, GatewayLimiter], httpx.BaseTransport):
    """An httpx transport that decides with a ``GatewayLimiter`` before each request and
    pushes back after a 429 or 503.

    {observes}

    Args:
        limiter: a started ``GatewayLimiter``; the row's ``cache`` is the wait budget.
        transport: what sends the request; default a new ``httpx.HTTPTransport()``.
    {options}

    Example:
        ```python
        client = httpx.Client(transport=LimiterTransport(limiter),
                              base_url="https://supplier.example")
        client.get("/ibe/flight/search")   # decided as "/ibe/flight/search"
        ```
    """

    path_of = staticmethod(path_of)

    def __init__(
        self,
        limiter: GatewayLimiter,
        transport: httpx.BaseTransport | None = None,
        interface: Interface | None = None,
        priority: supplier.PriorityOption[httpx.Request] = None,
    ) -> None:
        super().__init__(limiter, interface, priority)
        self.transport = transport if transport is not None else httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Decide, send (if admitted), and push back on 429/503."""
        url = self.interface(request)
        supplier.decide(self.limiter, url, request, self.priority)
        response = self.transport.handle_request(request)
        supplier.tell(self.limiter, url, response.status_code, response.headers)
        return response

    def close(self) -> None:
        """Close the wrapped transport (the limiter is the caller's to close)."""
        self.transport.close()


@documented
class AsyncLimiterTransport(
    supplier.Seam[httpx.Request, AsyncGatewayLimiter], httpx.AsyncBaseTransport
):
    """``LimiterTransport`` for ``httpx.AsyncClient``, with an ``AsyncGatewayLimiter``.

    {observes}

    Args:
        limiter: a started ``AsyncGatewayLimiter``; the row's ``cache`` is the wait budget.
        transport: what sends the request; default a new ``httpx.AsyncHTTPTransport()``.
    {options}

    Example:
        ```python
        client = httpx.AsyncClient(transport=AsyncLimiterTransport(async_limiter))
        await client.get("https://supplier.example/ibe/flight/search")
        ```
    """

    path_of = staticmethod(path_of)

    def __init__(
        self,
        limiter: AsyncGatewayLimiter,
        transport: httpx.AsyncBaseTransport | None = None,
        interface: Interface | None = None,
        priority: supplier.PriorityOption[httpx.Request] = None,
    ) -> None:
        super().__init__(limiter, interface, priority)
        self.transport = transport if transport is not None else httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """``LimiterTransport.handle_request``, awaited."""
        url = self.interface(request)
        await supplier.decide_async(self.limiter, url, request, self.priority)
        response = await self.transport.handle_async_request(request)
        await supplier.tell_async(self.limiter, url, response.status_code, response.headers)
        return response

    async def aclose(self) -> None:
        """Close the wrapped transport (the limiter is the caller's to close)."""
        await self.transport.aclose()
