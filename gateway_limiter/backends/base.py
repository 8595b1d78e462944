"""What a backend is: one decision per call for a Rule, made atomically where the state
lives, and the transport it is made over.

A backend knows nothing of rows, switches or policies (those live above it, in the
core). ``Backend`` is the threaded shape the shells call and ``AsyncBackend`` the
asyncio one; they have the same methods, and only the I/O differs. Besides the
decisions, a backend sends any script call the core packed (``script``: slots, leases)
and subscribes to a channel (``subscribe``: the slots' grants).

A Redis backend (one Redis, Sentinel, Cluster) is those operations written once
(``backends/operations_async.py`` and its generated twin ``operations.py``, over
``backends/calls.py``'s call builders and reply parsers) on top of a ``Transport``,
which only sends: a script call, a batch of commands, a subscription, and closes.
``memory://`` is the same operations over a transport that stays in this process: the
scripts' models answer its calls (``backends/script_models.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from gateway_limiter.config.rules import Rule
from gateway_limiter.model.bucket import US_PER_S, Verdict
from gateway_limiter.model.limits import LimitState
from gateway_limiter.model.pushback import PushbackState

if TYPE_CHECKING:  # backends/fleet.py and scripts.py import BackendError from here
    from gateway_limiter.backends.calls import Batch
    from gateway_limiter.backends.fleet import Heartbeat
    from gateway_limiter.backends.scripts import ScriptCall


#: What ``peek`` answers: the limit's stored state (None: none stored) and the server's
#: time in µs.
PeekedState = tuple[LimitState | None, float]
#: What ``peek_pushback`` answers: what pushbacks left (None: nothing) and the time.
PeekedPushback = tuple[PushbackState | None, float]


class BackendError(Exception):
    """The shared state could not be reached or answered wrongly (a failure policy applies)."""


#: What hears a channel's message, a slot grant (None: the subscription was lost, a
#: message may have been missed: ask again).
Heard = Callable[[bytes | None], None]


class Listener(Protocol):
    """A subscription (``backends/subscriptions.py``), made by a backend's ``subscribe``."""

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
        """The client it talks through (None: in-process, no client), for status and
        tests."""

    def subscribe(self, channel: str, heard: Heard) -> Listener | None:
        """Hear ``channel``'s messages (``heard``) on a connection and a thread of its own,
        until stopped; None when no subscription can be made (``memory://``: nothing is
        published in-process)."""

    def script(self, call: ScriptCall) -> Any:
        """Send one script call the core packed (``backends/scripts.py``, ``slots.py``)
        where its keys live; its raw reply. BackendError when it cannot be answered
        (in-process, any but a decision's: ``memory://`` has no slots or leases)."""

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

    def subscribe(self, channel: str, heard: Heard) -> Listener | None:
        """``Backend.subscribe`` (its thread and connection are its own, not the loop's)."""

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


class Transport(Protocol):
    """What a threaded backend implements (Redis's, and ``memory://``'s in-process);
    ``backends/operations.py`` makes every operation of ``Backend`` from these
    (``backends/calls.py`` says what each sends)."""

    def call(self, call: ScriptCall) -> tuple[Any, float]:
        """Send one script call where its keys live: its raw reply, and how long after it
        was asked for it was written (s; queued behind another's round trip). Reloads the
        script after NOSCRIPT. BackendError when it is not answered."""

    def batch(self, batch: Batch) -> list[Any]:
        """Send ``batch``'s commands in one round trip on the server that holds its key:
        the replies in order (an error reply as the exception). BackendError when it is
        not answered."""

    def subscribe(self, channel: str, heard: Heard) -> Listener | None:
        """``Backend.subscribe``."""

    def prepare(self) -> None:
        """Load the scripts before the first call; BackendError when unreachable."""

    def close(self) -> None:
        """Release connections."""


class AsyncTransport(Protocol):
    """``Transport`` awaited (``backends/operations_async.py``)."""

    async def call(self, call: ScriptCall) -> tuple[Any, float]:
        """``Transport.call``, awaited."""

    async def batch(self, batch: Batch) -> list[Any]:
        """``Transport.batch``, awaited."""

    def subscribe(self, channel: str, heard: Heard) -> Listener | None:
        """``Transport.subscribe`` (a thread of its own, as for threads)."""

    async def prepare(self) -> None:
        """``Transport.prepare``, awaited."""

    async def aclose(self) -> None:
        """Release connections."""


def monotonic_us() -> float:
    """This process's monotonic clock in microseconds (a backend's clock by default)."""
    return time.monotonic_ns() / 1000.0


class Clocks(NamedTuple):
    """The limiter's clocks, which every backend is opened with (``backends/schemes.py``):
    ``clock``, monotonic µs, where ``memory://`` decides (Redis decides on its own);
    ``wall``, epoch seconds, where a calendar quota's periods are computed from."""

    clock: Callable[[], float] = monotonic_us
    wall: Callable[[], float] = time.time


#: This process's own clocks (a limiter given no ``clock=``).
SYSTEM_CLOCKS = Clocks()


def to_us(timeout_s: float | None) -> float | None:
    """Seconds to microseconds, keeping None (no limit)."""
    return None if timeout_s is None else timeout_s * US_PER_S
