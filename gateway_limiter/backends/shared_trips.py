"""Threads share round trips: concurrent threaded decisions go to Redis in one pipeline.

The asyncio backend batches coroutines' decisions into shared round trips ("lanes",
``backends/redis_async.py``); this is the same for threads, as a leader and followers:

- A thread that finds no round trip in flight becomes the **leader**: it sends its own
  call at once, on its own thread (no queue, no thread hop: one thread alone is no
  slower), as a batch of one.
- A thread that finds a round trip in flight **queues** its call and sleeps on a lock of
  its own.
- When a leader's round trip is done it takes the queue (up to ``BATCH`` calls, first
  come first served) and wakes the first of them as the next leader, who writes their
  EVALSHAs in one write on one pooled connection, reads the replies in order, hands
  each caller its own reply or error and wakes it; then it takes the queue in turn.

Each call stays its own script call with its own reply: an error reply (a script error
on one key) is that caller's alone; a NOSCRIPT (SCRIPT FLUSH, a restart) loads the
script and asks again for just the calls it hit. A connection error or a read timeout
fails the round trip's batch and every call still queued (BackendError at once: a dead
Redis costs a queued caller nothing beyond the failure it waited on), and the
connection is dropped, so no stale reply is read later.

Each caller keeps its own timeout: a follower waits at most ``wait_s`` for its turn
(a round trip in flight and its own, each within the read deadline), and a follower
that gives up while queued is removed and never sent; one that gives up after its call
was written gets BackendError, while the leader still reads its reply (the connection
stays in step) and the other callers get theirs.

No redis import here: the backend gives the two ways of sending (one call, a batch).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from gateway_limiter.backends.base import BackendError
from gateway_limiter.backends.scripts import ScriptCall

__all__ = ["Queued", "RoundTripSharing"]


class Queued:
    """One call waiting for a round trip: its reply or error once answered, when it was
    queued and when written (monotonic s; 0 until then), and whether it leads the next
    batch."""

    __slots__ = (
        "_wake",
        "answered",
        "batch",
        "call",
        "entered",
        "error",
        "queued",
        "reply",
        "sent",
    )

    def __init__(self, call: ScriptCall) -> None:
        self.call = call
        self.entered = time.monotonic()
        self.reply: Any = None
        self.error: BaseException | None = None
        self.answered = False
        self.sent = 0.0
        #: True while in the queue (not yet taken into a batch)
        self.queued = True
        #: set on the call chosen to send a batch: the batch (itself first)
        self.batch: list[Queued] | None = None
        # A plain lock, held until the answer (or the lead) is handed over: the cheapest
        # way in CPython to put one thread to sleep and wake exactly that one.
        self._wake = threading.Lock()
        self._wake.acquire()

    def answer(self, reply: Any = None, error: BaseException | None = None) -> None:
        """Hand over the reply or the error, and wake the caller (once; later calls are
        ignored)."""
        if self.answered:
            return
        self.reply, self.error, self.answered = reply, error, True
        self._wake.release()

    def wake(self) -> None:
        """Wake the caller to send the batch set in ``batch``."""
        self._wake.release()

    def wait(self, seconds: float | None) -> bool:
        """Sleep until answered or chosen to lead (None: however long that takes); False
        when ``seconds`` passed first."""
        if seconds is None:
            return self._wake.acquire()
        return self._wake.acquire(timeout=max(seconds, 0.0))


class RoundTripSharing:
    """The leader/follower queue of one backend's threaded calls.

    ``send_one(call)`` sends one call alone (the leader's own) and returns its reply or
    raises; ``send_batch(batch)`` sends the batch's calls in one round trip and answers
    each (``Queued.answer``), raising only when the round trip itself failed (then the
    calls not yet answered are failed here). ``wait_s()``: how long a follower may wait
    for the round trip in flight, and again for its own. ``failed(e)``: True when ``e``
    means the connection failed (the queue gives up too), False for an error that is
    one call's own answer.
    """

    __slots__ = ("_busy", "_failed", "_lock", "_queue", "_send_batch", "_send_one", "_wait_s")

    #: Calls sent in one round trip at most (128 decisions run ~1-2 ms in Redis).
    BATCH = 128

    def __init__(
        self,
        send_one: Callable[[ScriptCall], Any],
        send_batch: Callable[[list[Queued]], None],
        wait_s: Callable[[], float],
        failed: Callable[[BaseException], bool],
    ) -> None:
        self._send_one = send_one
        self._send_batch = send_batch
        self._wait_s = wait_s
        self._failed = failed
        self._lock = threading.Lock()
        self._busy = False  # a round trip is in flight (one sender at a time)
        self._queue: deque[Queued] = deque()

    def run(self, call: ScriptCall) -> tuple[Any, float]:
        """``call``'s reply, and how long it waited in the queue before it was written
        (s; 0.0 when sent at once). Raises what ``send_one`` raises, or BackendError."""
        lock = self._lock
        with lock:
            if not self._busy:
                self._busy = True
                waiting = None
            else:
                waiting = Queued(call)
                self._queue.append(waiting)
        if waiting is not None:
            return self._follow(waiting)
        # The uncontended path: this thread sends its own call.
        try:
            reply = self._send_one(call)
        except BaseException as e:
            self._done(e)
            raise
        with lock:
            if not self._queue:  # nobody came meanwhile: stand down (``_done``, in short)
                self._busy = False
                return reply, 0.0
        self._done(None)
        return reply, 0.0

    def _follow(self, waiting: Queued) -> tuple[Any, float]:
        try:
            self._wait_turn(waiting)
        except BaseException:  # KeyboardInterrupt while asleep: give the turn on
            self._abandon(waiting)
            raise
        batch = waiting.batch
        if batch is not None:  # chosen to send the batch it heads
            waiting.batch = None
            try:
                self._send_batch(batch)
            except BaseException as e:
                error = e if isinstance(e, BackendError) else BackendError(_describe(e))
                for other in batch:
                    other.answer(error=error)
                self._done(e)
            else:
                self._done(None)
        if waiting.error is not None:
            raise waiting.error
        return waiting.reply, max(waiting.sent - waiting.entered, 0.0)

    def _wait_turn(self, waiting: Queued) -> None:
        """Sleep until ``waiting`` is answered or leads a batch; BackendError when its
        wait runs out first."""
        wait_s = self._wait_s()
        if not waiting.wait(wait_s):
            with self._lock:
                if waiting.queued:  # never sent: leave the queue, nothing reserved
                    self._queue.remove(waiting)
                    waiting.queued = False  # out of it: _abandon has nothing to remove
                    raise BackendError(
                        f"TimeoutError: no round trip to Redis within {wait_s:.3f} s"
                    )
                leads = waiting.batch is not None
            # Taken into a batch. Its sender is woken right after the lock is let go,
            # so wait for that without a limit; a reply comes within the batch's reads:
            # wait once more, then give up (the sender still reads the reply, so the
            # connection stays in step, and drops it).
            if not waiting.wait(None if leads else wait_s):
                raise BackendError(f"TimeoutError: no reply from Redis within {2 * wait_s:.3f} s")

    def _abandon(self, waiting: Queued) -> None:
        """``waiting``'s caller stopped waiting (interrupted): out of the queue if still
        in it; if it was to send a batch, the next caller of that batch sends it (or the
        queue moves on), so nobody is left waiting for a sender that is gone."""
        with self._lock:
            if waiting.queued:
                self._queue.remove(waiting)
                waiting.queued = False
                return
            batch, waiting.batch = waiting.batch, None
            rest = batch[1:] if batch is not None else []
            if rest:
                rest[0].batch = rest
        if batch is None:
            return  # in flight: the sender reads its reply and drops it
        if rest:
            rest[0].wake()
        else:
            self._done(None)

    def _done(self, error: BaseException | None) -> None:
        """A round trip ended: hand the queue to its first caller, or stand down. After a
        failed connection every queued call gives up at once."""
        gone: list[Queued] = []
        with self._lock:
            queue = self._queue
            if error is not None and self._failed(error):
                gone = list(queue)
                queue.clear()
            if not queue:
                self._busy = False
                batch = None
            else:
                batch = [queue.popleft() for _ in range(min(len(queue), self.BATCH))]
                for waiting in batch:
                    waiting.queued = False
                batch[0].batch = batch  # under the lock: see _follow
            for waiting in gone:
                waiting.queued = False
        if gone:
            failure = BackendError(f"Redis failed while this call was queued: {_describe(error)}")
            for waiting in gone:
                waiting.answer(error=failure)
        if batch is not None:
            batch[0].wake()


def stamp(batch: list[Queued]) -> None:
    """Record that ``batch`` is written now."""
    sent = time.monotonic()
    for waiting in batch:
        waiting.sent = sent


def _describe(error: BaseException | None) -> str:
    return f"{type(error).__name__}: {error}"
