"""An aiohttp client middleware that keeps a session within the fleet's limits (the
``aiohttp`` extra; aiohttp 3.12 or later, which has client middlewares)."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import ClientHandlerType, ClientRequest, ClientResponse

from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.integrations.supplier import (
    ClassOf,
    PriorityOption,
    admit,
    default_interface,
    observations,
    pushbacks,
)

__all__ = ["Interface", "LimiterMiddleware"]

#: Maps a request to the interfaceUrl that limits it, or None: not limited.
Interface = Callable[[ClientRequest], str | None]


def path_of(request: ClientRequest) -> str | None:
    """The default ``interface``: the request URL's path."""
    return default_interface(request.url.path)


class LimiterMiddleware:
    """An aiohttp client middleware that decides with an ``AsyncGatewayLimiter`` before
    each request (each redirect hop too) and pushes back after a 429 or 503.

    After a response that says what is left of the supplier's quota (``RateLimit``, or
    ``X-RateLimit-Remaining`` with ``X-RateLimit-Reset``), it calls ``limiter.observe``,
    so the fleet's calendar quotas follow the supplier's own count.

    Args:
        limiter: a started ``AsyncGatewayLimiter``; the row's ``cache`` is the wait budget.
        interface: maps a request to its ``interfaceUrl``; default: the URL's path.
            A function that returns None leaves that request unlimited.
        priority: each request's class (see priority classes): one ``Priority``, a
            mapping of ``interfaceUrl`` to class, or a function of the request
            (None: the row's); default: the row's.

    Raises:
        gateway_limiter.Refused: when refused; the request never reaches the supplier.

    Example:
        ```python
        session = aiohttp.ClientSession(middlewares=(LimiterMiddleware(async_limiter),))
        ```
    """

    __slots__ = ("interface", "limiter", "priority")

    def __init__(
        self,
        limiter: AsyncGatewayLimiter,
        interface: Interface | None = None,
        priority: PriorityOption[ClientRequest] = None,
    ) -> None:
        self.limiter = limiter
        self.priority = ClassOf[ClientRequest](priority)
        self.interface = interface if interface is not None else path_of

    async def __call__(self, request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        """Each request the session sends decided first, sent if admitted (``Refused`` if
        not), then pushed back on after a 429 or 503."""
        url = self.interface(request)
        if url is not None:
            admit(url, await self.limiter.decide(url, priority=self.priority(request, url)))
        response = await handler(request)
        for seen in observations(url, response.headers):
            await self.limiter.observe(*seen)
        for push in pushbacks(url, response.status, response.headers.get("Retry-After")):
            await self.limiter.pushback(*push)
        return response
