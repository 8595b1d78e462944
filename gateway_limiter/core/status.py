"""What ``status`` shows: each limit in force, with its shared bucket's live state.

Sans-I/O: the limiters (and the CLI) read a bucket's state with the backend's ``peek``
and hand what they got, state or error, to ``bucket_status``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final

from gateway_limiter.backends.base import Backend, BackendError
from gateway_limiter.config.reload import Registry
from gateway_limiter.config.rules import Algorithm, Rule
from gateway_limiter.core.failure import attempt
from gateway_limiter.model.bucket import US_PER_S, BucketState, reserve, resync

#: Algorithms whose state is a window of admissions, not a bucket.
WINDOWS: Final = (Algorithm.SLIDING_WINDOW, Algorithm.FIXED_WINDOW)

#: What a status read got: the stored state (None: none stored) and the backend's clock
#: (µs); the BackendError that stopped the read; or None, nothing to read (see
#: ``has_shared_bucket``).
Peeked = tuple[BucketState | None, float] | BackendError | None


@dataclass(frozen=True, slots=True)
class BucketStatus:
    """One rule and its bucket's live state (for ``status``)."""

    rule: Rule
    stored: float | None  # None: no state stored (a full bucket)
    debt_ms: float
    shared: bool
    error: str | None = None
    #: Milliseconds until one permit would be granted (0: now); None: unknown (a closed
    #: or sliding_window rule, or the state could not be read).
    next_free_ms: float | None = None


def chosen_limits(registry: Registry, url: str | None) -> list[Rule]:
    """The limits ``status`` shows: every limit of ``url``, or of every URL, in order,
    each on its own with its interface's wait budget (the one that applies)."""
    snapshot = registry.snapshot
    rules = snapshot.rules
    urls = sorted(rules) if url is None else [url] if url in rules else []
    chosen = [(rules[u], limit) for u in urls for limit in rules[u].limits]
    # Capacity shares: each named caller's own rows too, and a channel's limits once.
    chosen += [
        (rule, limit)
        for (u, _), rule in sorted(snapshot.named.items())
        if u in urls
        for limit in rule.limits
        if limit.caller is not None
    ]
    seen: set[int] = set()
    shown = []
    for rule, limit in chosen:
        if limit.config_id not in seen:
            seen.add(limit.config_id)
            shown.append(replace(limit, cache=rule.cache, also=()))
    return shown


def has_shared_bucket(rule: Rule) -> bool:
    """True when ``rule``'s limit is one bucket for all callers, whose state peek reads."""
    return rule.algorithm not in WINDOWS and not rule.per_caller


def bucket_status(rule: Rule, shared: bool, peeked: Peeked) -> BucketStatus:
    """A limit's bucket as ``status`` shows it, from what ``peek`` read (see ``Peeked``)."""
    if peeked is None:
        return BucketStatus(rule, None, 0.0, shared)
    if isinstance(peeked, BackendError):
        return BucketStatus(rule, None, 0.0, shared, str(peeked))
    state, now_us = peeked
    next_free_ms = None
    if not rule.closed and has_shared_bucket(rule):
        # What one permit would wait now: the model's own answer, nothing written.
        verdict, _ = reserve(
            state, rule.per_second, rule.burst, 1, None, now_us, rule.warmup * US_PER_S
        )
        next_free_ms = verdict.wait_us / 1000.0
    if state is None:
        return BucketStatus(rule, None, 0.0, shared, next_free_ms=next_free_ms)
    current = resync(state, now_us)
    debt_ms = max(0.0, current.balance_us - now_us) / 1000.0
    return BucketStatus(rule, current.stored, debt_ms, shared, next_free_ms=next_free_ms)


def describe_state(rule: Rule, backend: Backend) -> BucketStatus:
    """A limit's shared bucket as ``status`` shows it, read from a (sync) backend.

    Windows and per-caller limits have no single bucket to show: no state is read.
    """
    peeked = attempt(backend.peek, rule) if has_shared_bucket(rule) else None
    return bucket_status(rule, backend.shared, peeked)
