# This file is generated from gateway_limiter/aio.py
# by scripts/generate_sync.py: do not edit it. Change aio.py
# (and the twins it uses), then run `python scripts/generate_sync.py`; CI fails while
# this file is stale (`--check`). How: docs/design.md, "One shell, two ways to wait",
# and the script's docstring.
"""``GatewayLimiter``: the facade every gateway process calls before an upstream call.

The decision path itself (routing, the failure policy and its circuit breaker, local
refusals, shadow rules, metrics) is ``gateway_limiter.core.pipeline.LimiterCore``,
shared with the asyncio limiter (``gateway_limiter.aio``). This class is the core's
threaded I/O shell: it calls the backend, sleeps with ``time.sleep``, and renews the
fleet membership and slot leases on daemon threads (``gateway_limiter.concurrency``).
``decide`` returns a decision as a ``Decision``; ``try_acquire`` is its ``allowed``.

This module is generated from ``gateway_limiter/aio.py`` by ``scripts/generate_sync.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import ClassVar, Self

from gateway_limiter import default_limiter
from gateway_limiter.backends.slots import parse_counts
from gateway_limiter.concurrency import blocking, shielded
from gateway_limiter.config.reload import ReloadSummary
from gateway_limiter.core.decision import Decision
from gateway_limiter.core.failure import attempt
from gateway_limiter.core.pipeline import (
    allowed_wait_s,
    call_class,
    check_args,
    check_priority,
    route,
    slept_s,
    slot_rule,
)
from gateway_limiter.core.slots import refused
from gateway_limiter.core.status import BucketStatus, chosen
from gateway_limiter.errors import NotStarted
from gateway_limiter.lifecycle import THREADED, unwatch, watch
from gateway_limiter.model.bucket import Verdict
from gateway_limiter.model.priority import Priority
from gateway_limiter.shell import Shell

__all__ = ["GatewayLimiter"]


class Decisions(Shell):
    """The decisions of ``GatewayLimiter``: a rate permit, waited for or not."""

    def reserve(
        self,
        url: str,
        permits: int = 1,
        timeout: float | None = None,
        key: str | None = None,
        priority: Priority | str | None = None,
    ) -> Verdict:
        """Decide without sleeping: the caller sleeps out the wait itself.

        Args:
            url: the interface: a row's ``interfaceUrl`` (the HTTP integrations pass
                the request's path).
            permits: permits this call takes, at least 1.
            timeout: the most this call may wait for its permits, seconds; None: the
                row's ``cache``; 0: never wait.
            key: the caller (an IP, a partner), for rows with ``perCaller = 1``; other
                rows ignore it.
            priority: the call's class (a ``Priority`` or its text); None: the row's
                ``priority``, else ``default``.

        Returns:
            The verdict: ``allowed``, and ``wait_us``, the microseconds the caller must
            wait before its call when allowed. A shadow rule's verdict is allowed, with
            no wait.

        Raises:
            NotStarted: the limiter was not started, or was closed.
            ValueError: a bad argument (named), or more permits than the interface can
                serve in one call; nothing is reserved.
        """
        begun = self._begin(url, permits, timeout, key, priority=priority)
        return (self._ask_backend(begun))[0]

    def try_acquire(
        self,
        url: str,
        permits: int = 1,
        timeout: float | None = None,
        key: str | None = None,
        priority: Priority | str | None = None,
    ) -> bool:
        """Take ``permits`` for ``url`` if the wait for them fits in ``timeout``.

        Waits its turn, then answers True; otherwise answers False at once, with nothing
        reserved. An interface with no enabled row is not limited: True at once. With
        asyncio, a caller cancelled while it waits gets ``CancelledError`` at once, and
        the permits it reserved stay spent.

        Args:
            url: the interface: a row's ``interfaceUrl`` (the HTTP integrations pass
                the request's path).
            permits: permits this call takes, at least 1.
            timeout: the most this call may wait for its permits, seconds; None: the
                row's ``cache``; 0: never wait.
            key: the caller (an IP, a partner), for rows with ``perCaller = 1``; other
                rows ignore it.
            priority: the call's class (a ``Priority`` or its text); None: the row's
                ``priority``, else ``default``.

        Returns:
            True once the call may go ahead; False when it may not. Always
            ``decide(...).allowed``.

        Raises:
            NotStarted: the limiter was not started, or was closed.
            ValueError: a bad argument (named), or more permits than the interface can
                serve in one call; nothing is reserved.

        Example:
            ```python
            if limiter.try_acquire("/ibe/flight/search", key=client_ip):
                call_supplier()
            ```
        """
        verdict = (self._ask_backend(self._begin(url, permits, timeout, key, priority=priority)))[0]
        if (wait_s := allowed_wait_s(verdict)) > 0:
            self.clock.sleep(wait_s)
        return verdict.allowed

    def decide(
        self,
        url: str,
        permits: int = 1,
        timeout: float | None = None,
        key: str | None = None,
        priority: Priority | str | None = None,
    ) -> Decision:
        """``try_acquire``, answering with the whole ``Decision``.

        Args:
            url: the interface: a row's ``interfaceUrl`` (the HTTP integrations pass
                the request's path).
            permits: permits this call takes, at least 1.
            timeout: the most this call may wait for its permits, seconds; None: the
                row's ``cache``; 0: never wait.
            key: the caller (an IP, a partner), for rows with ``perCaller = 1``; other
                rows ignore it.
            priority: the call's class (a ``Priority`` or its text); None: the row's
                ``priority``, else ``default``.

        Returns:
            The decision: ``allowed``, ``reason``, the seconds waited, when to retry,
            the permits left and the limit; ``headers()`` gives the HTTP headers.

        Raises:
            NotStarted: the limiter was not started, or was closed.
            ValueError: a bad argument (named), or more permits than the interface can
                serve in one call; nothing is reserved.

        Example:
            ```python
            decision = limiter.decide("/ibe/flight/search")
            if not decision.allowed:
                return 429, decision.headers()
            ```
        """
        begun = self._begin(url, permits, timeout, key, priority=priority)
        outcome = self._ask_backend(begun)
        if (wait_s := allowed_wait_s(outcome[0])) > 0:
            self.clock.sleep(wait_s)
        return self._decision(outcome, timeout, permits, priority)

    def acquire(
        self,
        url: str,
        permits: int = 1,
        key: str | None = None,
        priority: Priority | str | None = None,
    ) -> float:
        """Take ``permits`` for ``url`` however long it takes.

        A shadow rule returns 0.0 at once (its wait and refusals are only counted).

        Args:
            url: the interface: a row's ``interfaceUrl``.
            permits: permits this call takes, at least 1.
            key: the caller, for rows with ``perCaller = 1``.
            priority: the call's class (a ``Priority`` or its text); None: the row's.

        Returns:
            The seconds waited.

        Raises:
            InterfaceClosed: the interface's ``rateLimit`` is 0 (it would never return).
            BackendUnavailable: Redis is away and the failure policy cannot grant.
            NotStarted: the limiter was not started, or was closed.
            ValueError: a bad argument, or more permits than a window of the interface
                can ever hold.
        """
        begun = self._begin(url, permits, None, key, forever=True, priority=priority)
        outcome = self._ask_backend(begun)
        wait_s = self._acquired(url, permits, outcome)
        if wait_s > 0:
            self.clock.sleep(wait_s)
        return wait_s + slept_s(outcome)


class SlotsAndReports(Decisions):
    """The slots of ``GatewayLimiter`` (``slot``, ``in_flight``), and what the
    supplier reports to it (``pushback``, ``observe``) and it reports (``status``)."""

    def pushback(self, url: str, retry_after: float | None = None, key: str | None = None) -> None:
        """Tell the whole fleet that the supplier refused or failed a call on ``url``.

        Call it after an HTTP 429 or 503 (the integrations do). One round trip; every
        process obeys it from its next decision on. Nothing happens on an interface that
        is not limited; a Redis failure is logged, never raised.

        Args:
            url: the interface.
            retry_after: the supplier's ``Retry-After``, seconds: no call on ``url``
                goes before then (on the Redis clock), and callers whose budget cannot
                reach it are refused. None: the interface's rate halves (not below a
                tenth of the row's, once per second), then recovers by 5 % of the
                row's rate per second.
            key: the caller, for rows with ``perCaller = 1``.

        Example:
            ```python
            response = client.get(url)
            if response.status_code == 429:
                limiter.pushback("/ibe/flight/search", retry_after=2.0)
            ```
        """
        push = self._begin_pushback(url, retry_after, key)
        if push is not None:
            pushback = self.backend.pushback
            reply = attempt(pushback, push.rule, push.retry_after, push.key)
            self._pushed(push, reply)

    def observe(
        self,
        url: str,
        remaining: int | None = None,
        reset_at: float | None = None,
        key: str | None = None,
    ) -> int | None:
        """The supplier reports ``remaining`` calls left on ``url`` until ``reset_at``
        (epoch seconds; None: it did not say): the fleet's calendar quotas of ``url``
        follow, in one round trip, where the supplier says fewer are left than they
        count. It only ever lowers what is left: a larger ``remaining`` changes nothing.

        It speaks of the interface's own calendar quotas (else its channel's) whose
        period ends by ``reset_at`` (a report that renews sooner than a quota says
        nothing of what is left of it). ``key``: the caller, for per-caller quotas.
        Returns the permits left of those quotas after it (the least), or None when
        there is none (not limited, no calendar quota) or Redis failed (logged, never
        raised).
        """
        observed = self._begin_observe(url, remaining, reset_at, key)
        if observed is None:
            return None
        return self._observed(observed, attempt(self.backend.script, observed.call))

    def status(self, url: str | None = None) -> list[BucketStatus]:
        """Every limit in force, or ``url``'s, with its live state.

        Args:
            url: one interface; None: every interface.

        Returns:
            One ``BucketStatus`` per limit: the rule, the stored permits and debt of a
            shared bucket, what the supplier's pushbacks left (the hold, the effective
            rate) and, on an interface's first limit, its calls in flight.
        """
        states = [
            shown
            for interface, limits in chosen(self.registry, url)
            for shown in self._describe(interface, limits)
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
        self,
        url: str,
        timeout: float | None = None,
        key: str | None = None,
        priority: Priority | str | None = None,
    ) -> Iterator[Decision]:
        """Hold one of ``url``'s ``maxConcurrent`` slots, fleet-wide, while the block runs.

        Waits up to ``timeout`` for a rate permit and a free slot together; the slot is
        given back when the block ends, however it ends. An interface without
        ``maxConcurrent`` (or a shadow row) is decided as ``decide`` would; one that is
        not limited admits at once.

        Args:
            url: the interface.
            timeout: the most to wait, seconds; None: the row's ``cache``.
            key: the caller, for rows with ``perCaller = 1`` or a ``callerKey``.
            priority: the call's class (a ``Priority`` or its text); None: the row's.

        Yields:
            The decision; ``in_flight`` is the calls in flight, this one included.

        Raises:
            Refused: no slot or no rate permit within ``timeout``; ``.decision`` says
                which, and the calls in flight against ``maxConcurrent``.
            NotStarted: the limiter was not started, or was closed.

        Example:
            ```python
            with limiter.slot("/ibe/flight/book"):
                call_supplier()
            ```
        """
        check_args(url, 1, timeout, key)
        cls = None if priority is None else check_priority(priority)
        if not self._started:
            raise NotStarted(self._NOT_STARTED)
        rule = route(self.registry.snapshot, url, key)
        if rule is not None and rule.classed:  # priority classes: the class's Rule
            rule = rule.for_class(call_class(rule, cls))
        if rule is None or rule.max_concurrent is None or rule.shadow or rule.closed:
            decision = self.decide(url, 1, timeout, key, cls)
            if not decision.allowed:
                budget = timeout if timeout is not None or rule is None else rule.cache
                raise refused(url, None, decision, budget or 0.0)
            yield decision
            return
        held = self._take_slot(rule, rule.cache if timeout is None else timeout, key)
        try:
            yield held.decision
        finally:
            shielded(self._give_back, held)

    def in_flight(self, url: str) -> int | None:
        """Calls to ``url`` in flight across the fleet now (one round trip).

        Args:
            url: the interface.

        Returns:
            The count; None when its row has no ``maxConcurrent``. While Redis cannot be
            asked, this process's own count.
        """
        rule = slot_rule(self.registry.snapshot, url)
        if rule is None or rule.max_concurrent is None:
            return None
        if not self._shared:
            return self._slotting.local.in_flight(url)
        call = self._slotting.count_call(rule)
        reply = attempt(self._slot_script, call, parse_counts)
        counted = self._slotting.counted(url, reply)
        return self._slotting.local.in_flight(url) if counted is None else counted


class GatewayLimiter(SlotsAndReports):
    """Fleet-wide rate limits for one gateway process: ask it before each upstream call.

    Build one per process, shared by all its callers; start it (or use it as a context
    manager), then ask it before each call to a supplier. The limits are the rows of the
    database table, reloaded every ``reload_interval``; the buckets are shared in Redis.

    Args:
        settings: a ``Settings``, or the path of a settings file; None: the settings
            file (``$GATEWAY_LIMITER_SETTINGS``, else ``./settings.toml``), the
            ``GATEWAY_LIMITER_<KEY>`` environment variables and the defaults.
        **overrides: any setting by name (``database_url``, ``redis_url``,
            ``reload_interval``, ...), applied last; and ``clock``, what every moment
            of a decision is read from and every wait slept on
            (``gateway_limiter.core.clock.Clock``; default the system clock).

    Raises:
        SettingsError: a setting is unknown or has a bad value (naming it).

    Example:
        ```python
        with GatewayLimiter(
            database_url="mysql+pymysql://gw:secret@db/gateway", redis_url="redis://redis:6379/0"
        ) as limiter:
            if limiter.try_acquire("/ibe/flight/search"):
                call_supplier()
        ```
    """

    _NOT_STARTED: ClassVar[str] = "call start() (or use 'with GatewayLimiter(...)') first"

    def start(self) -> ReloadSummary:
        """Load the limits now, then reload them every ``reload_interval`` seconds.

        Joins the fleet and starts the reload. A table that cannot be read leaves no
        limits in force (every call admitted), logged at error level, until a reload
        reads it.

        Returns:
            What the first load found: the rules, the rows skipped, the switch.
        """
        self._starting()
        failure = attempt(self.backend.prepare)
        self._prepared(failure)
        if self._shared:
            if failure is None:  # know N from the start: one round trip, here, once
                self._join_fleet()
            self._start_heartbeats()
        watch(self, THREADED)  # a fork restarts it in the child (lifecycle.py)
        # The switch's source (etcd, Apollo) followed, up to its first reading; then
        # the registry's first reload and its reload thread.
        self.registry.start_following()
        summary = blocking(self.registry.start, follow_switch=False)
        if self._counters is not None:  # every counter raised to its checkpoint first
            self._keep_quotas(load=True)
            self._keep_quotas_from_now()
        return self._running(summary)

    def reload(self) -> ReloadSummary:
        """Reload the limits now, without waiting for ``reload_interval``.

        Returns:
            What changed (rules added, changed, removed; rows skipped); when the
            database fails, ``ok`` is False and the last good limits stay in force.
        """
        return blocking(self.registry.reload)

    def close(self) -> None:
        """Stop reloading, leave the fleet and close the connections.

        Decisions after this raise ``NotStarted``.
        """
        unwatch(self)
        self._stopping()
        for call in self._lease_returns(closing=True):  # best effort: else they expire
            attempt(self.backend.script, call)
        self._stop_heartbeats()
        self._stop_renewer()
        self._stop_quotas()
        self.registry.stop_following()
        blocking(self.registry.close)  # disposing the engine is database I/O
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


# --- the module-level functions: on the process-wide limiter, ``default_limiter()``


def try_acquire(
    url: str,
    permits: int = 1,
    timeout: float | None = None,
    key: str | None = None,
    priority: Priority | str | None = None,
) -> bool:
    """``GatewayLimiter.try_acquire`` on the process-wide limiter.

    Args:
        url: the interface (a row's ``interfaceUrl``).
        permits: permits this call takes.
        timeout: the most to wait, seconds; None: the row's ``cache``.
        key: the caller, for ``perCaller`` rows.
        priority: the call's class (``Priority`` or its text); None: the row's.

    Returns:
        True once the call may go ahead (after any wait); False at once otherwise.

    Example:
        ```python
        if try_acquire("/ibe/flight/search"):
            call_supplier()
        ```
    """
    limiter = default_limiter()
    return limiter.try_acquire(url, permits, timeout, key, priority)


def acquire(
    url: str, permits: int = 1, key: str | None = None, priority: Priority | str | None = None
) -> float:
    """``GatewayLimiter.acquire`` on the process-wide limiter: wait as long as it takes.

    Returns:
        The seconds waited.

    Raises:
        InterfaceClosed: the interface's ``rateLimit`` is 0.
        BackendUnavailable: Redis is away and the failure policy cannot grant.
    """
    limiter = default_limiter()
    return limiter.acquire(url, permits, key, priority)


def decide(
    url: str,
    permits: int = 1,
    timeout: float | None = None,
    key: str | None = None,
    priority: Priority | str | None = None,
) -> Decision:
    """``GatewayLimiter.decide`` on the process-wide limiter.

    Returns:
        A ``Decision``: allowed or not, why, and the headers to answer with.
    """
    limiter = default_limiter()
    return limiter.decide(url, permits, timeout, key, priority)


def pushback(url: str, retry_after: float | None = None, key: str | None = None) -> None:
    """``GatewayLimiter.pushback`` on the process-wide limiter: the supplier answered
    429 or 503.

    Args:
        url: the interface.
        retry_after: the seconds of the supplier's ``Retry-After``; None: lower the
            interface's rate instead.
        key: the caller, for ``perCaller`` rows.
    """
    limiter = default_limiter()
    limiter.pushback(url, retry_after, key)


@contextmanager
def slot(
    url: str,
    timeout: float | None = None,
    key: str | None = None,
    priority: Priority | str | None = None,
) -> Iterator[Decision]:
    """``GatewayLimiter.slot`` on the process-wide limiter.

    Example:
        ```python
        with slot("/ibe/flight/book"):
            call_supplier()
        ```
    """
    limiter = default_limiter()
    with limiter.slot(url, timeout, key, priority) as decision:
        yield decision
