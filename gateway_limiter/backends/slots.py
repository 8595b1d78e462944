"""What ``limiter.slot`` sends to Redis and gets back, without any I/O.

Two scripts (``backends/scripts.py`` holds the sources):

- ``slot``: ``slot.lua`` composed with both decision scripts. A take (``take_call``) is
  a free slot and the rate permit in one round trip, or a place in the interface's
  queue; a release (``release_call``), one round trip, hands the freed slot (and a
  rate permit) straight to the first caller queued and announces the grant on
  ``channel(prefix)`` (``parse_grant`` reads it), so that caller is only woken;
- ``slot_renew``: one call per interface for every lease this process holds on it (off
  the decision path, from the renewer).

Keys: ``<prefix>:{<interfaceUrl>}:slots`` (the leases), ``:slotq`` (the queue),
``:slotl`` (when each place in the queue lapses), ``:slotn`` (the ticket counter),
``:slota`` (what each queued caller asks of the rate), ``:slotg`` (grants not yet
claimed), under the interface's hash tag like its limits (``backends/state.py``), so
one call's keys share one Redis Cluster slot with the decision script's.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from gateway_limiter.backends.base import BackendError
from gateway_limiter.backends.scripts import Commands, ScriptCall, parse_reply
from gateway_limiter.backends.state import channel_tag, interface_base, own_limits
from gateway_limiter.config.rules import Rule
from gateway_limiter.model.bucket import Verdict

__all__ = [
    "SlotReply",
    "channel",
    "parse_grant",
    "parse_take",
    "release_call",
    "renew_call",
    "slot_keys",
    "take_call",
]

#: Where each decision script takes its timeout (µs) among its arguments, 1-based
#: (bucket.lua's ARGV[3], limits.lua's ARGV[2]): a release counts a waiter's budget
#: from the moment it hands the waiter a slot.
TIMEOUT_ARG = {"bucket": 3, "limits": 2}
#: The slot keys before a take's decision keys.
SLOT_KEYS = 6


def slot_keys(prefix: str, url: str, channel: str | None = None) -> list[str]:
    """The leases, the queue, its lapses, the ticket counter, the queued callers' asks
    of the rate and the unclaimed grants of ``url``: under the hash tag of its limits
    (its capped ``channel``'s where one caps it), so one script call touches one
    Cluster slot."""
    if channel is None:
        base = f"{interface_base(prefix, url)}:"
    else:
        base = f"{prefix}:{{{channel_tag(channel)}}}:{url}:"
    return [base + suffix for suffix in ("slots", "slotq", "slotl", "slotn", "slota", "slotg")]


def channel(prefix: str) -> str:
    """The channel a release is announced on (the message: the interface URL)."""
    return f"{prefix}:slot-free"


def _ms(seconds: float) -> str:
    return str(max(1, round(seconds * 1000)))


def _place_ms(seconds: float) -> str:
    return "0" if seconds <= 0 else _ms(seconds)


def class_slots(rule: Rule, cap: int) -> int:
    """The slots of ``cap`` a call decided by ``rule`` may fill: all of them for
    critical (or where no reserve is in play); for a class below critical, what its
    share of the slots (the largest of its interface's rows' reserves) leaves, rounded
    down, as ``slot.lua`` is asked and the in-process slots of an outage count."""
    if rule.shares is None:
        return cap
    share = max(rule.shares[: own_limits(rule)], default=0.0)
    return math.floor(cap - share * cap)


def take_call(
    commands: Commands,
    prefix: str,
    rule: Rule,
    timeout_s: float,
    caller: str | None,
    lease_id: str,
    lease_s: float,
    place_s: float,
) -> ScriptCall:
    """Take a slot of ``rule`` (its ``max_concurrent``) and one permit within
    ``timeout_s``, leased for ``lease_s`` under ``lease_id``; a place in the queue
    lapses after ``place_s`` unless asked again (0: take no place, the caller will not
    wait)."""
    decision = commands(rule, 1, timeout_s, caller, None)
    cap = rule.max_concurrent or 0
    if rule.shares is not None:
        # a class below critical (priority classes): it leaves its share of the slots
        # and takes no place in the queue, which would hold a slot for it ahead of a
        # critical caller
        cap, place_s = class_slots(rule, cap), 0.0
    numkeys = int(decision.args[0])
    keys, argv = decision.args[1 : 1 + numkeys], decision.args[1 + numkeys :]
    return ScriptCall(
        "slot",
        [
            numkeys + SLOT_KEYS,
            *slot_keys(prefix, rule.url, rule.channel),
            *keys,
            "take",
            str(cap),
            _ms(lease_s),
            lease_id,
            _place_ms(place_s),
            decision.name,
            str(TIMEOUT_ARG[decision.name]),
            *argv,
        ],
    )


def release_call(
    prefix: str,
    url: str,
    lease_id: str,
    max_concurrent: int,
    lease_s: float,
    capped: str | None = None,
) -> ScriptCall:
    """Give back the slot ``lease_id`` of ``url`` (or its place in the queue), handing
    it to the first caller queued while fewer than ``max_concurrent`` are held
    (``capped``: the channel whose hash tag its keys carry, as in ``slot_keys``)."""
    return ScriptCall(
        "slot",
        [
            SLOT_KEYS,
            *slot_keys(prefix, url, capped),
            "release",
            str(max_concurrent),
            _ms(lease_s),
            lease_id,
            channel(prefix),
        ],
    )


def renew_call(
    prefix: str, url: str, lease_ids: list[str], lease_s: float, channel: str | None = None
) -> ScriptCall:
    """Renew ``lease_ids`` of ``url`` for ``lease_s`` (none: count the live leases)."""
    keys = slot_keys(prefix, url, channel)
    return ScriptCall("slot_renew", [2, keys[0], keys[5], _ms(lease_s), *lease_ids])


class SlotReply(NamedTuple):
    """What a take (or a grant) answered: ``state`` 1 taken, 0 refused by the rate, 2
    queued; the calls in flight; when queued, the seconds until the first lease lapses
    (0: none) and the callers queued ahead; the rate's verdict (None when queued)."""

    state: int
    in_flight: int
    lapses_s: float
    ahead: int
    verdict: Verdict | None


TAKEN, REFUSED, QUEUED = 1, 0, 2


def _slot_reply(state: Any, in_flight: Any, lapses_ms: Any, ahead: Any, decision: Any) -> SlotReply:
    """The one reading of a slot's answer, from the script or from a grant's message
    (the rate's reply read by ``scripts.parse_reply``)."""
    verdict = None if decision is None else parse_reply(decision)
    if state not in (TAKEN, REFUSED, QUEUED) or (verdict is None) != (state == QUEUED):
        raise ValueError(state)
    return SlotReply(int(state), int(in_flight), float(lapses_ms) / 1000, int(ahead), verdict)


def parse_take(reply: Any) -> SlotReply:
    """``slot.lua``'s reply to a take (BackendError when it is not one)."""
    try:
        state, in_flight, lapses_ms, ahead, *decision = reply
        return _slot_reply(state, in_flight, lapses_ms, ahead, decision[0] if decision else None)
    except (TypeError, ValueError, BackendError) as e:
        raise BackendError(f"unexpected reply from the slot script: {reply!r}") from e


def parse_grant(message: bytes) -> tuple[str, SlotReply]:
    """A grant announced by a release: the lease id it went to, and what that caller's
    take would have answered (taken, or refused by the rate). BackendError when the
    message is not one."""
    try:
        lease_id, state, in_flight, decision = message.split(b"\n", 3)
        reply = _slot_reply(int(state), in_flight, 0, 0, decision)
        return lease_id.decode("utf-8", "surrogateescape"), reply
    except (TypeError, ValueError, BackendError) as e:
        raise BackendError(f"unexpected slot grant: {message!r}") from e


def parse_counts(reply: Any) -> tuple[int, int]:
    """A release's or renewal's reply: (leases released or renewed, leases live)."""
    try:
        done, live = reply
        return int(done), int(live)
    except (TypeError, ValueError) as e:
        raise BackendError(f"unexpected reply from a slot script: {reply!r}") from e
