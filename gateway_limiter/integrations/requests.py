"""A requests transport adapter that keeps a session within the fleet's limits (the
``requests`` extra)."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from requests import PreparedRequest, Response
from requests.adapters import HTTPAdapter

from gateway_limiter.integrations import supplier
from gateway_limiter.integrations.documented import documented
from gateway_limiter.limiter import GatewayLimiter

__all__ = ["Interface", "LimiterAdapter"]

#: Maps a prepared request to the interfaceUrl that limits it, or None: not limited.
Interface = Callable[[PreparedRequest], str | None]


def path_of(request: PreparedRequest) -> str | None:
    """The default ``interface``: the request URL's path."""
    return supplier.default_interface(urlsplit(request.url or "").path)


@documented
class LimiterAdapter(supplier.Seam[PreparedRequest, GatewayLimiter], HTTPAdapter):
    """A requests ``HTTPAdapter`` that decides with a ``GatewayLimiter`` before each
    request and pushes back after a 429 or 503.

    {observes}

    Args:
        limiter: a started ``GatewayLimiter``; the row's ``cache`` is the wait budget.
        **kwargs: ``HTTPAdapter``'s own (``max_retries``, the pool sizes).
    {options}

    Example:
        ```python
        session = requests.Session()
        session.mount("https://supplier.example/", LimiterAdapter(limiter))
        ```
    """

    path_of = staticmethod(path_of)

    def send(
        self,
        request: PreparedRequest,
        stream: bool = False,
        timeout: float | tuple[float | None, float | None] | None = None,
        verify: bool | str = True,
        cert: str | tuple[str, str] | None = None,
        proxies: dict[str, str] | None = None,
    ) -> Response:
        """The request decided first, sent if admitted (``Refused`` if not), then pushed
        back on after a 429 or 503."""
        url = self.interface(request)
        supplier.decide(self.limiter, url, request, self.priority)
        response = super().send(request, stream, timeout, verify, cert, proxies)
        supplier.tell(self.limiter, url, response.status_code, response.headers)
        return response
