"""``GatewayLimiter``: the facade every gateway process calls before an upstream call.

The decision path itself (routing, the failure policy and its circuit breaker, local
refusals, shadow rules, metrics) is ``gateway_limiter.core.pipeline.LimiterCore``,
shared with the asyncio limiter (``gateway_limiter.aio``). This class is the core's
threaded I/O shell: it calls the backend and sleeps with ``time.sleep``.
``decide`` returns a decision as a ``Decision``; ``try_acquire`` is its ``allowed``.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any, ClassVar, Self, TypeVar

from gateway_limiter.backends.base import Backend, BackendError
from gateway_limiter.backends.memory import MemoryBackend
from gateway_limiter.backends.schemes import open_backend
from gateway_limiter.backends.scripts import ScriptCall
from gateway_limiter.backends.slot_wakeups import listen
from gateway_limiter.backends.slots import (
    parse_counts,
)
from gateway_limiter.config.reload import ReloadSummary
from gateway_limiter.config.rules import Rule
from gateway_limiter.config.settings import Settings
from gateway_limiter.core.decision import Decision
from gateway_limiter.core.failure import attempt
from gateway_limiter.core.pipeline import (
    LimiterCore,
    Outcome,
    allowed_wait_s,
    check_args,
    route,
    slot_rule,
)
from gateway_limiter.core.slots import (
    Held,
    SlotState,
    Taking,
    given_up,
    refused,
    take_slot,
)
from gateway_limiter.core.status import BucketStatus, chosen, describe_interface
from gateway_limiter.core.steps import (
    Ask,
    Await,
    Reserve,
    Send,
    StartRenewer,
    Step,
    Steps,
    Subscribe,
)
from gateway_limiter.errors import NotStarted
from gateway_limiter.lifecycle import THREADED, unwatch, watch
from gateway_limiter.model.bucket import US_PER_S, Verdict

__all__ = ["GatewayLimiter"]

T = TypeVar("T")


class GatewayLimiter(LimiterCore):
    """Fleet-wide rate limits for one gateway process.

    >>> with GatewayLimiter(database_url="sqlite:///limits.db") as limiter:  # doctest: +SKIP
    ...     if limiter.try_acquire("/ibe/flight/search"):
    ...         call_supplier()

    Keywords are settings (see docs/design.md) and override the file and environment.
    """

    _NOT_STARTED: ClassVar[str] = "call start() (or use 'with GatewayLimiter(...)') first"
    backend: Backend
    _heartbeats: threading.Thread | None = None
    _stop_beating: threading.Event | None = None

    _renewer: threading.Thread | None = None

    @staticmethod
    def _in_process() -> Backend:
        return MemoryBackend()

    def _open_backend(self, settings: Settings) -> bool:
        self.backend = open_backend(settings)
        self._slotting = SlotState(settings)
        self._renewing = threading.Lock()
        self._stop_renewing = threading.Event()
        return self.backend.shared

    def start(self) -> ReloadSummary:
        """Load the limits now, then reload every ``reload_interval`` seconds."""
        self._starting()
        failure = attempt(self.backend.prepare)
        self._prepared(failure)
        if self._shared:
            if failure is None:  # know N from the start: one round trip, here, once
                fleet = self._fleet
                demand = fleet.demand(self.registry.snapshot.rules)
                self._beat(attempt(self.backend.heartbeat, fleet.member, fleet.ttl_ms, demand))
            self._start_heartbeats()
        watch(self, THREADED)  # a fork restarts it in the child (lifecycle.py)
        return self._running(self.registry.start())

    def _start_heartbeats(self) -> None:
        """Renew this process's fleet membership every ``fleet_heartbeat`` s on a daemon
        thread: never on a decision's path (``core/fleet.py``)."""
        stop = self._stop_beating = threading.Event()
        fleet, backend = self._fleet, self.backend

        def beat() -> None:
            while not stop.wait(fleet.heartbeat_s):
                demand = fleet.demand(self.registry.snapshot.rules)
                tallies = self._tallies()
                self._beat(attempt(backend.heartbeat, fleet.member, fleet.ttl_ms, demand, tallies))
                for rule, permits in self._charges():  # after an outage, off the decision path
                    if not isinstance(attempt(backend.reserve, rule, permits, None), BackendError):
                        fleet.charged += permits
                for call in self._lease_returns():  # leases a reload ended
                    attempt(backend.script, call)

        self._heartbeats = threading.Thread(target=beat, name="gateway-limiter-fleet", daemon=True)
        self._heartbeats.start()

    def _stop_heartbeats(self) -> None:
        """Stop beating and leave the fleet at once (best effort), so N drops now rather
        than when this member would have expired."""
        if self._stop_beating is None or self._heartbeats is None:
            return
        self._stop_beating.set()
        self._heartbeats.join()  # a heartbeat in flight ends within Redis' timeouts
        self._stop_beating = self._heartbeats = None
        if self.backend_healthy:
            attempt(self.backend.heartbeat, self._fleet.member, 0)

    def reload(self) -> ReloadSummary:
        """Reload the limits now; the last good limits stay if the database fails."""
        return self.registry.reload()

    def close(self) -> None:
        """Stop reloading and close connections. Decisions after this raise NotStarted."""
        unwatch(self)
        self._stopping()
        for call in self._lease_returns(closing=True):  # best effort: else they expire
            attempt(self.backend.script, call)
        self._stop_heartbeats()
        self._stop_renewer()
        self.registry.close()
        self.backend.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _ask_backend(self, step: Outcome | Ask) -> Outcome:
        # A decision's one backend round trip (when ``_begin`` left one to make).
        if type(step) is not Ask:
            return step  # type: ignore[return-value]
        if step.lease is None and not step.renewing:  # a plain decision: bucket.lua
            return self._finish(step, self._reserve(step))
        return self._run(self._leasing(step))

    def _reserve(self, ask: Ask) -> Verdict | BackendError:
        try:
            return self.backend.reserve(ask.rule, ask.permits, ask.budget_s, ask.key)
        except BackendError as e:
            return e

    def _run(self, steps: Steps[T]) -> T:
        """Carry out the engine's steps (``core/steps.py``) until it answers."""
        got: Any = None
        try:
            while True:
                got = self._carry_out(steps.send(got))
        except StopIteration as done:
            answer: T = done.value
            return answer

    def _carry_out(self, step: Step) -> Any:
        match step:
            case Reserve(ask):
                return self._reserve(ask)
            case Send(call, parse):
                return attempt(self._slot_script, call, parse)
            case Await(until, seconds):
                until.wait(seconds)
            case Subscribe():
                self._slotting.subscribe(
                    functools.partial(listen, self.settings, self.backend.client)
                )
            case StartRenewer():
                self._start_renewer()
        return None

    def reserve(
        self, url: str, permits: int = 1, timeout: float | None = None, key: str | None = None
    ) -> Verdict:
        """Decide without sleeping: the verdict, whose ``wait_us`` the caller must honour.

        ``timeout=None`` here means the row's ``cache``; ``key`` is the caller, for
        per-caller limits. A shadow rule's verdict is always allowed, with no wait.
        """
        return self._ask_backend(self._begin(url, permits, timeout, key))[0]

    def try_acquire(
        self, url: str, permits: int = 1, timeout: float | None = None, key: str | None = None
    ) -> bool:
        """Take ``permits`` for ``url`` if the wait fits in ``timeout`` (default: the row's
        ``cache``): wait, then True. Otherwise False at once, with nothing reserved.

        ``key`` names the caller (an IP, a channel): rows with ``perCaller = 1`` give
        each key its own limits; other rows ignore it. Always ``decide(...).allowed``,
        without building the Decision.
        """
        verdict = self._ask_backend(self._begin(url, permits, timeout, key))[0]
        if verdict.allowed and verdict.wait_us > 0:
            time.sleep(verdict.wait_us / US_PER_S)
            return True
        return verdict.allowed

    def decide(
        self, url: str, permits: int = 1, timeout: float | None = None, key: str | None = None
    ) -> Decision:
        """``try_acquire``, answering with the whole Decision: allowed or not, why, the
        seconds waited, when to retry, permits left and the limit (see ``Decision``;
        ``Decision.headers()`` gives the HTTP headers)."""
        outcome = self._ask_backend(self._begin(url, permits, timeout, key))
        if (wait_s := allowed_wait_s(outcome[0])) > 0:
            time.sleep(wait_s)
        return self._decision(outcome, timeout, permits)

    def acquire(self, url: str, permits: int = 1, key: str | None = None) -> float:
        """Take ``permits`` for ``url`` however long it takes; returns the seconds waited.

        Raises InterfaceClosed for a closed interface (it would never return), and
        ValueError for more permits than a window of the interface can ever hold. A
        shadow rule returns 0.0 at once (its wait and refusals are only counted).
        """
        wait_s = self._acquired(
            url, permits, self._ask_backend(self._begin(url, permits, None, key, forever=True))
        )
        if wait_s > 0:
            time.sleep(wait_s)
        return wait_s

    def pushback(self, url: str, retry_after: float | None = None, key: str | None = None) -> None:
        """The supplier refused or failed a call on ``url`` (HTTP 429/503, a timeout):
        tell the whole fleet, in one round trip; every process obeys it from its next
        decision on.

        ``retry_after`` seconds: no call on ``url`` goes before now + ``retry_after`` (the
        Redis server's clock); callers whose wait budget cannot reach it are refused.
        None: the interface's effective rate halves (not below a tenth of the row's
        rate; once per second however many 429s come), then recovers by 5 % of the row's
        rate per second. ``key``: the caller, for per-caller limits. Nothing happens on
        an interface that is not limited; a Redis failure is logged, never raised.
        """
        push = self._begin_pushback(url, retry_after, key)
        if push is not None:
            reply = attempt(self.backend.pushback, push.rule, push.retry_after, push.key)
            self._pushed(push, reply)

    def status(self, url: str | None = None) -> list[BucketStatus]:
        """Every limit in force (or ``url``'s) with its live state (shared buckets),
        what the supplier's pushbacks left (the hold, the effective rate) and, on an
        interface's first limit, its calls in flight."""
        states = [
            shown
            for interface, limits in chosen(self.registry, url)
            for shown in describe_interface(interface, limits, self.backend)
        ]
        return [self._with_in_flight(s) for s in states]

    def _with_in_flight(self, state: BucketStatus) -> BucketStatus:
        """``state`` with its interface's calls in flight, on its first limit only."""
        rule = self.registry.snapshot.rules.get(state.rule.url)
        if rule is None or rule.config_id != state.rule.config_id or rule.max_concurrent is None:
            return state
        return dataclasses.replace(state, in_flight=self.in_flight(rule.url))

    # --- concurrency: slot() (core/slots.py explains the design) ----------------------

    @contextmanager
    def slot(
        self, url: str, timeout: float | None = None, key: str | None = None
    ) -> Iterator[Decision]:
        """Hold one of ``url``'s ``maxConcurrent`` slots (fleet-wide) while the block runs.

        Waits up to ``timeout`` seconds (default: the row's ``cache``) for a rate permit
        and a free slot together; raises ``Refused`` (with the Decision) when both cannot
        be had in time. The slot is given back when the block ends, however it ends.
        Yields the Decision (``in_flight``: calls in flight, this one included).
        An interface without ``maxConcurrent`` (or a shadow row) is decided as
        ``decide`` would; one that is not limited admits at once.
        """
        check_args(url, 1, timeout, key)
        if not self._started:
            raise NotStarted(self._NOT_STARTED)
        rule = route(self.registry.snapshot, url, key)
        if rule is None or rule.max_concurrent is None or rule.shadow or rule.closed:
            decision = self.decide(url, 1, timeout, key)
            if not decision.allowed:
                budget = timeout if timeout is not None or rule is None else rule.cache
                raise refused(url, None, decision, budget or 0.0)
            yield decision
            return
        held = self._take_slot(rule, rule.cache if timeout is None else timeout, key)
        try:
            yield held.decision
        finally:
            self._give_back(held)

    def _take_slot(self, rule: Rule, budget_s: float, key: str | None) -> Held:
        lease_id = self._slotting.leases.new_id()
        taking = Taking(rule, key, lease_id, time.monotonic() + budget_s, budget_s)
        waiter = self._slotting.waiter(lease_id)
        held: Held | None = None
        try:
            held = self._run(take_slot(self, self._slotting, taking, waiter))
            if held.wait_s > 0:  # the rate permit's wait, the slot held
                time.sleep(held.wait_s)
            return held
        except BaseException:
            if held is not None:  # interrupted in the rate's wait: give the slot back
                self._give_back(held)
            elif taking.placed:  # refused after waiting, or interrupted: give the place up
                self._give_back(given_up(rule, lease_id))
            raise
        finally:
            self._slotting.forget(lease_id)

    def _slot_script(self, call: ScriptCall, parse: Callable[[Any], T]) -> T:
        return parse(self.backend.script(call))

    def _in_flight_seen(self) -> dict[str, int]:
        return dict(self._slotting.seen)

    def _give_back(self, held: Held) -> None:
        """Give back a slot: one round trip; a failure leaves the lease to lapse."""
        call = self._slotting.give_back(held)
        if call is not None:
            self._slotting.counted(held.url, attempt(self._slot_script, call, parse_counts))

    def _start_renewer(self) -> None:
        """One daemon thread renewing every lease this limiter holds, every third of
        ``slot_lease``, one script call per interface."""
        if self._renewer is not None:
            return
        with self._renewing:
            if self._renewer is not None:
                return
            lease_s, stop, state = self.settings.slot_lease, self._stop_renewing, self._slotting

            def renew() -> None:
                while not stop.wait(lease_s / 3):
                    for call in state.renewals():
                        attempt(self._slot_script, call, parse_counts)

            self._renewer = threading.Thread(
                target=renew, name="gateway-limiter-leases", daemon=True
            )
            self._renewer.start()

    def _stop_renewer(self) -> None:
        self._stop_renewing.set()
        if self._renewer is not None:
            self._renewer.join()
            self._renewer = None
        self._slotting.close()

    def in_flight(self, url: str) -> int | None:
        """Calls to ``url`` in flight across the fleet now (one round trip), or None when
        its row has no ``maxConcurrent`` (or Redis cannot be asked: then this process's
        own, under the failure policy)."""
        rule = slot_rule(self.registry.snapshot, url)
        if rule is None or rule.max_concurrent is None:
            return None
        if not self._shared:
            return self._slotting.local.in_flight(url)
        call = self._slotting.count_call(rule)
        counted = self._slotting.counted(url, attempt(self._slot_script, call, parse_counts))
        return self._slotting.local.in_flight(url) if counted is None else counted
