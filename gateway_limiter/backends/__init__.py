"""Where bucket state lives, chosen by the scheme of ``redis_url``.

A backend makes one decision per call for a Rule and knows nothing of rows, switches
or policies (those live above it, in the limiter). Schemes map to factories in
``BACKENDS``; a new storage registers itself there rather than growing an if-chain.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..bucket import BucketState, Verdict
from ..rules import Rule
from ..settings import Settings, mask_secrets


class BackendError(Exception):
    """The shared state could not be reached or answered wrongly (a failure policy applies)."""


class Backend(Protocol):
    """One decision per call, made atomically where the state lives."""

    #: True when state is shared between processes (False for ``memory://``).
    shared: bool

    def reserve(
        self, rule: Rule, permits: int, timeout: float | None, caller: str | None = None
    ) -> Verdict:
        """Reserve ``permits`` on every limit of ``rule`` if the wait is within ``timeout``
        seconds (None: any wait); ``caller`` picks the state of per-caller limits.

        Raises BackendError when the state cannot be reached.
        """

    def peek(self, rule: Rule) -> tuple[BucketState | None, float]:
        """The stored state of ``rule``'s own shared bucket (None: none stored) and the
        clock, in µs."""

    def prepare(self) -> None:
        """Get ready for decisions (load the script); BackendError when unreachable."""

    def close(self) -> None:
        """Release connections."""


BackendFactory = Callable[[Settings], Backend]
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
    from . import cluster, memory, redis, sentinel  # noqa: F401

    scheme = settings.redis_url.split("://", 1)[0].lower()
    factory = BACKENDS.get(scheme)
    if factory is None:
        raise ValueError(f"redis_url {mask_secrets(settings.redis_url)}: no backend for {scheme!r}")
    return factory(settings)


def to_micros(timeout: float | None) -> float | None:
    """Seconds to microseconds, keeping None (no limit)."""
    return None if timeout is None else timeout * 1_000_000.0
