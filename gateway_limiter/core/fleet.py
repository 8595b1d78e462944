"""The fleet: how many processes share the rules (N), and this process's share of a rule
while Redis is away (``on_backend_error = "share"``). No I/O here.

How it works: docs/internals.md, section ``gateway_limiter.core.fleet``.
"""

from __future__ import annotations

import functools
import math
import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import replace
from importlib import metadata
from typing import Any, Final

from gateway_limiter.backends.base import BackendError
from gateway_limiter.backends.fleet import Heartbeat, encode_demand, encode_member, encode_tallies
from gateway_limiter.config.rules import Rule
from gateway_limiter.config.settings import Settings
from gateway_limiter.core.clock import SYSTEM_CLOCK, Clock
from gateway_limiter.observe.logs import log

#: A member is dead once it has missed this many heartbeats in a row (one late beat on
#: a loaded host must not shrink N, which would raise every other process's share).
DEAD_AFTER_BEATS: Final = 3
#: Shared-out rules kept at most; past this the cache starts over (reloads make new Rules).
_SCALED_KEPT: Final = 4096
#: Interfaces whose in-process admissions are kept for the charge after an outage.
CHARGED_KEPT: Final = 1000
#: Claims come in millionths (``backends/fleet.py`` rounds them down to that).
PART_SCALE: Final = 1_000_000
#: Calls per second a process reports on an interface it has not called: its part of
#: an idle interface is then an even one (every member reports the same floor).
DEMAND_FLOOR: Final = 0.01
#: How much of the demand estimate each heartbeat's count replaces (an exponential
#: average over about 1 / WEIGHT heartbeats: a burst does not swing the claims).
DEMAND_WEIGHT: Final = 0.5


@functools.cache
def package_version() -> str:
    """The installed gateway-limiter's version ("unknown" when run from a bare tree);
    read once (a metadata lookup costs milliseconds, every limiter built asks)."""
    try:
        return metadata.version("gateway-limiter")
    except metadata.PackageNotFoundError:
        return "unknown"


def shared_out(rule: Rule, n: int) -> Rule:
    """``rule`` (every limit of its interface) at 1/``n`` of its rate and capacity.

    - Token bucket and warm-up: the refill rate exactly 1/n (as ``rate`` permits per
      ``n x period`` s), the capacity ``floor(burst / n)``, at least 1 permit (a
      bucket that holds less admits nothing; with fewer permits than processes the
      fleet may then burst up to n, never more).
    - Sliding and fixed windows: ``floor(rate / n)`` per period; where that is below 1
      (rate < n), 1 permit per a period stretched to ``ceil(n x period / rate)``, so
      no process gets more than its share in any window. Rounding down leaves the
      fleet at most n - 1 permits per period below the rule, never above it.

    Closed limits stay closed; per-caller limits are shared out per caller; shadow stays.
    """
    if n <= 1:
        return rule
    first, *others = [_one(limit, n) for limit in rule.limits]
    return replace(first, also=tuple(others))


def _one(rule: Rule, n: int) -> Rule:
    if rule.closed:
        return replace(rule, also=())
    if not rule.spec.window:
        return replace(rule, period=rule.period * n, capacity=max(1, rule.burst // n), also=())
    if rule.rate >= n:
        return replace(rule, rate=rule.rate // n, also=())
    return replace(rule, rate=1, period=math.ceil(rule.period * n / rule.rate), also=())


def shared_by(rule: Rule, part: float, channel_part: float | None = None) -> Rule:
    """``rule`` at ``part`` (0 to 1) of its rate and capacity: ``shared_out`` for a
    demand-weighted claim instead of 1/n. Token bucket: the rate exactly ``part`` of it,
    the capacity ``floor(burst x part)``, at least 1; windows: ``floor(rate x part)`` per
    period, or 1 per a period stretched to ``ceil(period / (rate x part))``. A part of 0
    (the fleet's claims are all taken) admits nothing: the rule closed.

    ``channel_part`` (None: ``part``) scales the channel's limits instead: a claim is
    on one interface, and the channel spans others that other processes claim."""
    channel = part if channel_part is None else channel_part
    if part >= 1.0 and channel >= 1.0:
        return rule
    if part <= 0.0:
        return replace(rule, rate=0, also=())
    first, *others = [_part(r, channel if r.caps_channel else part) for r in rule.limits]
    return replace(first, also=tuple(others))


def _part(rule: Rule, part: float) -> Rule:
    if rule.closed or part >= 1.0:
        return replace(rule, also=())
    if not rule.spec.window:
        # periods are whole seconds: ``part`` of the refill as rate x part x S permits
        # per S periods (S = PART_SCALE, the claims' own resolution), rounded down
        capacity = max(1, math.floor(rule.burst * part + 1e-9))
        rate = max(1, math.floor(rule.rate * part * PART_SCALE + 1e-6))
        return replace(rule, rate=rate, period=rule.period * PART_SCALE, capacity=capacity, also=())
    per_period = math.floor(rule.rate * part + 1e-9)
    if per_period >= 1:
        return replace(rule, rate=per_period, also=())
    return replace(rule, rate=1, period=math.ceil(rule.period / (rule.rate * part)), also=())


class Fleet:
    """This process's membership and the last fleet size seen.

    ``size`` is read on any thread; ``beat`` is called by the one heartbeat thread or
    task. An int attribute is replaced whole, so no lock is needed.
    """

    __slots__ = (
        "_admitted",
        "_beat_at",
        "_clock",
        "_counted",
        "_estimate",
        "_scaled",
        "_warned",
        "charged",
        "charges_due",
        "claims",
        "configured",
        "heartbeat_s",
        "member",
        "seen",
        "tallies",
        "ttl_ms",
    )

    def __init__(self, settings: Settings, shared: bool, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self.heartbeat_s = settings.fleet_heartbeat
        self.ttl_ms = math.ceil(settings.fleet_heartbeat * DEAD_AFTER_BEATS * 1000)
        #: The ``fleet_size`` setting: N until Redis has answered once (0: unknown).
        self.configured = settings.fleet_size
        #: N as Redis last answered; None until it has. ``memory://`` is its own fleet.
        self.seen: int | None = None if shared else 1
        self.member = encode_member(
            socket.gethostname(), os.getpid(), clock.time(), package_version(), self.ttl_ms
        )
        self._scaled: dict[Rule, tuple[float, Rule]] = {}
        self._warned = False
        #: url -> decisions counted by ``tallies`` as of the last heartbeat: the demand
        #: is read off the one counter the decision path keeps.
        self._counted: dict[str, int] = {}
        #: url -> calls per second, smoothed (the heartbeat's own).
        self._estimate: dict[str, float] = {}
        self._beat_at = clock.monotonic()
        #: url -> this process's claim (0 to 1) as Redis last answered; empty until then.
        self.claims: dict[str, float] = {}
        #: url -> (its rule, permits this process admitted in-process in this outage)
        self._admitted: dict[str, tuple[Rule, int]] = {}
        #: Redis answered again after an outage: the next heartbeat charges it.
        self.charges_due = False
        #: Permits charged to the shared buckets after outages, in all.
        self.charged = 0
        #: This process's calls per interface, sent with each heartbeat (the console).
        self.tallies = Tallies(clock)

    def admitted_alone(self, rule: Rule, permits: int) -> None:
        """The failure policy admitted ``permits`` of ``rule`` in this process (not per
        caller: those buckets are many and short-lived). Only while Redis is away."""
        admitted = self._admitted
        _, before = admitted.get(rule.url, (rule, 0))
        if len(admitted) < CHARGED_KEPT or rule.url in admitted:
            admitted[rule.url] = (rule, before + permits)

    def charges(self) -> list[tuple[Rule, int]]:
        """What to charge the shared buckets now that Redis answers again (once): per
        interface, the permits admitted in-process during the outage, but at most this
        process's part of the capacity (``part`` x burst, at least 1), so the fleet's
        charges add up to at most about one bucket: Redis may have lost or refilled
        the bucket meanwhile, and a debt of more than a bucket would refuse calls
        long after the outage."""
        if not self.charges_due:
            return []
        self.charges_due = False
        admitted, self._admitted = self._admitted, {}
        due = []
        for rule, permits in admitted.values():
            whole = min(r.most for r in rule.limits)
            most = max(1, math.floor(whole * self.part(rule) + 1e-9))
            due.append((rule, min(permits, most)))
        return due

    @property
    def size(self) -> int:
        """The live processes last seen, this one included (before Redis has answered:
        the ``fleet_size`` setting; 0 unknown)."""
        return self.configured if self.seen is None else self.seen

    def demand(self, urls: Iterable[str]) -> str:
        """This process's demand on ``urls`` (the interfaces it limits now), as the next
        heartbeat reports it: decisions per second since the last one (read off
        ``tallies``, the one counter on the decision path), smoothed, at least
        ``DEMAND_FLOOR``. Called by the one heartbeat thread or task."""
        now = self._clock.monotonic()
        elapsed = max(now - self._beat_at, 1e-3)
        self._beat_at = now
        counted = self.tallies.decided()
        before_counted, self._counted = self._counted, counted
        before = self._estimate
        estimate = {}
        for url in urls:
            rate = (counted.get(url, 0) - before_counted.get(url, 0)) / elapsed
            old = before.get(url)
            smoothed = rate if old is None else old + DEMAND_WEIGHT * (rate - old)
            estimate[url] = max(DEMAND_FLOOR, smoothed)
        self._estimate = estimate
        return encode_demand(estimate)

    def beat(self, reply: Heartbeat | BackendError) -> None:
        """A heartbeat answered N and this process's claims (or failed: both stay the
        last seen)."""
        if isinstance(reply, Heartbeat) and reply.live >= 1:
            self.seen = reply.live
            self.claims = reply.claims

    def part(self, rule: Rule) -> float:
        """The part of ``rule`` (0 to 1) this process decides under ``share``: its claim,
        or 1/N without one (1 for a fleet of one or of unknown size)."""
        claim = self.claims.get(rule.url)
        if claim is not None:
            return claim
        n = self.size
        return 1.0 if n <= 1 else 1.0 / n

    def share(self, rule: Rule) -> Rule:
        """``rule`` as this process decides it alone under ``share``: its last claim on
        it, or 1/N of it without one (an interface added since the last heartbeat)."""
        part = self.claims.get(rule.url)
        if part is not None:  # the channel's limits at 1/N: claims are per interface
            n = self.size
            parts = (part, 1.0 if n <= 1 else 1.0 / n)
            return self._cached(rule, parts, lambda r, p: shared_by(r, *p))
        n = self.size
        if n == 0:
            if not self._warned:
                self._warned = True
                log.warning(
                    "on_backend_error is share, but Redis has never answered this process "
                    "and fleet_size is 0 (unknown): deciding each rule whole in this "
                    "process, as local, until Redis answers (set fleet_size to the number "
                    "of gateway processes to share it out)"
                )
            return rule
        if n == 1:
            return rule
        return self._cached(rule, 1.0 / n, lambda r, _: shared_out(r, n))

    def _cached(self, rule: Rule, part: Any, scale: Callable[[Rule, Any], Rule]) -> Rule:
        cached = self._scaled.get(rule)
        if cached is not None and cached[0] == part:
            return cached[1]
        if len(self._scaled) >= _SCALED_KEPT:
            self._scaled.clear()
        scaled = scale(rule, part)
        self._scaled[rule] = (part, scaled)
        return scaled


class Tallies:
    """This process's calls per interface: admitted, admitted after a wait, refused.

    ``add`` is on the decision path: a dict lookup and an integer increment, nothing
    more (no lock: two threads may very rarely lose one count between them, which a
    per-second display can bear). ``since_last`` runs on the heartbeat only: the rates
    since the previous heartbeat, for the fleet's live numbers in the console.
    """

    __slots__ = ("_clock", "_last", "_last_s", "counts")

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self.counts: dict[str, list[int]] = {}
        self._last: dict[str, tuple[int, ...]] = {}
        self._last_s = clock.monotonic()

    def add(self, url: str, allowed: bool, waited: bool) -> None:
        """Count one decision on ``url``."""
        counts = self.counts.get(url)
        if counts is None:
            counts = self.counts.setdefault(url, [0, 0, 0])
        if not allowed:
            counts[2] += 1
        else:
            counts[0] += 1
            if waited:
                counts[1] += 1

    def decided(self) -> dict[str, int]:
        """Decisions per interface so far (admitted and refused): the fleet's demand."""
        return {url: c[0] + c[2] for url, c in list(self.counts.items())}

    def since_last(self, factors: dict[str, float]) -> str:
        """The rates per second since the last call (``encode_tallies``), with the
        effective factors after pushback below 1."""
        now_s = self._clock.monotonic()
        span_s = max(now_s - self._last_s, 1e-3)
        now = {url: tuple(c) for url, c in list(self.counts.items())}
        rates = {}
        for url, counts in now.items():
            before = self._last.get(url, (0, 0, 0))
            moved = [c - b for c, b in zip(counts, before, strict=True)]
            if any(moved):
                rates[url] = (moved[0] / span_s, moved[1] / span_s, moved[2] / span_s)
        self._last, self._last_s = now, now_s
        return encode_tallies(rates, factors)
