"""What a backend is: one decision per call for a Rule, made atomically where the state lives.

A backend knows nothing of rows, switches or policies (those live above it, in the
core). ``Backend`` is the threaded shape and ``AsyncBackend`` the asyncio one; they have
the same methods, and only the I/O differs. Besides the decisions, a backend sends any
script call the core packed (``script``: slots, leases) and says which client it
talks through (``client``: what the slots' subscriber connects beside).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from gateway_limiter.config.rules import Rule
from gateway_limiter.model.bucket import US_PER_S, Verdict
from gateway_limiter.model.limits import LimitState
from gateway_limiter.model.pushback import PushbackState

if TYPE_CHECKING:  # backends/fleet.py and scripts.py import BackendError from here
    from gateway_limiter.backends.fleet import Heartbeat
    from gateway_limiter.backends.scripts import ScriptCall


#: What ``peek`` answers: the limit's stored state (None: none stored) and the server's
#: time in µs.
PeekedState = tuple[LimitState | None, float]
#: What ``peek_pushback`` answers: what pushbacks left (None: nothing) and the time.
PeekedPushback = tuple[PushbackState | None, float]


class BackendError(Exception):
    """The shared state could not be reached or answered wrongly (a failure policy applies)."""


#: What hears a slot grant: the message (None: the subscription was lost, ask again).
Heard = Callable[[bytes | None], None]


class Listener(Protocol):
    """A subscription that hears slot grants (``backends/slot_wakeups.py``)."""

    @property
    def listening(self) -> bool:
        """True while it hears them."""

    def stop(self) -> None:
        """Stop hearing them and close its connection."""


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

    def peek(self, rule: Rule) -> PeekedState:
        """The stored state of ``rule``'s own shared limit (a bucket's, a window's; None:
        none stored) and the clock, in µs."""

    def peek_pushback(self, rule: Rule) -> PeekedPushback:
        """What pushbacks left on ``rule``'s interface for all its callers (None: nothing)
        and the clock, in µs. ``rule`` is the interface's, with all its limits."""

    def pushback(
        self, rule: Rule, retry_after: float | None, caller: str | None = None
    ) -> tuple[float, float]:
        """Record that the supplier pushed back on ``rule``'s interface (``retry_after``
        seconds, or None: decrease the effective rate), where decisions read it.

        Returns the effective factor after it and the µs before which no call goes.
        Raises BackendError when the state cannot be reached.
        """

    def prepare(self) -> None:
        """Get ready for decisions (load the script); BackendError when unreachable."""

    @property
    def client(self) -> Any:
        """The client it talks through (None: in-process, no client)."""

    def script(self, call: ScriptCall) -> Any:
        """Send one script call the core packed (``backends/scripts.py``, ``slots.py``)
        where its keys live; its raw reply. BackendError when it cannot be answered
        (always, in-process: ``memory://`` runs no scripts)."""

    def heartbeat(
        self, member: str, ttl_ms: int, demand: str = "", tallies: str | None = None
    ) -> Heartbeat:
        """Announce ``member`` alive for ``ttl_ms`` (0: gone) with its ``demand``
        (``encode_demand``'s JSON, "" none) and drop the dead, in one round trip; the
        number of live members and its claims. BackendError when unreachable.

        ``tallies`` (JSON, ``fleet.encode_tallies``): this member's live numbers, stored
        beside its membership by the same round trip (the console sums them)."""

    def members(self) -> tuple[list[tuple[str, float]], float]:
        """The live members with the moment each dies (ms), and the server's clock (ms)."""

    def close(self) -> None:
        """Release connections."""


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

    async def peek(self, rule: Rule) -> PeekedState:
        """``Backend.peek``, awaited."""

    async def peek_pushback(self, rule: Rule) -> PeekedPushback:
        """``Backend.peek_pushback``, awaited."""

    async def pushback(
        self, rule: Rule, retry_after: float | None, caller: str | None = None
    ) -> tuple[float, float]:
        """``Backend.pushback``, awaited."""

    async def prepare(self) -> None:
        """Get ready for decisions (load the script); BackendError when unreachable."""

    @property
    def client(self) -> Any:
        """``Backend.client``."""

    async def script(self, call: ScriptCall) -> Any:
        """``Backend.script``, awaited."""

    async def heartbeat(
        self, member: str, ttl_ms: int, demand: str = "", tallies: str | None = None
    ) -> Heartbeat:
        """``Backend.heartbeat``, awaited."""

    async def members(self) -> tuple[list[tuple[str, float]], float]:
        """``Backend.members``, awaited."""

    async def aclose(self) -> None:
        """Release connections."""


def to_us(timeout_s: float | None) -> float | None:
    """Seconds to microseconds, keeping None (no limit)."""
    return None if timeout_s is None else timeout_s * US_PER_S
