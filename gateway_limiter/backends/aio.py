"""Where bucket state lives, for asyncio callers: the same backends, with awaitable I/O.

This mirrors ``backends/__init__.py`` method for method: one decision per call for a
Rule, chosen by the scheme of ``redis_url`` through ``ASYNC_BACKENDS``. Only the I/O
differs; the bucket itself is still ``bucket.lua`` (Redis) or the reference model in
``bucket.py`` (``memory://``), so a sync and an asyncio process decide alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..bucket import BucketState, Verdict
from ..rules import Rule
from ..settings import Settings, mask_secrets
from .memory import MemoryBackend


class AsyncBackend(Protocol):
    """One decision per call, made atomically where the state lives, awaited."""

    #: True when state is shared between processes (False for ``memory://``).
    shared: bool

    async def reserve(
        self, rule: Rule, permits: int, timeout: float | None, caller: str | None = None
    ) -> Verdict:
        """Reserve ``permits`` on every limit of ``rule`` if the wait is within ``timeout``
        seconds (None: any wait); ``caller`` picks the state of per-caller limits.

        Raises BackendError when the state cannot be reached. Never sleeps for the wait.
        """

    async def peek(self, rule: Rule) -> tuple[BucketState | None, float]:
        """The stored state of ``rule``'s bucket (None: none stored) and the clock, in µs."""

    async def prepare(self) -> None:
        """Get ready for decisions (load the script); BackendError when unreachable."""

    async def aclose(self) -> None:
        """Release connections."""


AsyncBackendFactory = Callable[[Settings], AsyncBackend]
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
    from . import cluster_async, redis_async, sentinel  # noqa: F401

    scheme = settings.redis_url.split("://", 1)[0].lower()
    factory = ASYNC_BACKENDS.get(scheme)
    if factory is None:
        raise ValueError(
            f"redis_url {mask_secrets(settings.redis_url)}: no asyncio backend for {scheme!r}"
        )
    return factory(settings)


@register_async("memory")
class AsyncMemoryBackend:
    """``memory://`` for asyncio: the in-process model, called directly.

    A decision is a few microseconds of arithmetic under an uncontended lock and no
    I/O, so it runs on the event loop; handing it to a thread would cost more.
    """

    shared = False
    __slots__ = ("_memory",)

    def __init__(
        self, settings: Settings | None = None, memory: MemoryBackend | None = None
    ) -> None:
        self._memory = MemoryBackend(settings) if memory is None else memory

    async def reserve(
        self, rule: Rule, permits: int, timeout: float | None, caller: str | None = None
    ) -> Verdict:
        """The model's decision, made at once."""
        return self._memory.reserve(rule, permits, timeout, caller)

    async def peek(self, rule: Rule) -> tuple[BucketState | None, float]:
        """The live state of ``rule``'s bucket, if any."""
        return self._memory.peek(rule)

    async def prepare(self) -> None:
        """Nothing to prepare."""

    async def aclose(self) -> None:
        """Forget every bucket."""
        self._memory.close()
