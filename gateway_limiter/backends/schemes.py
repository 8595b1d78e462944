"""Which backend serves a ``redis_url``: a registry keyed by URL scheme.

Each storage module registers its factories here (``@register("redis", "rediss")``),
so choosing one is a dict lookup, not an if-chain. This module imports no backend at
the top: ``open_backend`` imports the implementations when first asked, so redis is
imported only when it is used, and there is no import circle.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from gateway_limiter.backends.base import SYSTEM_CLOCKS, Clocks
from gateway_limiter.config.settings import Settings
from gateway_limiter.observe.redact import mask_secrets

if TYPE_CHECKING:
    from gateway_limiter.backends.base import AsyncBackend, Backend

B = TypeVar("B")
#: What opens a backend: ``factory(settings, clocks)`` (``Registry.open``).
Factory = Callable[[Settings, Clocks], B]


class Registry(Generic[B]):
    """Backend factories by URL scheme: one registry for threaded backends, one for asyncio."""

    def __init__(self, flavour: str, modules: tuple[str, ...]) -> None:
        #: scheme -> factory
        self.factories: dict[str, Factory[B]] = {}
        self._flavour = flavour  # in the error: "no asyncio backend for ..."
        self._modules = modules  # of backends/, registering their factories on import

    def register(self, *schemes: str) -> Callable[[Factory[B]], Factory[B]]:
        """Class decorator: make a backend the one for ``schemes``."""

        def deco(factory: Factory[B]) -> Factory[B]:
            for scheme in schemes:
                self.factories[scheme] = factory
            return factory

        return deco

    def open(self, settings: Settings, clocks: Clocks = SYSTEM_CLOCKS) -> B:
        """The backend for ``settings.redis_url``, on the limiter's ``clocks``: every
        backend is opened the same way, ``factory(settings, clocks)``."""
        # Importing the modules registers them; redis is imported only when it is used.
        for module in self._modules:
            importlib.import_module(f"gateway_limiter.backends.{module}")
        scheme = settings.redis_url.split("://", 1)[0].lower()
        factory = self.factories.get(scheme)
        if factory is None:
            url = mask_secrets(settings.redis_url)
            raise ValueError(f"redis_url {url}: no {self._flavour}backend for {scheme!r}")
        return factory(settings, clocks)


_THREADED: Registry[Backend] = Registry("", ("cluster", "memory", "redis", "sentinel"))
_ASYNCIO: Registry[AsyncBackend] = Registry(
    "asyncio ", ("cluster_async", "redis_async", "sentinel")
)

BACKENDS = _THREADED.factories
ASYNC_BACKENDS = _ASYNCIO.factories
#: ``@register("redis", "rediss")``: the threaded backend for those schemes
register = _THREADED.register
#: ``@register_async("redis")``: the asyncio backend for those schemes
register_async = _ASYNCIO.register
open_backend = _THREADED.open
open_async_backend = _ASYNCIO.open
