"""``GatewayLimiter``: the facade every gateway process calls before an upstream call.

The decision path itself (routing, the failure policy and its circuit breaker, local
refusals, shadow rules, metrics) is ``gateway_limiter.core.pipeline.LimiterCore``,
shared with the asyncio limiter (``gateway_limiter.aio``). This class is the core's
threaded I/O shell: it calls the backend and sleeps with ``time.sleep``.
``decide`` returns a decision as a ``Decision``; ``try_acquire`` is its ``allowed``.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import ClassVar, Self

from gateway_limiter.backends.base import Backend
from gateway_limiter.backends.schemes import open_backend
from gateway_limiter.config.reload import ReloadSummary
from gateway_limiter.config.settings import Settings
from gateway_limiter.core.decision import Decision
from gateway_limiter.core.failure import attempt
from gateway_limiter.core.pipeline import Ask, LimiterCore, Outcome, allowed_wait_s
from gateway_limiter.core.status import BucketStatus, chosen, describe_interface
from gateway_limiter.model.bucket import Verdict

__all__ = ["GatewayLimiter"]


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

    def _open_backend(self, settings: Settings) -> bool:
        self.backend = open_backend(settings)
        return self.backend.shared

    def start(self) -> ReloadSummary:
        """Load the limits now, then reload every ``reload_interval`` seconds."""
        self._starting()
        failure = attempt(self.backend.prepare)
        self._prepared(failure)
        if self._shared:
            if failure is None:  # know N from the start: one round trip, here, once
                self._beat(attempt(self.backend.heartbeat, self._fleet.member, self._fleet.ttl_ms))
            self._start_heartbeats()
        return self._running(self.registry.start())

    def _start_heartbeats(self) -> None:
        """Renew this process's fleet membership every ``fleet_heartbeat`` s on a daemon
        thread: never on a decision's path (``core/fleet.py``)."""
        stop = self._stop_beating = threading.Event()
        fleet, backend = self._fleet, self.backend

        def beat() -> None:
            while not stop.wait(fleet.heartbeat_s):
                tallies = self._tallies()
                self._beat(attempt(backend.heartbeat, fleet.member, fleet.ttl_ms, tallies))

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
        self._stopping()
        self._stop_heartbeats()
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
        if not isinstance(step, Ask):
            return step
        reply = attempt(self.backend.reserve, step.rule, step.permits, step.budget_s, step.key)
        return self._finish(step, reply)

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
        if (wait_s := allowed_wait_s(verdict)) > 0:
            time.sleep(wait_s)
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
        return self._decision(outcome, timeout)

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
        """Every limit in force (or ``url``'s) with its live state (shared buckets) and
        what the supplier's pushbacks left (the hold, the effective rate)."""
        return [
            shown
            for interface, limits in chosen(self.registry, url)
            for shown in describe_interface(interface, limits, self.backend)
        ]
