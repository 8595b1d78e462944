"""The fleet: how many processes share the rules (N), and this process's share of a rule
while Redis is away (``on_backend_error = "share"``). No I/O here.

Each process beats every ``fleet_heartbeat`` seconds, off the decision path (a thread in
``GatewayLimiter``, a task in ``AsyncGatewayLimiter``): one round trip that renews its
membership in ``<key_prefix>:fleet``, drops the dead and answers N
(``backends/fleet.py``). A member missing ``DEAD_AFTER_BEATS`` heartbeats in a row is
dropped by the next heartbeat of any other.

While Redis cannot be asked, ``share`` decides each rule in this process at 1/N of it,
with N the last count seen (``shared_out``), so N processes together stay within the
rule. A process that has never reached Redis takes N from the ``fleet_size`` setting;
with that 0 (unknown) it decides the whole rule, as ``local``, and says so once.
"""

from __future__ import annotations

import math
import os
import socket
import time
from dataclasses import replace
from importlib import metadata
from typing import Final

from gateway_limiter.backends.base import BackendError
from gateway_limiter.backends.fleet import encode_member, encode_tallies
from gateway_limiter.backends.state import kind
from gateway_limiter.config.rules import Rule
from gateway_limiter.config.settings import Settings
from gateway_limiter.model.limits import LimitKind
from gateway_limiter.observe.logs import log

#: A member is dead once it has missed this many heartbeats in a row (one late beat on
#: a loaded host must not shrink N, which would raise every other process's share).
DEAD_AFTER_BEATS: Final = 3
#: Shared-out rules kept at most; past this the cache starts over (reloads make new Rules).
_SCALED_KEPT: Final = 4096


def package_version() -> str:
    """The installed gateway-limiter's version ("unknown" when run from a bare tree)."""
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
    if kind(rule) is LimitKind.TOKEN_BUCKET:
        return replace(rule, period=rule.period * n, capacity=max(1, rule.burst // n), also=())
    if rule.rate >= n:
        return replace(rule, rate=rule.rate // n, also=())
    return replace(rule, rate=1, period=math.ceil(rule.period * n / rule.rate), also=())


class Fleet:
    """This process's membership and the last fleet size seen.

    ``size`` is read on any thread; ``beat`` is called by the one heartbeat thread or
    task. An int attribute is replaced whole, so no lock is needed.
    """

    __slots__ = (
        "_scaled",
        "_warned",
        "configured",
        "heartbeat_s",
        "member",
        "seen",
        "tallies",
        "ttl_ms",
    )

    def __init__(self, settings: Settings, shared: bool) -> None:
        self.heartbeat_s = settings.fleet_heartbeat
        self.ttl_ms = math.ceil(settings.fleet_heartbeat * DEAD_AFTER_BEATS * 1000)
        #: The ``fleet_size`` setting: N until Redis has answered once (0: unknown).
        self.configured = settings.fleet_size
        #: N as Redis last answered; None until it has. ``memory://`` is its own fleet.
        self.seen: int | None = None if shared else 1
        self.member = encode_member(
            socket.gethostname(), os.getpid(), time.time(), package_version(), self.ttl_ms
        )
        self._scaled: dict[Rule, tuple[int, Rule]] = {}
        self._warned = False
        #: This process's calls per interface, sent with each heartbeat (the console).
        self.tallies = Tallies()

    @property
    def size(self) -> int:
        """The live processes last seen, this one included (before Redis has answered:
        the ``fleet_size`` setting; 0 unknown)."""
        return self.configured if self.seen is None else self.seen

    def beat(self, reply: int | BackendError) -> None:
        """A heartbeat answered N (or failed: N stays the last seen)."""
        if isinstance(reply, int) and reply >= 1:
            self.seen = reply

    def share(self, rule: Rule) -> Rule:
        """``rule`` as this process decides it alone under ``share``: 1/N of it."""
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
        cached = self._scaled.get(rule)
        if cached is not None and cached[0] == n:
            return cached[1]
        if len(self._scaled) >= _SCALED_KEPT:
            self._scaled.clear()
        scaled = shared_out(rule, n)
        self._scaled[rule] = (n, scaled)
        return scaled


class Tallies:
    """This process's calls per interface: admitted, admitted after a wait, refused.

    ``add`` is on the decision path: a dict lookup and an integer increment, nothing
    more (no lock: two threads may very rarely lose one count between them, which a
    per-second display can bear). ``since_last`` runs on the heartbeat only: the rates
    since the previous heartbeat, for the fleet's live numbers in the console.
    """

    __slots__ = ("_last", "_last_s", "counts")

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {}
        self._last: dict[str, tuple[int, ...]] = {}
        self._last_s = time.monotonic()

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

    def since_last(self, factors: dict[str, float]) -> str:
        """The rates per second since the last call (``encode_tallies``), with the
        effective factors after pushback below 1."""
        now_s = time.monotonic()
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
