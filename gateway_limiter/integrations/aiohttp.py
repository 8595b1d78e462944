"""An aiohttp client middleware that keeps a session within the fleet's limits (the
``aiohttp`` extra; aiohttp 3.12 or later, which has client middlewares)."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import ClientHandlerType, ClientRequest, ClientResponse

from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.integrations import supplier
from gateway_limiter.integrations.documented import documented

__all__ = ["Interface", "LimiterMiddleware"]

#: Maps a request to the interfaceUrl that limits it, or None: not limited.
Interface = Callable[[ClientRequest], str | None]


def path_of(request: ClientRequest) -> str | None:
    """The default ``interface``: the request URL's path."""
    return supplier.default_interface(request.url.path)


@documented
class LimiterMiddleware(supplier.Seam[ClientRequest, AsyncGatewayLimiter]):
    """An aiohttp client middleware that decides with an ``AsyncGatewayLimiter`` before
    each request (each redirect hop too) and pushes back after a 429 or 503.

    {observes}

    Args:
        limiter: a started ``AsyncGatewayLimiter``; the row's ``cache`` is the wait budget.
    {options}

    Example:
        ```python
        session = aiohttp.ClientSession(middlewares=(LimiterMiddleware(async_limiter),))
        ```
    """

    __slots__ = ()
    path_of = staticmethod(path_of)

    async def __call__(self, request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        """Each request the session sends decided first, sent if admitted (``Refused`` if
        not), then pushed back on after a 429 or 503."""
        url = self.interface(request)
        await supplier.decide_async(self.limiter, url, request, self.priority)
        response = await handler(request)
        await supplier.tell_async(self.limiter, url, response.status, response.headers)
        return response
