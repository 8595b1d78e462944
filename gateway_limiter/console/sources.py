"""Where the console reads what it shows: the table (an engine), the settings, the live
buckets and the fleet. A command builds one ``Sources``; the app only calls it.

Nothing here joins the fleet: the console reads the members' heartbeats, it never
beats, so it does not change the N every gateway divides its share by.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine

from gateway_limiter.backends.base import Backend, BackendError
from gateway_limiter.backends.slots import parse_counts, renew_call
from gateway_limiter.config.reload import Registry
from gateway_limiter.config.settings import Settings
from gateway_limiter.core.failure import attempt
from gateway_limiter.core.status import BucketStatus, chosen, describe_interface

if TYPE_CHECKING:
    from gateway_limiter.limiter import GatewayLimiter

#: The console's view of the rules is at most this old (s): live numbers are <= 1 s old.
RULES_MAX_AGE_S = 1.0


@dataclass
class Sources:
    """What the console reads; ``status`` and ``fleet`` are called off the event loop."""

    settings: Settings
    engine: Engine
    #: Every limit in force with its bucket's live state.
    status: Callable[[], list[BucketStatus]]
    #: The fleet: {"shared": bool, "members": [...], "tallies": {url: {...}}}.
    fleet: Callable[[], dict[str, Any]]
    #: Who the audit names for a change made through the console without a name.
    actor: str = "console"
    extra: dict[str, Any] = field(default_factory=dict)


class RedisView:
    """Live state read from the shared backend: a registry of its own (reloaded at most
    once a second, when asked) and the backend, without a heartbeat."""

    def __init__(self, settings: Settings, backend: Backend, registry: Registry) -> None:
        self.settings = settings
        self.backend = backend
        self.registry = registry
        self._lock = threading.Lock()
        self._loaded_at = 0.0

    def _fresh(self) -> Registry:
        with self._lock:
            if time.monotonic() - self._loaded_at >= RULES_MAX_AGE_S:
                self.registry.reload()
                self._loaded_at = time.monotonic()
        return self.registry

    def status(self) -> list[BucketStatus]:
        """Every limit in force and its bucket as the backend holds it now, with what the
        supplier's pushbacks left (the hold, the effective rate) and, on an interface's
        first limit, its calls in flight (rows with ``maxConcurrent``)."""
        registry = self._fresh()
        shown = [
            state
            for interface, limits in chosen(registry, None)
            for state in describe_interface(interface, limits, self.backend)
        ]
        return [self._with_in_flight(registry, state) for state in shown]

    def _with_in_flight(self, registry: Registry, state: BucketStatus) -> BucketStatus:
        """``state`` with the live leases of its interface's slots: one read-only call of
        the slot renewal script with no lease to renew (it counts them)."""
        rule = registry.snapshot.rules.get(state.rule.url)
        script = getattr(self.backend, "script", None)
        if (
            rule is None
            or rule.config_id != state.rule.config_id
            or rule.max_concurrent is None
            or script is None
        ):
            return state
        call = renew_call(
            self.settings.key_prefix, rule.url, [], self.settings.slot_lease, rule.channel
        )
        reply = attempt(lambda: parse_counts(script(call)))
        if isinstance(reply, BackendError):
            return state
        return replace(state, in_flight=reply[1])

    def fleet(self) -> dict[str, Any]:
        """The members as their heartbeats describe them, and their tallies."""
        from gateway_limiter.backends.fleet import decode_member

        if not self.backend.shared:
            return {"shared": False, "members": [], "tallies": {}}
        try:
            members, now_ms = self.backend.members()
        except BackendError as e:
            return {"shared": True, "members": [], "tallies": {}, "error": str(e)}
        shown = []
        for text, expires_ms in members:
            about = decode_member(text)
            ttl_ms = float(about.get("ttl_ms", 0) or 0)
            shown.append(
                {
                    "host": str(about.get("host", text)),
                    "pid": about.get("pid"),
                    "since": about.get("since"),
                    "version": about.get("version"),
                    "seenAgoS": round(max(0.0, (now_ms - (expires_ms - ttl_ms)) / 1000.0), 3),
                }
            )
        return {"shared": True, "members": shown, "tallies": fleet_tallies(self.backend)}


def fleet_tallies(backend: Backend) -> dict[str, Any]:
    """Per interface, admitted / waited / refused per second summed over the fleet
    (empty when the backend cannot tell)."""
    read = getattr(backend, "fleet_tallies", None)
    if read is None:
        return {}
    try:
        result: dict[str, Any] = read()
    except BackendError:
        return {}
    return result


class InProcessView:
    """Live state of a limiter in this process (the demo's, on ``memory://``): its
    buckets, and its calls per second between two reads of ``fleet``."""

    def __init__(self, limiter: GatewayLimiter) -> None:
        self.limiter = limiter
        self._lock = threading.Lock()
        self._last: dict[str, tuple[int, int, int]] = {}
        self._last_s = time.monotonic()
        self._rates: dict[str, dict[str, float]] = {}

    def status(self) -> list[BucketStatus]:
        """Every limit in force and its bucket."""
        return self.limiter.status()

    def fleet(self) -> dict[str, Any]:
        """A fleet of one: this process, and its calls per second since the last read
        (reads less than half a second apart answer the same numbers)."""
        with self._lock:
            now_s = time.monotonic()
            span_s = now_s - self._last_s
            if span_s >= 0.5:
                counts = self.limiter.call_counts
                self._rates = {
                    url: dict(
                        zip(
                            ("admitted", "waited", "refused"),
                            (
                                round((c - b) / span_s, 3)
                                for c, b in zip(now, self._last.get(url, (0, 0, 0)), strict=True)
                            ),
                            strict=True,
                        )
                    )
                    | {"factor": 1.0}
                    for url, now in counts.items()
                }
                self._last, self._last_s = counts, now_s
            return {"shared": False, "members": [], "tallies": dict(self._rates)}
