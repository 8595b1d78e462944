"""Which backend serves a ``redis_url``: a registry keyed by URL scheme.

Each storage module registers its factories here (``@register("redis", "rediss")``),
so choosing one is a dict lookup, not an if-chain. This module imports no backend at
the top: ``open_backend`` imports the implementations when first asked, so redis is
imported only when it is used, and there is no import circle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway_limiter.config.settings import Settings, mask_secrets

if TYPE_CHECKING:
    from gateway_limiter.backends.base import AsyncBackend, Backend

BackendFactory = Callable[[Settings], "Backend"]
BACKENDS: dict[str, BackendFactory] = {}


def register(*schemes: str) -> Callable[[BackendFactory], BackendFactory]:
    """Class decorator: make a backend the one for ``schemes``."""

    def deco(factory: BackendFactory) -> BackendFactory:
        for scheme in schemes:
            BACKENDS[scheme] = factory
        return factory

    return deco


def open_backend(settings: Settings) -> Backend:
    """The backend for ``settings.redis_url``."""
    # Importing the modules registers them; redis is imported only when it is used.
    from gateway_limiter.backends import cluster, memory, redis, sentinel  # noqa: F401

    scheme = settings.redis_url.split("://", 1)[0].lower()
    factory = BACKENDS.get(scheme)
    if factory is None:
        raise ValueError(f"redis_url {mask_secrets(settings.redis_url)}: no backend for {scheme!r}")
    return factory(settings)


AsyncBackendFactory = Callable[[Settings], "AsyncBackend"]
ASYNC_BACKENDS: dict[str, AsyncBackendFactory] = {}


def register_async(*schemes: str) -> Callable[[AsyncBackendFactory], AsyncBackendFactory]:
    """Class decorator: make an asyncio backend the one for ``schemes``."""

    def deco(factory: AsyncBackendFactory) -> AsyncBackendFactory:
        for scheme in schemes:
            ASYNC_BACKENDS[scheme] = factory
        return factory

    return deco


def open_async_backend(settings: Settings) -> AsyncBackend:
    """The asyncio backend for ``settings.redis_url``."""
    # Importing the modules registers them; redis.asyncio is imported only when it is used.
    from gateway_limiter.backends import cluster_async, redis_async, sentinel  # noqa: F401

    scheme = settings.redis_url.split("://", 1)[0].lower()
    factory = ASYNC_BACKENDS.get(scheme)
    if factory is None:
        raise ValueError(
            f"redis_url {mask_secrets(settings.redis_url)}: no asyncio backend for {scheme!r}"
        )
    return factory(settings)
