"""An ASGI middleware for a gateway that limits its own callers (the ``asgi`` extra for
Starlette and FastAPI; the middleware itself is pure ASGI and imports no framework)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.integrations.supplier import ClassOf, PriorityOption, default_interface

__all__ = ["RateLimitMiddleware", "header_key", "path_of"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Maps a request's scope to a string (an interfaceUrl, a caller key) or None.
ScopeMap = Callable[[Scope], str | None]


def path_of(scope: Scope) -> str | None:
    """The default ``interface``: the request's path (without the query string)."""
    return default_interface(str(scope.get("path", "")))


def header_key(name: str) -> ScopeMap:
    """A ``key`` for ``RateLimitMiddleware``: the value of a request header.

    Args:
        name: the header's name, in any case.

    Returns:
        A function of the ASGI scope giving the header's first value, or None when the
        request has none (then the caller is one caller of its own).

    Example:
        ```python
        app.add_middleware(RateLimitMiddleware, limiter=async_limiter,
                           key=header_key("X-Api-Key"))
        ```
    """
    wanted = name.lower().encode("latin-1")

    def key(scope: Scope) -> str | None:
        for header, value in scope.get("headers", ()):
            if bytes(header).lower() == wanted:
                return bytes(value).decode("latin-1")
        return None

    return key


def _encoded(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in headers.items()]


class RateLimitMiddleware:
    """ASGI middleware for a gateway that limits its own callers.

    Each HTTP request is decided before the app sees it: refused, the answer is
    ``429 Too Many Requests`` with ``Decision.headers()`` and the app is not called;
    admitted, the app answers and the same headers are added. Lifespan and websocket
    scopes pass through. Start the limiter in the app's lifespan: without it every
    request fails with ``NotStarted``.

    Args:
        app: the ASGI application it wraps.
        limiter: an ``AsyncGatewayLimiter``, started in each worker on its event loop.
        interface: maps the ASGI scope to its ``interfaceUrl``; default: the path.
            None from it: not limited, no headers.
        key: maps the scope to the caller, for ``perCaller`` rows (``header_key``);
            default: no caller key.
        priority: each request's class (see priority classes): one ``Priority``, a
            mapping of ``interfaceUrl`` to class, or a function of the ASGI scope
            (None: the row's); default: the row's.

    Example:
        ```python
        app = Starlette(lifespan=lifespan)
        app.add_middleware(RateLimitMiddleware, limiter=async_limiter,
                           key=header_key("X-Api-Key"))
        ```
    """

    __slots__ = ("app", "interface", "key", "limiter", "priority")

    def __init__(
        self,
        app: ASGIApp,
        limiter: AsyncGatewayLimiter,
        interface: ScopeMap | None = None,
        key: ScopeMap | None = None,
        priority: PriorityOption[Scope] = None,
    ) -> None:
        self.app = app
        self.limiter = limiter
        self.priority = ClassOf[Scope](priority)
        self.interface = interface if interface is not None else path_of
        self.key = key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Decide, then answer 429 or call the app with the headers added."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        url = self.interface(scope)
        if url is None:
            await self.app(scope, receive, send)
            return
        caller = self.key(scope) if self.key is not None else None
        decision = await self.limiter.decide(url, key=caller, priority=self.priority(scope, url))
        headers = _encoded(decision.headers())
        if not decision.allowed:
            body = f"Too Many Requests: {url} ({decision.reason})\n".encode()
            plain = [(b"content-type", b"text/plain; charset=utf-8")]
            length = [(b"content-length", str(len(body)).encode("ascii"))]
            await send(
                {"type": "http.response.start", "status": 429, "headers": plain + length + headers}
            )
            await send({"type": "http.response.body", "body": body})
            return
        if not headers:  # not limited, or a shadow rule: the response goes as the app made it
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = [*message.get("headers", ()), *headers]
            await send(message)

        await self.app(scope, receive, send_with_headers)
