"""Concurrency limits: what ``limiter.slot`` shares between the sync and asyncio
limiters, with no I/O in it.

A row's ``maxConcurrent`` caps the calls to its interface in flight across the fleet.
``slot(url)`` takes a rate permit and a slot together (``backends/slots.py``: one
script call), holds the slot while the block runs, and gives it back after (a second
call): two round trips in all. A slot is a lease (``slot_lease`` seconds on the Redis
server's clock) that this process renews while the call lasts (``Leases``, renewed by
one background renewer per limiter), so a process that dies loses its slots within a
lease.

Waiting: a caller that finds no slot free is queued in Redis (a ticket: slots go in
arrival order across the fleet) and waits here until its interface's generation moves
(``Wakeups``): the process's one subscriber hears each release announced and moves it,
so a waiter asks again within a round trip of the release. A waiter also asks again
when the first lease would lapse (a crashed holder announces nothing) and before its
place in the queue lapses.

While Redis cannot be asked, ``on_backend_error`` decides the slots as it decides the
rate (``fallback_cap``), in this process (``LocalSlots``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import threading
import time
import uuid
from dataclasses import dataclass

from gateway_limiter.backends.scripts import Commands
from gateway_limiter.backends.slot_wakeups import Subscriber, subscriber_client
from gateway_limiter.config.rules import Rule
from gateway_limiter.config.settings import Settings
from gateway_limiter.core.decision import Decision, Reason
from gateway_limiter.core.failure import FailurePolicy
from gateway_limiter.observe.metrics import ProcessMetrics

#: The longest a waiter goes without asking Redis again: its place in the queue lapses
#: after twice this, so a waiter that died holds up the queue no longer than that.
ASK_AGAIN_S = 1.0
#: Without a subscriber (a failed subscription): how often a waiter asks again.
UNHEARD_ASK_S = 0.02


class Wakeups:
    """A generation per interface: a waiter notes it, asks, and waits for it to move.

    Noting it before asking means a release announced between the reply and the wait
    is never missed. ``notify(None)`` moves every interface's (a reconnection).
    """

    __slots__ = ("_all", "_changed", "_generations", "_loops")

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._generations: dict[str, int] = {}
        self._all = 0
        #: url -> asyncio waiters (their loop and event) of the asyncio limiter
        self._loops: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}

    def generation(self, url: str) -> tuple[int, int]:
        """``url``'s generation now."""
        return self._generations.get(url, 0), self._all

    def notify(self, url: str | None) -> None:
        """A slot of ``url`` (None: of any interface) may be free: wake its waiters."""
        with self._changed:
            if url is None:
                self._all += 1
                waiting = [w for ws in self._loops.values() for w in ws]
            else:
                self._generations[url] = self._generations.get(url, 0) + 1
                waiting = list(self._loops.get(url, ()))
            self._changed.notify_all()
        for loop, event in waiting:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits there
                loop.call_soon_threadsafe(event.set)

    def _moved(self, url: str, seen: tuple[int, int], need: int) -> bool:
        releases, everything = self.generation(url)
        return releases - seen[0] >= need or everything != seen[1]

    def wait(self, url: str, seen: tuple[int, int], timeout_s: float, need: int = 1) -> None:
        """Block until ``need`` releases of ``url`` were heard since ``seen`` (or every
        interface's generation moved), at most ``timeout_s``."""
        with self._changed:
            self._changed.wait_for(lambda: self._moved(url, seen, need), timeout_s)

    async def wait_async(
        self, url: str, seen: tuple[int, int], timeout_s: float, need: int = 1
    ) -> None:
        """``wait``, awaited on the running loop."""
        deadline = time.monotonic() + timeout_s
        event = asyncio.Event()
        waiter = (asyncio.get_running_loop(), event)
        with self._changed:
            if self._moved(url, seen, need):
                return
            self._loops.setdefault(url, set()).add(waiter)
        try:
            while not self._moved(url, seen, need):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                event.clear()
                if self._moved(url, seen, need):
                    return
                try:
                    await asyncio.wait_for(event.wait(), remaining)
                except TimeoutError:
                    return
        finally:
            with self._changed:
                waiters = self._loops.get(url)
                if waiters is not None:
                    waiters.discard(waiter)
                    if not waiters:
                        del self._loops[url]


class LocalSlots:
    """Slots counted in this process: ``memory://``, and the failure policy's while
    Redis is away. A slot given back wakes the interface's waiters."""

    __slots__ = ("_held", "_lock", "_wakeups")

    def __init__(self, wakeups: Wakeups) -> None:
        self._wakeups = wakeups
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}

    def take(self, url: str, cap: int) -> bool:
        """Take one of ``cap`` slots of ``url`` if one is free."""
        with self._lock:
            held = self._held.get(url, 0)
            if held >= cap:
                return False
            self._held[url] = held + 1
            return True

    def give_back(self, url: str) -> None:
        """Give back a slot taken with ``take``."""
        with self._lock:
            held = self._held.get(url, 0) - 1
            if held > 0:
                self._held[url] = held
            else:
                self._held.pop(url, None)
        self._wakeups.notify(url)

    def in_flight(self, url: str) -> int:
        """Slots of ``url`` held here now."""
        return self._held.get(url, 0)


class Leases:
    """The leases this process holds in Redis, per interface: what the renewer renews."""

    __slots__ = ("_held", "_ids", "_lock", "_process")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, set[str]] = {}
        # unique across the fleet: the host's pid may repeat on another host
        self._process = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._ids = itertools.count(1)

    def new_id(self) -> str:
        """A lease id no other call in the fleet has."""
        return f"{self._process}-{next(self._ids)}"

    def add(self, url: str, lease_id: str) -> None:
        """``lease_id`` of ``url`` is held: renew it until ``remove``."""
        with self._lock:
            self._held.setdefault(url, set()).add(lease_id)

    def remove(self, url: str, lease_id: str) -> None:
        """``lease_id`` is given back (or abandoned): stop renewing it."""
        with self._lock:
            held = self._held.get(url)
            if held is not None:
                held.discard(lease_id)
                if not held:
                    del self._held[url]

    def held(self) -> dict[str, list[str]]:
        """Every interface's leases held now (a copy, for one round of renewals)."""
        with self._lock:
            return {url: sorted(ids) for url, ids in self._held.items()}


def fallback_cap(policy: FailurePolicy, rule: Rule, fleet_size: int) -> int | None:
    """The slots of ``rule`` this process may hold while Redis is away (None: no cap).

    ``local``: all of ``maxConcurrent``, in every process. ``share``: ``maxConcurrent /
    N`` rounded down (so N processes together stay within it), but at least 1: with
    more processes than slots an interface would otherwise close during an outage, so
    then the fleet may have up to N in flight. N unknown (0): as ``local``. ``allow``:
    no cap. ``deny`` refuses before a slot is asked for.
    """
    cap = rule.max_concurrent
    if cap is None or policy is FailurePolicy.ALLOW:
        return None
    if policy is FailurePolicy.SHARE and fleet_size > 1:
        return max(1, math.floor(cap / fleet_size))
    return cap


@dataclass(slots=True)
class Held:
    """A slot taken by ``slot()``: where it is held, and the decision that took it."""

    url: str
    decision: Decision
    #: the lease in Redis (None: held locally, or no slot at all)
    lease_id: str | None = None
    local: bool = False


#: The most a refused ``slot()`` tells a caller to wait before trying again (s).
BUSY_RETRY_AFTER_S = 1.0


def busy(rule: Rule, in_flight: int | None, lapses_s: float | None) -> Decision:
    """The Decision of a ``slot()`` that found no slot free within its wait budget.

    A slot frees when a call in flight ends, which nobody can foresee; the first lease's
    lapse is only the latest moment a crashed holder's slot comes back (``slot_lease``
    away, 10 s by default). So ``retry_after`` says "soon": that moment, but at most
    ``BUSY_RETRY_AFTER_S``, never a lease's length for a slot that frees in 50 ms."""
    return Decision(
        False,
        Reason.LIMITED,
        retry_after=None if not lapses_s else min(lapses_s, BUSY_RETRY_AFTER_S),
        limit=rule.rate,
        effective_rate=float(rule.rate),
        in_flight=in_flight,
    )


def count_wait(metrics: ProcessMetrics | None, url: str) -> None:
    """A ``slot()`` call on ``url`` had to queue for a slot."""
    if metrics is not None:
        metrics.slot_waits.labels(interface=url).inc()


def count_refusal(metrics: ProcessMetrics | None, url: str) -> None:
    """A ``slot()`` call on ``url`` was refused."""
    if metrics is not None:
        metrics.slot_refusals.labels(interface=url).inc()


def pause_s(remaining_s: float, lapses_s: float, heard: bool) -> float:
    """How long a queued waiter waits for an announcement before asking again."""
    pause = min(remaining_s, ASK_AGAIN_S if heard else UNHEARD_ASK_S)
    if lapses_s > 0:
        pause = min(pause, lapses_s + 0.002)  # just past the lapse, on a loaded host
    return max(0.0, pause)


class SlotState:
    """One limiter's slots: its waiters, local slots, leases held, what it last saw in
    flight, and its one subscriber (started with the first slot asked for)."""

    __slots__ = (
        "_lock",
        "_subscribed",
        "_subscriber",
        "commands",
        "leases",
        "local",
        "seen",
        "wakeups",
    )

    def __init__(self, prefix: str) -> None:
        #: the decision scripts' calls, which ``slot.lua`` wraps
        self.commands = Commands(prefix)
        self.wakeups = Wakeups()
        self.local = LocalSlots(self.wakeups)
        self.leases = Leases()
        #: interface -> calls in flight fleet-wide as the last reply said
        self.seen: dict[str, int] = {}
        self._lock = threading.Lock()
        self._subscriber: Subscriber | None = None
        self._subscribed = False

    @property
    def subscribed(self) -> bool:
        """True once ``subscribe`` has been called (whether or not it could listen)."""
        return self._subscribed

    @property
    def heard(self) -> bool:
        """True while the subscriber hears announcements (waiters need not ask often)."""
        return self._subscriber is not None and self._subscriber.listening

    def subscribe(self, settings: Settings, decisions_client: object) -> None:
        """Start the subscriber once (waits up to a connect and a read for it)."""
        if self._subscribed:
            return
        with self._lock:
            if self._subscribed:
                return
            self._subscribed = True
            try:
                client = subscriber_client(settings, decisions_client)
            except (ValueError, OSError):
                client = None
            if client is None:  # waiters ask again every UNHEARD_ASK_S instead
                return
            self._subscriber = Subscriber(settings, lambda: client, self.wakeups.notify)
            self._subscriber.start(settings.redis_connect_timeout + settings.redis_timeout)

    def close(self) -> None:
        """Stop the subscriber."""
        with self._lock:
            subscriber, self._subscriber = self._subscriber, None
        if subscriber is not None:
            subscriber.stop()
