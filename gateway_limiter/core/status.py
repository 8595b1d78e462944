"""What ``status`` shows: each limit in force, with its shared bucket's live state.

Sans-I/O: the limiters (and the CLI) read a bucket's state with the backend's ``peek``
and hand what they got, state or error, to ``bucket_status``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gateway_limiter.backends.base import Backend, BackendError
from gateway_limiter.backends.state import limit as limit_of
from gateway_limiter.backends.state import pushback_rate
from gateway_limiter.config.reload import Registry
from gateway_limiter.config.rules import Rule
from gateway_limiter.core.failure import attempt
from gateway_limiter.core.steps import Peek, PeekPushback, Steps
from gateway_limiter.model.bucket import US_PER_S, BucketState, reserve, resync
from gateway_limiter.model.limits import (
    CalendarLimit,
    CalendarWindow,
    LimitKind,
    LimitState,
    window_count,
)
from gateway_limiter.model.pushback import (
    PushbackState,
    effective_rate,
    factor_at,
    until_of,
)

#: What a status read got: the stored state (a bucket's or a window's; None: none stored)
#: and the backend's clock (µs); the BackendError that stopped the read; or None,
#: nothing to read (see ``has_shared_state``).
Peeked = tuple[LimitState | None, float] | BackendError | None


@dataclass(frozen=True, slots=True)
class BucketStatus:
    """One limit in force and its live state: what ``limiter.status()`` lists, and what
    ``gateway-limiter status`` shows.

    The fields without a note below: ``rule``, the limit; ``stored``, the permits
    saved up in its bucket (None: a full bucket, or a window); ``debt_ms``, the wait
    queued behind earlier callers; ``shared``, whether the state lives in Redis;
    ``error``, why the state could not be read.
    """

    rule: Rule
    stored: float | None  # None: no state stored (a full bucket), or a window
    debt_ms: float
    shared: bool
    error: str | None = None
    #: Milliseconds until one permit would be granted (0: now); None: unknown (a closed
    #: or per-caller rule, or the state could not be read).
    next_free_ms: float | None = None
    #: This limit's rate after the supplier's pushbacks, in its own units (permits per
    #: period; windows in whole permits); None: not read (per caller, closed, an error).
    effective_rate: float | None = None
    #: Milliseconds left of a pushback's ``retry_after`` hold (0: none), and when it ends
    #: (Unix seconds on the Redis server's clock; None: no hold).
    held_ms: float = 0.0
    held_until: float | None = None
    #: Calls in flight on the interface across the fleet (``slot()``); None: the row has
    #: no ``maxConcurrent`` (or this is not the interface's first limit).
    in_flight: int | None = None
    #: A shared calendar quota: permits used in the period the Redis clock is in, and
    #: when that period ends (Unix seconds); None: not a calendar quota, or not read.
    quota_used: float | None = None
    renews_at: float | None = None
    #: A window's permits counted in its window now, or a shared calendar quota's in its
    #: period (as ``quota_used``), of ``rule.rate``; None: neither, or not read.
    used: float | None = None
    #: Milliseconds until a window's count is back to 0 (a fixed window: its end; a
    #: sliding window: its latest admission leaves it); None: nothing counted, or not
    #: a window.
    reset_ms: float | None = None


#: What a pushback read got, as ``Peeked``: the state (None: none) and the clock (µs).
PushbackPeeked = tuple[PushbackState | None, float] | BackendError | None


def chosen(registry: Registry, url: str | None) -> list[tuple[Rule, list[Rule]]]:
    """Each interface ``status`` shows (its rule with every limit, where pushbacks are
    kept), with its limits as ``chosen_limits`` gives them.

    Capacity shares: a named caller's own rows are shown with its interface, and a
    channel's limits once (with the first interface of the channel)."""
    snapshot = registry.snapshot
    rules = snapshot.rules
    urls = sorted(rules) if url is None else [url] if url in rules else []
    seen: set[int] = set()
    shown = []
    for u in urls:
        rule = rules[u]
        limits = [(rule, limit) for limit in rule.limits]
        limits += [
            (named, limit)
            for (v, _), named in sorted(snapshot.named.items())
            if v == u
            for limit in named.limits
            if limit.caller is not None
        ]
        mine = []
        for owner, limit in limits:
            if limit.config_id not in seen:
                seen.add(limit.config_id)
                mine.append(replace(limit, cache=owner.cache, also=()))
        shown.append((rule, mine))
    return shown


def has_pushback_state(interface: Rule) -> bool:
    """True when ``interface``'s pushbacks are one state for all callers (not per caller,
    not closed: a closed interface records none)."""
    return not interface.keyed and not interface.closed


def chosen_limits(registry: Registry, url: str | None) -> list[Rule]:
    """The limits ``status`` shows: every limit of ``url``, or of every URL, in order,
    each on its own with its interface's wait budget (the one that applies)."""
    return [limit for _, limits in chosen(registry, url) for limit in limits]


def has_shared_bucket(rule: Rule) -> bool:
    """True when ``rule``'s limit is one bucket for all callers, whose state peek reads."""
    return not rule.spec.window and not rule.per_caller


def has_shared_state(rule: Rule) -> bool:
    """True when ``rule``'s limit is one state for all callers (a bucket or a window),
    which ``peek`` reads."""
    return not rule.per_caller


def quota_status(
    rule: Rule,
    shared: bool,
    state: object,
    now_us: float,
    until_us: float = 0.0,
    pb: tuple[float | None, float, float | None] = (None, 0.0, None),
) -> BucketStatus:
    """A shared calendar quota as ``status`` shows it: used in the period ``now_us`` (the
    Redis clock) is in, when that period ends, and when one permit could go (a paced
    quota: once its bucket has one; a pushback's hold included)."""
    spec = limit_of(rule, now_us / US_PER_S)
    counter = state if isinstance(state, CalendarWindow) else None
    model = CalendarLimit()
    left, ends_us = model.period_left(spec, counter, now_us)
    free_us = now_us if counter is None else model.next_free_at(spec, counter, now_us)
    next_free_ms = max(0.0, max(free_us, until_us) - now_us) / 1000.0
    used = rule.rate - left
    return BucketStatus(
        rule,
        None,
        0.0,
        shared,
        None,
        next_free_ms,
        *pb,
        quota_used=used,
        renews_at=ends_us / US_PER_S,
        used=used,
    )


#: ``status --status``: what each limit's live state is (``condition``).
CONDITIONS = ("idle", "ok", "debt", "spent", "held", "closed", "unread")


def condition(s: BucketStatus) -> str:
    """What a limit's live state comes to, in a word (``CONDITIONS``): closed; held by
    a pushback's ``retry_after``; spent (no permit now: a full window, a used-up calendar
    quota, a paced quota between permits, an empty bucket); in debt (callers queue);
    idle (nothing counted or stored); ok; unread (per caller, or the read failed)."""
    rule = s.rule
    if rule.closed:
        return "closed"
    if s.held_until is not None:
        return "held"
    if s.error is not None or rule.per_caller:
        return "unread"
    if rule.calendar is not None:
        if s.quota_used is None:
            return "unread"
        if s.quota_used >= rule.rate or s.next_free_ms:
            return "spent"
        return "idle" if s.quota_used == 0 else "ok"
    if s.used is not None:  # a window
        cap = rule.rate if s.effective_rate is None else min(rule.rate, s.effective_rate)
        if s.used >= cap and s.next_free_ms:
            return "spent"
        return "idle" if s.used == 0 else "ok"
    if s.stored is None:
        return "idle"
    if s.debt_ms > 0:
        return "debt"
    return "spent" if s.next_free_ms else "ok"


def bucket_status(
    rule: Rule,
    shared: bool,
    peeked: Peeked,
    interface: Rule | None = None,
    pushed: PushbackPeeked = None,
) -> BucketStatus:
    """A limit's bucket as ``status`` shows it, from what ``peek`` read (see ``Peeked``)
    and, for the limit of ``interface``, what ``peek_pushback`` read (``PushbackPeeked``)."""
    if isinstance(pushed, BackendError) and not isinstance(peeked, BackendError):
        peeked = pushed  # the pushback read failed: shown as the read's error
    factor, until_us, effective, held_ms, held_until = 1.0, 0.0, None, 0.0, None
    if interface is not None and pushed is not None and not isinstance(pushed, BackendError):
        state_pb, pb_now_us = pushed
        factor = factor_at(state_pb, pushback_rate(interface), pb_now_us)
        until_us = until_of(state_pb)
        effective = effective_rate(rule.rate, factor, rule.algorithm)
        if until_us > pb_now_us:
            held_ms = (until_us - pb_now_us) / 1000.0
            held_until = until_us / US_PER_S
    if peeked is None:
        return BucketStatus(rule, None, 0.0, shared, None, None, effective, held_ms, held_until)
    if isinstance(peeked, BackendError):
        return BucketStatus(rule, None, 0.0, shared, str(peeked))
    state, now_us = peeked
    pb = (effective, held_ms, held_until)
    if rule.kind is LimitKind.CALENDAR or isinstance(state, CalendarWindow):
        if rule.closed:
            return BucketStatus(rule, None, 0.0, shared, None, None, *pb)
        return quota_status(rule, shared, state, now_us, until_us, pb)
    if rule.spec.window:
        if rule.closed:
            return BucketStatus(rule, None, 0.0, shared, None, None, *pb)
        return _window_status(rule, shared, state, now_us, factor, until_us, pb)
    bucket = state if isinstance(state, BucketState) else None
    next_free_ms = None
    if not rule.closed and has_shared_bucket(rule):
        # What one permit would wait now: the model's own answer, nothing written.
        verdict, _ = reserve(
            bucket,
            rule.per_second,
            rule.burst,
            1,
            None,
            now_us,
            rule.warmup * US_PER_S,
            factor,
            until_us,
        )
        next_free_ms = verdict.wait_us / 1000.0
    if bucket is None:
        return BucketStatus(rule, None, 0.0, shared, None, next_free_ms, *pb)
    current = resync(bucket, now_us)
    debt_ms = max(0.0, current.balance_us - now_us) / 1000.0
    return BucketStatus(rule, current.stored, debt_ms, shared, None, next_free_ms, *pb)


def _window_status(
    rule: Rule,
    shared: bool,
    state: LimitState | None,
    now_us: float,
    factor: float,
    until_us: float,
    pb: tuple[float | None, float, float | None],
) -> BucketStatus:
    """A window as ``status`` shows it: its permits counted now, when the count is back
    to 0, and when one permit could go (a pushback's count and hold included)."""
    count = window_count(limit_of(rule), state, factor, now_us)
    used = count.used
    reset_ms = None if count.reset_us is None else (count.reset_us - now_us) / 1000.0
    next_free_ms = max(0.0, max(count.next_free_us, until_us) - now_us) / 1000.0
    return BucketStatus(
        rule, None, 0.0, shared, None, next_free_ms, *pb, used=used, reset_ms=reset_ms
    )


def describe_state(rule: Rule, backend: Backend) -> BucketStatus:
    """A limit's shared bucket as ``status`` shows it, read from a (sync) backend.

    Per-caller limits have no single state to show: none is read.
    """
    peeked = attempt(backend.peek, rule) if has_shared_state(rule) else None
    return bucket_status(rule, backend.shared, peeked)


def describing(interface: Rule, limits: list[Rule], shared: bool) -> Steps[list[BucketStatus]]:
    """Every limit of ``interface`` as ``status`` shows it, with what pushbacks left on
    the interface (the hold, the effective rate), as steps: the reads, then the rows."""
    pushed = (yield PeekPushback(interface)) if has_pushback_state(interface) else None
    out = []
    for rule in limits:
        peeked = (yield Peek(rule)) if has_shared_state(rule) else None
        out.append(bucket_status(rule, shared, peeked, interface, pushed))
    return out


def describe_interface(interface: Rule, limits: list[Rule], backend: Backend) -> list[BucketStatus]:
    """``describing`` read from a (sync) backend (the console's and the CLI's)."""
    reads = describing(interface, limits, backend.shared)
    got: object = None
    try:
        while True:
            step = reads.send(got)
            if isinstance(step, PeekPushback):
                got = attempt(backend.peek_pushback, step.rule)
            elif isinstance(step, Peek):
                got = attempt(backend.peek, step.rule)
    except StopIteration as done:
        shown: list[BucketStatus] = done.value
        return shown
