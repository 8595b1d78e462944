"""The steps the engine asks its shell to carry out: the engine's side of a
conversation in which it does no I/O.

Every operation of the limiters (a decision, a pushback, a report of what is left, a
status read, a heartbeat, a slot taken, given back or renewed) is written once, in
``core/`` (``core/engine.py`` and the feature modules it calls), as a generator: it
yields a step (reserve on the backend, send this script call, wait until woken or this
long, sleep on the clock) and is sent back what the step got (the reply, or the
``BackendError``; an exception raised while the shell carried the step out is thrown
in), until it returns its answer. The threaded and asyncio limiters each carry out the
steps in one small loop (``_run`` of their shell): only they touch a backend, a thread,
an event or the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Generator
from typing import Any, NamedTuple, Protocol, TypeAlias, TypeVar

from gateway_limiter.backends.scripts import ScriptCall
from gateway_limiter.config.rules import Rule
from gateway_limiter.model.priority import Priority

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
    #: what to run if the caller is cancelled while the call is in flight (the script
    #: may have run: give back what it may have taken): asyncio's shell runs it in the
    #: background
    abandoned: Steps[None] | None = None


class Shield(NamedTuple):
    """Run ``steps`` to their end, even if the caller is cancelled meanwhile (giving
    back what a caller that leaves early holds); sent back their answer."""

    steps: Steps[Any]


class PushBack(NamedTuple):
    """Tell the backend the supplier pushed back on ``rule`` (``Backend.pushback``);
    sent back (factor, next free µs), or the BackendError."""

    rule: Rule
    retry_after: float | None
    key: str | None


class Peek(NamedTuple):
    """Read ``rule``'s shared state (``Backend.peek``); sent back what it read, or the
    BackendError."""

    rule: Rule


class PeekPushback(NamedTuple):
    """Read what pushbacks left on ``rule``'s interface (``Backend.peek_pushback``);
    sent back what it read, or the BackendError."""

    rule: Rule


class Beat(NamedTuple):
    """One fleet heartbeat, ``Backend.heartbeat(*args)`` (member, ttl ms, and the
    demand and tallies when there are); sent back the Heartbeat, or the BackendError."""

    args: tuple[Any, ...]


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


class Sleep(NamedTuple):
    """Sleep ``seconds`` on the limiter's clock (``Clock.sleep``); sent back None."""

    seconds: float


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


Step: TypeAlias = (
    Reserve
    | Send
    | Shield
    | PushBack
    | Peek
    | PeekPushback
    | Beat
    | Await
    | Sleep
    | Subscribe
    | StartRenewer
)
#: A feature's conversation: steps out, what they got back in, its answer at the end.
Steps: TypeAlias = Generator[Step, Any, T]

SUBSCRIBE = Subscribe()
START_RENEWER = StartRenewer()


def raw(reply: Any) -> Any:
    """A reply as it came (the engine parses it itself)."""
    return reply
