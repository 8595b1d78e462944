"""Concurrency limits: what ``limiter.slot`` shares between the sync and asyncio
limiters, with no I/O in it.

How it works: docs/internals.md, section ``gateway_limiter.core.slots``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from gateway_limiter.backends.base import BackendError, Heard, Listener
from gateway_limiter.backends.scripts import Commands, ScriptCall
from gateway_limiter.backends.slots import (
    QUEUED,
    TAKEN,
    SlotReply,
    parse_grant,
    release_call,
    renew_call,
    take_call,
)
from gateway_limiter.config.rules import Rule
from gateway_limiter.config.settings import Settings
from gateway_limiter.core.clock import SYSTEM_CLOCK, Clock
from gateway_limiter.core.decision import Decision, Reason
from gateway_limiter.core.failure import FailurePolicy
from gateway_limiter.core.pipeline import LimiterCore, Outcome, allowed_wait_s
from gateway_limiter.core.steps import (
    Ask,
)
from gateway_limiter.errors import Refused
from gateway_limiter.observe.logs import log
from gateway_limiter.observe.metrics import ProcessMetrics

#: The longest a waiter goes without asking Redis again: its place in the queue lapses
#: after twice this, so a waiter that died holds up the queue no longer than that.
ASK_AGAIN_S = 1.0
#: Without a subscriber (a failed subscription): how often a waiter asks again.
UNHEARD_ASK_S = 0.02


class Wakeups:
    """A generation per interface, for slots counted in this process (``LocalSlots``): a
    waiter notes it, tries, and waits for it to move.

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

    def _moved(self, url: str, seen: tuple[int, int]) -> bool:
        return self.generation(url) != seen

    def wait(self, url: str, seen: tuple[int, int], timeout_s: float) -> None:
        """Block until ``url``'s generation moved since ``seen`` (or every interface's
        did), at most ``timeout_s``."""
        with self._changed:
            self._changed.wait_for(lambda: self._moved(url, seen), timeout_s)

    async def wait_async(self, url: str, seen: tuple[int, int], timeout_s: float) -> None:
        """``wait``, awaited on the running loop."""
        event = asyncio.Event()
        waiter = (asyncio.get_running_loop(), event)
        with self._changed:
            if self._moved(url, seen):
                return
            self._loops.setdefault(url, set()).add(waiter)
        try:
            with contextlib.suppress(TimeoutError):  # the loop keeps the deadline
                await asyncio.wait_for(self._moving(url, seen, event), timeout_s)
        finally:
            with self._changed:
                waiters = self._loops.get(url)
                if waiters is not None:
                    waiters.discard(waiter)
                    if not waiters:
                        del self._loops[url]

    async def _moving(self, url: str, seen: tuple[int, int], event: asyncio.Event) -> None:
        while not self._moved(url, seen):
            event.clear()
            if self._moved(url, seen):
                return
            await event.wait()


class Waiter:
    """One caller queued for a slot in Redis: woken by the grant that names it (a release
    handed it the slot and a permit, or the rate refused it: ``granted``), or to ask
    again (the subscription was lost: a grant may have gone unheard)."""

    __slots__ = ("_event", "_loop", "_woken", "granted")

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop
        self._event = threading.Event()
        self._woken = asyncio.Event() if loop is not None else None
        #: what the grant said (the caller's take, answered by a release)
        self.granted: SlotReply | None = None

    def wake(self, granted: SlotReply | None) -> None:
        """From the subscriber's thread: ``granted`` (None: only ask again)."""
        if granted is not None:
            self.granted = granted
        if self._woken is None:
            self._event.set()
        else:
            assert self._loop is not None
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits there
                self._loop.call_soon_threadsafe(self._woken.set)

    def claim(self) -> SlotReply | None:
        """The grant heard for this caller, once (None: none yet)."""
        granted, self.granted = self.granted, None
        return granted

    def wait(self, timeout_s: float) -> None:
        """Block until woken, at most ``timeout_s`` (a wake before this is not lost)."""
        self._event.wait(timeout_s)
        self._event.clear()

    async def wait_async(self, timeout_s: float) -> None:
        """``wait``, awaited on the waiter's loop."""
        assert self._woken is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._woken.wait(), timeout_s)
        self._woken.clear()


class Moved:
    """``url``'s generation moving on from ``seen`` (``Wakeups``): what a caller with no
    local slot free waits for."""

    __slots__ = ("seen", "url", "wakeups")

    def __init__(self, wakeups: Wakeups, url: str, seen: tuple[int, int]) -> None:
        self.wakeups, self.url, self.seen = wakeups, url, seen

    def wait(self, seconds: float) -> None:
        """Block until it moved, at most ``seconds``."""
        self.wakeups.wait(self.url, self.seen, seconds)

    async def wait_async(self, seconds: float) -> None:
        """``wait``, awaited."""
        await self.wakeups.wait_async(self.url, self.seen, seconds)


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


#: Where a lease lives: the interface, and the capped channel whose hash tag its keys
#: carry (``backends/slots.slot_keys``; None: the interface's own).
Where = tuple[str, str | None]


class Leases:
    """The leases this process holds in Redis, per interface: what the renewer renews."""

    __slots__ = ("_held", "_ids", "_lock", "_process")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[Where, set[str]] = {}
        # unique across the fleet: the host's pid may repeat on another host
        self._process = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._ids = itertools.count(1)

    def new_id(self) -> str:
        """A lease id no other call in the fleet has."""
        return f"{self._process}-{next(self._ids)}"

    def add(self, where: Where, lease_id: str) -> None:
        """``lease_id`` is held ``where``: renew it until ``remove``."""
        with self._lock:
            self._held.setdefault(where, set()).add(lease_id)

    def remove(self, where: Where, lease_id: str) -> None:
        """``lease_id`` is given back (or abandoned): stop renewing it."""
        with self._lock:
            held = self._held.get(where)
            if held is not None:
                held.discard(lease_id)
                if not held:
                    del self._held[where]

    def held(self) -> dict[Where, list[str]]:
        """Every interface's leases held now (a copy, for one round of renewals)."""
        with self._lock:
            return {where: sorted(ids) for where, ids in self._held.items()}

    def on(self, url: str) -> int:
        """The leases held now on ``url`` (under any hash tag)."""
        with self._lock:
            return sum(len(ids) for (held, _), ids in self._held.items() if held == url)


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
    #: the interface's cap as the slot was taken (a release hands slots on up to it)
    max_concurrent: int = 0
    #: seconds to wait for the rate permit before the call goes
    wait_s: float = 0.0
    #: the capped channel whose hash tag the slot's keys carry (None: the interface's)
    channel: str | None = None


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


@dataclass(slots=True)
class Taking:
    """One ``slot()`` call on a capped interface while it takes its slot: what the
    threaded and asyncio limiters' loops share (they only do the I/O and the waits)."""

    rule: Rule
    key: str | None
    lease_id: str
    #: when the wait budget ends (monotonic s)
    deadline: float
    #: the wait budget (s): what a refusal says it waited for
    budget_s: float
    #: a place in the queue (or a slot) is held in Redis: give it up when leaving early
    placed: bool = False
    #: counted in the metrics as a call that had to wait
    waited: bool = False
    #: the limiter's clock, which ``deadline`` is on
    clock: Clock = SYSTEM_CLOCK

    def remaining(self) -> float:
        """Seconds left of the wait budget."""
        return max(0.0, self.deadline - self.clock.monotonic())

    def _queued_s(self) -> float:
        """Seconds this call has waited for its slot so far (0 when it never queued)."""
        if not self.waited:
            return 0.0
        return max(0.0, self.clock.monotonic() - (self.deadline - self.budget_s))

    def _refused(self, decision: Decision, no_slot: bool) -> Refused:
        return refused(self.rule.url, self.rule.max_concurrent, decision, self.budget_s, no_slot)

    def call(self, state: SlotState, settings: Settings, remaining: float) -> ScriptCall:
        """The take to send now: a place in the queue only with time left to wait."""
        return take_call(
            state.commands,
            settings.key_prefix,
            self.rule,
            remaining,
            self.key,
            self.lease_id,
            settings.slot_lease,
            2 * ASK_AGAIN_S if remaining > 0 else 0.0,  # 0: no place, no wait
        )

    def must_wait(self, metrics: ProcessMetrics | None) -> None:
        """No slot now: count the wait (once)."""
        if not self.waited:
            self.waited = True
            count_wait(metrics, self.rule.url)

    def answered(
        self, core: LimiterCore, state: SlotState, reply: SlotReply, remaining: float
    ) -> Held | None:
        """A take's reply (or a grant heard): the slot, leased and to be renewed (sleep
        its ``wait_s`` before the call), or None when queued (wait for a grant for
        ``pause_s``). Raises ``Refused`` when the rate refused, or when queued with no
        time left."""
        url = self.rule.url
        state.seen[url] = reply.in_flight
        # the script gives a place only to a caller with time to wait, and keeps it
        # until the caller takes a slot or gives up
        queued = reply.state == QUEUED and (remaining > 0 or self.placed)
        self.placed = reply.state == TAKEN or queued
        if reply.state == QUEUED:
            if remaining <= 0:
                count_refusal(core._metrics, url)
                raise self._refused(busy(self.rule, reply.in_flight, reply.lapses_s), True)
            self.must_wait(core._metrics)
            return None
        assert reply.verdict is not None
        outcome = core._finish(Ask(self.rule, 1, remaining, self.key, None), reply.verdict)
        decision = core._decision(outcome, remaining)
        if not outcome[0].allowed:
            count_refusal(core._metrics, url)
            raise self._refused(decision._replace(in_flight=reply.in_flight), False)
        # waited: the queue's seconds, then the rate's (slept before the call goes)
        decision = decision._replace(
            in_flight=reply.in_flight, waited=self._queued_s() + decision.waited
        )
        channel = self.rule.channel
        state.leases.add((url, channel), self.lease_id)
        cap = self.rule.max_concurrent or 0
        wait_s = allowed_wait_s(outcome[0])
        return Held(url, decision, self.lease_id, False, cap, wait_s, channel)

    def no_local_slot(self, core: LimiterCore, state: SlotState, remaining: float) -> None:
        """No slot free in this process: ``Refused`` when no time is left, else count
        the wait (a local release, or the breaker's next probe, wakes the caller)."""
        if remaining <= 0:
            count_refusal(core._metrics, self.rule.url)
            busy_now = busy(self.rule, state.local.in_flight(self.rule.url), None)
            raise self._refused(busy_now, True)
        self.must_wait(core._metrics)

    def local_answered(
        self,
        core: LimiterCore,
        state: SlotState,
        outcome: Outcome,
        remaining: float,
        cap: int | None,
    ) -> Held:
        """The rate's outcome for a slot taken in this process (``cap`` None: no cap,
        none taken); ``Refused`` gives the slot back."""
        url = self.rule.url
        decision = core._decision(outcome, remaining)
        decision = decision._replace(
            in_flight=state.local.in_flight(url), waited=self._queued_s() + decision.waited
        )
        if not outcome[0].allowed:
            if cap is not None:
                state.local.give_back(url)
            count_refusal(core._metrics, url)
            raise self._refused(decision._replace(waited=0.0), False)
        return Held(url, decision, local=cap is not None, wait_s=allowed_wait_s(outcome[0]))


def _seconds(value: float) -> str:
    """Seconds as a message shows them: "0.15", "2" (to the ms)."""
    return f"{value:.3f}".rstrip("0").rstrip(".")


def refused(
    url: str, cap: int | None, decision: Decision, budget_s: float, no_slot: bool = False
) -> Refused:
    """The ``Refused`` of a ``slot()`` call on ``url``, saying why: no free slot, or no
    rate permit, within the call's wait budget ``budget_s``, and (on an interface capped
    at ``cap``) the calls in flight against it. E.g. "/slow/book: no free slot within
    0.15 s (2/2 in flight)"."""
    if no_slot:
        why = f"no free slot within {_seconds(budget_s)} s"
    elif decision.reason == Reason.LIMITED:
        why = f"no rate permit within {_seconds(budget_s)} s"
    elif decision.reason == Reason.CLOSED:
        why = "closed (rateLimit 0)"
    else:
        why = f"refused ({decision.reason})"
    if cap is not None and decision.in_flight is not None:
        why += f" ({decision.in_flight}/{cap} in flight)"
    return Refused(decision, f"{url}: {why}")


def given_up(rule: Rule, lease_id: str) -> Held:
    """What a caller that gave up waiting gives back: its place in the queue, or the slot
    a release may have just handed it (passed on to the next caller)."""
    refusal = busy(rule, None, None)
    return Held(rule.url, refusal, lease_id, False, rule.max_concurrent or 0, 0.0, rule.channel)


def count_wait(metrics: ProcessMetrics | None, url: str) -> None:
    """A ``slot()`` call on ``url`` had to queue for a slot."""
    if metrics is not None:
        metrics.slot_waits.labels(interface=url).inc()


def count_refusal(metrics: ProcessMetrics | None, url: str) -> None:
    """A ``slot()`` call on ``url`` was refused."""
    if metrics is not None:
        metrics.slot_refusals.labels(interface=url).inc()


def pause_s(remaining_s: float, lapses_s: float, listening: bool) -> float:
    """How long a queued waiter waits for its grant before asking again."""
    pause = min(remaining_s, ASK_AGAIN_S if listening else UNHEARD_ASK_S)
    if lapses_s > 0:
        pause = min(pause, lapses_s + 0.002)  # just past the lapse, on a loaded host
    return max(0.0, pause)


class SlotState:
    """One limiter's slots: its waiters, local slots, leases held, what it last saw in
    flight, and its one subscriber (started with the first slot asked for)."""

    __slots__ = (
        "_lease_s",
        "_lock",
        "_prefix",
        "_subscribed",
        "_subscriber",
        "_waiters",
        "commands",
        "leases",
        "local",
        "seen",
        "wakeups",
    )

    def __init__(self, settings: Settings) -> None:
        self._prefix = settings.key_prefix
        self._lease_s = settings.slot_lease
        #: the decision scripts' calls, which ``slot.lua`` wraps
        self.commands = Commands(settings.key_prefix)
        self.wakeups = Wakeups()
        self.local = LocalSlots(self.wakeups)
        self.leases = Leases()
        #: interface -> calls in flight fleet-wide as the last reply said
        self.seen: dict[str, int] = {}
        self._lock = threading.Lock()
        self._subscriber: Listener | None = None
        self._subscribed = False
        #: lease id -> this process's caller queued under it
        self._waiters: dict[str, Waiter] = {}

    def give_back(self, held: Held) -> ScriptCall | None:
        """Give back ``held``'s slot: at once when it is this process's, else the
        release to send (None: nothing to give back)."""
        if held.local:
            self.local.give_back(held.url)
            return None
        if held.lease_id is None:
            return None
        self.leases.remove((held.url, held.channel), held.lease_id)
        return release_call(
            self._prefix,
            held.url,
            held.lease_id,
            held.max_concurrent,
            self._lease_s,
            held.channel,
        )

    def renewals(self) -> list[ScriptCall]:
        """The renewals of every lease held: one call per interface."""
        return [
            renew_call(self._prefix, url, ids, self._lease_s, channel)
            for (url, channel), ids in self.leases.held().items()
        ]

    def count_call(self, rule: Rule) -> ScriptCall:
        """The call that counts ``rule``'s calls in flight fleet-wide (renewing nothing)."""
        return renew_call(self._prefix, rule.url, [], self._lease_s, rule.channel)

    def counted(self, url: str, reply: tuple[int, int] | BackendError) -> int | None:
        """A release's or count's reply: the calls in flight fleet-wide (None: failed)."""
        if isinstance(reply, BackendError):
            return None
        self.seen[url] = reply[1]
        return reply[1]

    def waiter(self, lease_id: str, loop: asyncio.AbstractEventLoop | None = None) -> Waiter:
        """Listen for grants to ``lease_id`` (before its first take: a grant may follow
        the take's reply at once) until ``forget``."""
        listening = self._waiters[lease_id] = Waiter(loop)
        return listening

    def forget(self, lease_id: str) -> None:
        """``lease_id``'s caller has its slot, or gave up: stop listening for it."""
        self._waiters.pop(lease_id, None)

    def heard(self, message: bytes | None) -> None:
        """From the subscriber: a grant (wake the one waiter it names, when it is here),
        or None after a lost subscription (wake every waiter to ask again)."""
        if message is None:
            self.wakeups.notify(None)
            for waiter in list(self._waiters.values()):
                waiter.wake(None)
            return
        named = self._waiters.get(message.partition(b"\n")[0].decode("utf-8", "replace"))
        if named is None:  # another process's caller, or one that gave up
            return
        try:
            named.wake(parse_grant(message)[1])
        except BackendError as e:
            log.warning("%s", e)
            named.wake(None)

    @property
    def subscribed(self) -> bool:
        """True once ``subscribe`` has been called (whether or not it could listen)."""
        return self._subscribed

    @property
    def listening(self) -> bool:
        """True while the subscriber hears grants (waiters need not ask often)."""
        return self._subscriber is not None and self._subscriber.listening

    def subscribe(self, listen: Callable[[Heard], Listener | None]) -> None:
        """Start the subscriber once: ``listen(heard)`` (the shell's: its backend's
        ``subscribe``) starts hearing grants and returns what listens, or
        None when none can (waiters then ask again every UNHEARD_ASK_S instead)."""
        if self._subscribed:
            return
        with self._lock:
            if self._subscribed:
                return
            self._subscribed = True
            self._subscriber = listen(self.heard)

    def close(self) -> None:
        """Stop the subscriber."""
        with self._lock:
            subscriber, self._subscriber = self._subscriber, None
        if subscriber is not None:
            subscriber.stop()
