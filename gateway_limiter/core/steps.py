"""The steps the decision path asks its shell to carry out: the engine's side of a
conversation in which it does no I/O.

A feature that needs more than one round trip, or a wait between them (a lease row
waiting for another caller's renewal, ``slot()`` queueing for a slot), is written once,
here in ``core/``, as a generator: it yields a step (send this script call, reserve on
the backend, wait until woken or this long) and is sent back what the step got (the
reply, or the ``BackendError``), until it returns its answer. The threaded and asyncio
limiters each carry out the steps in one small loop (``run`` of their shell): only
they touch a backend, a thread, an event or the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeAlias, TypeVar

from gateway_limiter.backends.scripts import ScriptCall
from gateway_limiter.config.rules import Rule
from gateway_limiter.core.clock import Clock
from gateway_limiter.model.priority import Priority

if TYPE_CHECKING:  # core/slots.py imports this module
    from gateway_limiter.core.slots import Held

T = TypeVar("T")


class Ask:
    """What ``LimiterCore._begin`` leaves to the shell: ask the backend to ``reserve``
    ``permits`` of ``rule`` within ``budget_s`` (None: however long), for ``key``."""

    __slots__ = ("asked", "budget_s", "key", "lease", "permits", "priority", "renewing", "rule")

    def __init__(
        self,
        rule: Rule,
        permits: int,
        budget_s: float | None,
        key: str | None,
        asked: tuple[float, int] | None,
        lease: ScriptCall | None = None,
        priority: Priority | None = None,
    ) -> None:
        self.rule = rule
        self.permits = permits
        self.budget_s = budget_s
        self.key = key
        #: When the request left (monotonic s) and the local refusals' generation then;
        #: None without local refusals.
        self.asked = asked
        #: A lease row's ``lease.lua`` call, sent instead of ``reserve`` (``core.leases``)
        self.lease = lease
        #: A lease row whose lease another caller is renewing: the shell waits for that
        #: (``core.leases.leasing``), then asks again
        self.renewing = False
        #: The call's class as it was asked for (None: its row's, else default)
        self.priority = priority


class Reserve(NamedTuple):
    """Reserve on the backend as ``ask`` says; sent back the Verdict or BackendError."""

    ask: Ask


class Send(NamedTuple):
    """Send one script call; sent back ``parse(reply)``, or the BackendError."""

    call: ScriptCall
    parse: Callable[[Any], Any]
    #: what to give back if the caller is cancelled while the call is in flight (the
    #: script may have run): asyncio's shell sends it in the background
    abandoned: Held | None = None


class Wakeable(Protocol):
    """What a step may wait for: woken from any thread, waited for by a thread or on
    an event loop, at most ``seconds``."""

    def wait(self, seconds: float) -> None:
        """Block until woken, at most ``seconds``."""

    async def wait_async(self, seconds: float) -> None:
        """``wait``, awaited on the running loop."""


class Await(NamedTuple):
    """Wait until ``until`` is woken, at most ``seconds``; sent back None."""

    until: Wakeable
    seconds: float


class Slept:
    """A wait nothing ends early, slept on the limiter's clock (``clock=``): a lower
    class waiting out its reply's wait before it asks again. A ``Woken`` no one wakes
    would wait on the system's clock whatever the limiter was given."""

    __slots__ = ("_clock",)

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def wait(self, seconds: float) -> None:
        """Sleep ``seconds`` on the clock."""
        self._clock.sleep(seconds)

    async def wait_async(self, seconds: float) -> None:
        """``wait``, awaited on the running loop."""
        await self._clock.sleep_async(seconds)


class Woken:
    """A wake-up that may come from any thread (``wake``), waited for by a thread or a
    coroutine; a wake before the wait is not lost."""

    __slots__ = ("_event", "_lock", "_loops")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._loops: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def wake(self) -> None:
        """Wake whoever waits, or will."""
        with self._lock:
            self._event.set()
            loops, self._loops = self._loops, []
        for loop, future in loops:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits there
                loop.call_soon_threadsafe(_done, future)

    def wait(self, seconds: float) -> None:
        """Block until woken, at most ``seconds``."""
        self._event.wait(seconds)

    async def wait_async(self, seconds: float) -> None:
        """``wait``, awaited on the running loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._event.is_set():
                return
            self._loops.append((loop, future))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(future, seconds)


def _done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Subscribe(NamedTuple):
    """Start hearing slot grants (once per limiter; connecting blocks)."""


class StartRenewer(NamedTuple):
    """Start renewing the slots' leases this limiter holds (once)."""


Step: TypeAlias = Reserve | Send | Await | Subscribe | StartRenewer
#: A feature's conversation: steps out, what they got back in, its answer at the end.
Steps: TypeAlias = Generator[Step, Any, T]

SUBSCRIBE = Subscribe()
START_RENEWER = StartRenewer()


def raw(reply: Any) -> Any:
    """A reply as it came (the engine parses it itself)."""
    return reply
