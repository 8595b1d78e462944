"""What the two limiter shells run on: one set of names, for asyncio and for threads.

``aio.py`` is written once, against the asyncio half of this module; the threaded
shell, ``limiter.py``, is generated from it by ``scripts/generate_sync.py``, which drops
``async`` and ``await`` and renames ``AsyncX`` to ``X`` and ``x_async`` to ``x``. So each
asyncio name here has a threaded twin under that name, doing the same thing its own way:

=========================  ==========================  ===================================
asyncio                    threads                     what it is
=========================  ==========================  ===================================
``sleep_async``            ``sleep``                   wait so many seconds
``blocking_async``         ``blocking``                a blocking call (database, connect):
                                                       in a worker thread / right here
``shielded_async``         ``shielded``                finish this even if cancelled
``spawn_async``            ``spawn``                   start work nobody waits for: a task
                                                       (kept referenced) / a daemon thread
``event_loop_async``       ``event_loop``              the running loop / None
``AsyncCancelled``         ``Cancelled``               the caller was cancelled (a thread
                                                       is never: nothing raises it)
``AsyncRepeating``         ``Repeating``               run a call every so many seconds
                                                       until stopped: a task / a thread
=========================  ==========================  ===================================

Nothing here knows of limits: the engine (``core/``) decides, the shells carry its
steps out with these.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

__all__ = [
    "AsyncCancelled",
    "AsyncRepeating",
    "Cancelled",
    "Repeating",
    "blocking",
    "blocking_async",
    "event_loop",
    "event_loop_async",
    "shielded",
    "shielded_async",
    "sleep",
    "sleep_async",
    "spawn",
    "spawn_async",
]

P = ParamSpec("P")
T = TypeVar("T")

# --- asyncio ------------------------------------------------------------------------------

AsyncCancelled = asyncio.CancelledError


async def sleep_async(seconds: float) -> None:
    """``asyncio.sleep``."""
    await asyncio.sleep(seconds)


async def blocking_async(call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``call`` in a worker thread, so that the loop goes on meanwhile."""
    return await asyncio.to_thread(call, *args, **kwargs)


async def shielded_async(
    call: Callable[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs
) -> T:
    """``call`` carried to its end even when the caller is cancelled meanwhile."""
    return await asyncio.shield(call(*args, **kwargs))


#: Work ``spawn_async`` started, referenced until it ends (a task nobody references
#: may be collected before it has run).
_SPAWNED: set[asyncio.Task[object]] = set()


def spawn_async(
    call: Callable[P, Coroutine[Any, Any, object]], *args: P.args, **kwargs: P.kwargs
) -> None:
    """Run ``call`` as a task of the running loop that nobody waits for."""
    task = asyncio.get_running_loop().create_task(call(*args, **kwargs))
    _SPAWNED.add(task)
    task.add_done_callback(_SPAWNED.discard)


def event_loop_async() -> asyncio.AbstractEventLoop | None:
    """The running loop (what wakes an asyncio waiter from another thread)."""
    return asyncio.get_running_loop()


class AsyncRepeating:
    """``call`` every ``every_s`` seconds, as a task of the loop that ``start``s it,
    until ``stop``; ``first``, when given, runs once at once before the first wait."""

    __slots__ = ("_first", "_stopped", "_task", "call", "every_s", "name")

    def __init__(
        self,
        name: str,
        every_s: float,
        call: Callable[[], Awaitable[None]],
        first: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.name, self.every_s, self.call, self._first = name, every_s, call, first
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    @property
    def alive(self) -> bool:
        """Started, and still repeating."""
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start repeating (once: a second ``start``, or one after ``stop``, does nothing)."""
        if self._task is None and not self._stopped:
            self._task = asyncio.get_running_loop().create_task(self._repeat(), name=self.name)

    async def _repeat(self) -> None:
        if self._first is not None:
            await self._first()
        while True:
            await asyncio.sleep(self.every_s)
            await self.call()

    def cancel(self) -> None:
        """Stop repeating without waiting (a call in flight is cancelled)."""
        self._stopped = True
        if self._task is not None:
            self._task.cancel()

    async def stop(self) -> bool:
        """Stop repeating, and wait until the call in flight, if any, is cancelled; True
        when it had started."""
        self.cancel()
        task, self._task = self._task, None
        if task is None:
            return False
        await asyncio.gather(task, return_exceptions=True)
        return True


# --- threads --------------------------------------------------------------------------


class Cancelled(BaseException):
    """A thread is not cancelled: nothing raises this (the twin of ``AsyncCancelled``)."""


def sleep(seconds: float) -> None:
    """``time.sleep``."""
    time.sleep(seconds)


def blocking(call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``call``, on the calling thread (which may block)."""
    return call(*args, **kwargs)


def shielded(call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``call``: a thread is never cancelled."""
    return call(*args, **kwargs)


def spawn(call: Callable[P, object], *args: P.args, **kwargs: P.kwargs) -> None:
    """Run ``call`` on a daemon thread that nobody waits for."""
    thread = threading.Thread(
        target=call, args=args, kwargs=kwargs, name="gateway-limiter-spawned", daemon=True
    )
    thread.start()


def event_loop() -> asyncio.AbstractEventLoop | None:
    """None: a thread's waiter is woken by an event, not through a loop."""
    return None


class Repeating:
    """``call`` every ``every_s`` seconds on a daemon thread, until ``stop``; ``first``,
    when given, runs once at once before the first wait."""

    __slots__ = ("_first", "_lock", "_stop", "_thread", "call", "every_s", "name")

    def __init__(
        self,
        name: str,
        every_s: float,
        call: Callable[[], None],
        first: Callable[[], None] | None = None,
    ) -> None:
        self.name, self.every_s, self.call, self._first = name, every_s, call, first
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()

    @property
    def alive(self) -> bool:
        """Started, and still repeating."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def start(self) -> None:
        """Start repeating (once: a second ``start``, or one after ``stop``, does nothing)."""
        if self._thread is not None:
            return
        with self._lock:  # threads may start it at once: one thread repeats
            if self._thread is None and not self._stop.is_set():
                thread = threading.Thread(target=self._repeat, name=self.name, daemon=True)
                self._thread = thread
                thread.start()

    def _repeat(self) -> None:
        if self._first is not None:
            self._first()
        while not self._stop.wait(self.every_s):
            self.call()

    def cancel(self) -> None:
        """Stop repeating without waiting (a call in flight runs to its end)."""
        self._stop.set()

    def stop(self) -> bool:
        """Stop repeating, and wait for the call in flight, if any, to end (within the
        backend's timeouts); True when it had started."""
        self.cancel()
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return False
        thread.join()
        return True
