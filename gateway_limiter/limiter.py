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

from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import ClassVar, Self

from gateway_limiter import default_limiter
from gateway_limiter.concurrency import blocking, shielded
from gateway_limiter.config.reload import ReloadSummary
from gateway_limiter.core import engine
from gateway_limiter.core.decision import Decision
from gateway_limiter.core.failure import attempt
from gateway_limiter.core.status import BucketStatus
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
        return self._run(engine.reserving(self, url, permits, timeout, key, priority))

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
        return self._run(engine.trying(self, url, permits, timeout, key, priority))

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
        return self._run(engine.deciding(self, url, permits, timeout, key, priority))

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
        return self._run(engine.acquiring(self, url, permits, key, priority))


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
        self._run(engine.pushing(self, url, retry_after, key))

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
        return self._run(engine.observing(self, url, remaining, reset_at, key))

    def status(self, url: str | None = None) -> list[BucketStatus]:
        """Every limit in force, or ``url``'s, with its live state.

        Args:
            url: one interface; None: every interface.

        Returns:
            One ``BucketStatus`` per limit: the rule, the stored permits and debt of a
            shared bucket, what the supplier's pushbacks left (the hold, the effective
            rate) and, on an interface's first limit, its calls in flight.
        """
        return self._run(engine.statuses(self, self._slotting, url))

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
        rule, cls, budget_s = engine.slot_of(self, url, timeout, key, priority)
        if budget_s is None or rule is None:  # no cap to hold: decided as decide would
            yield self._run(engine.slot_decided(self, url, timeout, key, cls, rule))
            return
        held = self._take_slot(rule, budget_s, key)
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
        return self._run(engine.in_flight(self, self._slotting, url))


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
        self._run(engine.returning(self))  # the leases (best effort: else they expire)
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
