"""Threads share round trips: concurrent threaded decisions go to Redis in one pipeline.

How it works: docs/internals.md, section ``gateway_limiter.backends.shared_trips``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any

from gateway_limiter.backends.base import BackendError
from gateway_limiter.backends.scripts import ScriptCall

__all__ = ["Queued", "RoundTripSharing", "Trip"]


class Queued:
    """One call waiting for a round trip: its reply or error once answered, when it was
    queued and when written (monotonic s; 0 until then), and, for the first call of a
    batch, the batch it reads (``trip``)."""

    __slots__ = (
        "_wake",
        "after",
        "answered",
        "call",
        "entered",
        "error",
        "gave_up",
        "queued",
        "reply",
        "sent",
        "trip",
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
        #: set (under the queue's lock) on the call chosen to read its batch's replies
        self.trip: Trip | None = None
        #: the call this one wakes once it is awake (``RoundTripSharing._next``)
        self.after: Queued | None = None
        #: stopped waiting (its time ran out, interrupted): woken by nobody's chain
        self.gave_up = False
        # A plain lock, held until the answer (or the batch to read) is handed over: the
        # cheapest way in CPython to put one thread to sleep and wake exactly that one.
        self._wake = threading.Lock()
        self._wake.acquire()

    def settle(self, reply: Any = None, error: BaseException | None = None) -> None:
        """Record the reply or the error (once; later calls are ignored), without waking
        the caller: ``wake`` does, once the next batch is written."""
        if self.answered:
            return
        self.reply, self.error, self.answered = reply, error, True

    def wake(self) -> None:
        """Wake the caller: answered, or chosen to read the batch in ``trip`` (each call
        is woken once)."""
        self._wake.release()

    def wait(self, seconds: float | None) -> bool:
        """Sleep until woken (None: however long that takes); False when ``seconds``
        passed first."""
        if seconds is None:
            return self._wake.acquire()
        return self._wake.acquire(timeout=max(seconds, 0.0))


class Trip:
    """One batch on its way: its calls, what the backend's ``write`` returned for its
    ``read`` (``token``), and whether it is written (its reader woken after)."""

    __slots__ = ("calls", "token", "written")

    def __init__(self, calls: list[Queued]) -> None:
        self.calls = calls
        self.token: Any = None
        self.written = False


class RoundTripSharing:
    """The leader/follower queue of one backend's threaded calls.

    ``send_one(call)`` sends one call alone (the leader's own) and returns its reply or
    raises. ``write(batch)`` writes the batch's calls in one write and returns what
    ``read(batch, token)`` needs to read their replies; ``read`` records each call's
    own reply or error (``Queued.settle``), and either raises only when the round trip
    itself failed (the backend has dropped the connection; the calls not yet answered
    are failed here). ``wait_s()``: how long a follower may wait for the round trip in
    flight, and again for its own. ``failed(e)``: True when ``e`` means the connection
    failed (the queue gives up too), False for an error that is one call's own answer.
    """

    __slots__ = ("_busy", "_failed", "_lock", "_queue", "_read", "_send_one", "_wait_s", "_write")

    #: Calls sent in one round trip at most (128 decisions run ~1-2 ms in Redis).
    BATCH = 128
    #: Callers of a round trip woken, one after the other, before the next batch's
    #: reader; the rest after it. Each wake-up waits for a thread switch, so this bounds
    #: how long the reader (and the replies of the batch in flight) waits for them.
    READER_AFTER = 8

    def __init__(
        self,
        send_one: Callable[[ScriptCall], Any],
        write: Callable[[list[Queued], bool], Any],
        read: Callable[[list[Queued], Any], None],
        wait_s: Callable[[], float],
        failed: Callable[[BaseException], bool],
    ) -> None:
        self._send_one = send_one
        self._write = write
        self._read = read
        self._wait_s = wait_s
        self._failed = failed
        self._lock = threading.Lock()
        self._busy = False  # a round trip is in flight, or its replies being read
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
            self._next((), e, None)
            raise
        with lock:
            if not self._queue:  # nobody came meanwhile: stand down (``_next``, in short)
                self._busy = False
                return reply, 0.0
        self._next((), None, None)
        return reply, 0.0

    def _follow(self, waiting: Queued) -> tuple[Any, float]:
        try:
            self._wait_turn(waiting)
        except BaseException:  # its time ran out, or KeyboardInterrupt while asleep
            self._pass_on(waiting)
            if self._abandon(waiting):  # this call reads its batch: do, then raise
                self._read_trip(waiting)
            raise
        after = waiting.after
        if after is not None:  # the next caller of the chain it was woken in
            waiting.after = None
            after.wake()
        if not waiting.answered:  # chosen to read the batch it heads
            self._read_trip(waiting)
        if waiting.error is not None:
            raise waiting.error
        return waiting.reply, max(waiting.sent - waiting.entered, 0.0)

    def _read_trip(self, reader: Queued) -> None:
        """Read the replies of the batch ``reader`` heads, then hand on the queue."""
        trip = reader.trip
        assert trip is not None
        reader.trip = None
        try:
            self._read(trip.calls, trip.token)
        except BaseException as e:
            error = e if isinstance(e, BackendError) else BackendError(_describe(e))
            for other in trip.calls:
                other.settle(error=error)
            self._next(trip.calls, e, reader)
        else:
            self._next(trip.calls, None, reader)

    def _wait_turn(self, waiting: Queued) -> None:
        """Sleep until ``waiting`` is answered or reads a batch; BackendError when its
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
                reads = waiting.trip is not None
            # Taken into a batch. Its reader is woken once the batch is written and the
            # callers before it in the chain are awake, so it waits for that without a
            # limit; a reply comes within the batch's reads: wait once more, then give
            # up (the reader still reads the reply, so the connection stays in step,
            # and drops it).
            if not waiting.wait(None if reads else wait_s):
                raise BackendError(f"TimeoutError: no reply from Redis within {2 * wait_s:.3f} s")

    def _pass_on(self, waiting: Queued) -> None:
        """``waiting``'s caller stopped waiting: it is left out of any chain of wake-ups
        made from now, and the one it was to wake, if any, is woken now."""
        with self._lock:
            waiting.gave_up = True
            after, waiting.after = waiting.after, None
        if after is not None:
            after.wake()

    def _abandon(self, waiting: Queued) -> bool:
        """``waiting``'s caller stopped waiting (interrupted): out of the queue if still
        in it. True when it was chosen to read its batch: it then waits for the batch to
        be written and must read it (nobody else will) before it raises."""
        with self._lock:
            if waiting.queued:
                self._queue.remove(waiting)
                waiting.queued = False
                return False
            trip = waiting.trip
            if trip is None:
                return False  # in flight: the reader reads its reply and drops it
        if not trip.written:
            waiting.wait(None)  # woken once written (after the callers before it)
        else:
            waiting.wait(0.0)  # written: read now (a wake-up may be pending, or to come)
        return not waiting.answered  # a failed write answered it: nothing to read

    def _next(self, done: Sequence[Queued], error: BaseException | None, me: Queued | None) -> None:
        """A round trip ended (``done``: its calls, each settled; ``error``: how it
        failed, None when it did not). On this thread: write the next batch from the
        queue, or stand down; then wake ``done``'s callers (``me``, this thread's own
        call, is awake) and last the new batch's reader, one after the other. After a
        failed connection every queued call gives up at once."""
        woken: list[Sequence[Queued]] = [done]
        reader: Queued | None = None
        just_read = error is None  # the connection: its replies read this moment
        while True:
            gone: list[Queued] = []
            trip: Trip | None = None
            with self._lock:
                queue = self._queue
                if error is not None and self._failed(error):
                    gone = list(queue)
                    queue.clear()
                    for waiting in gone:
                        waiting.queued = False
                if not queue:
                    self._busy = False
                else:
                    batch = [queue.popleft() for _ in range(min(len(queue), self.BATCH))]
                    for waiting in batch:
                        waiting.queued = False
                    trip = batch[0].trip = Trip(batch)  # under the lock: see _wait_turn
            if gone:
                failure = BackendError(
                    f"Redis failed while this call was queued: {_describe(error)}"
                )
                for waiting in gone:
                    waiting.settle(error=failure)
                woken.append(gone)
            if trip is None:
                break
            batch = trip.calls
            try:
                trip.token = self._write(batch, just_read)
            except BaseException as e:
                failure = e if isinstance(e, BackendError) else BackendError(_describe(e))
                for waiting in batch:
                    waiting.settle(error=failure)
                trip.written = True
                woken.append(batch)
                error, just_read = e, False
                continue  # the queue gives up too when the connection failed
            trip.written = True
            reader = batch[0]
            break
        for calls in woken[1:]:  # failed: all at once
            for waiting in calls:
                waiting.wake()
        # ``done``'s callers, then the reader, in a chain: each wakes the next once it
        # is awake and has the GIL, so one woken thread at a time waits for the GIL
        # (not all of them: each would be woken again, for nothing but to sleep).
        with self._lock:
            chain = [waiting for waiting in done if waiting is not me and not waiting.gave_up]
            if reader is not None:  # never left out: it reads even when interrupted
                # after at most READER_AFTER callers: a long chain on a loaded host
                # would hold the next batch's replies (and its callers) behind it
                chain.insert(min(len(chain), self.READER_AFTER), reader)
            for one, two in pairwise(chain):
                one.after = two
        if chain:
            chain[0].wake()


def stamp(batch: list[Queued]) -> None:
    """Record that ``batch`` is written now."""
    sent = time.monotonic()
    for waiting in batch:
        waiting.sent = sent


def _describe(error: BaseException | None) -> str:
    return f"{type(error).__name__}: {error}"
