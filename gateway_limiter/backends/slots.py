"""What ``limiter.slot`` sends to Redis and gets back, without any I/O.

Three script calls (``backends/scripts.py`` holds the sources):

- take: ``slot.lua`` composed with the interface's decision script (``slot_bucket`` or
  ``slot_limits``): a free slot and the rate permit in one round trip, or a place in
  the interface's queue;
- release: ``slot_release.lua``, one round trip, announcing the freed slot on
  ``channel(prefix)`` when callers are queued;
- renew: ``slot_renew.lua``, one call per interface for every lease this process holds
  on it (off the decision path, from the renewer).

Keys: ``<prefix>:{<interfaceUrl>}:slots`` (the leases), ``:slotq`` (the queue),
``:slotl`` (when each place in the queue lapses), ``:slotn`` (the ticket counter),
under the interface's hash tag like its limits (``backends/state.py``), so one call's
keys share one Redis Cluster slot with the decision script's.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from gateway_limiter.backends.base import BackendError
from gateway_limiter.backends.scripts import Commands, ScriptCall, parse_reply
from gateway_limiter.config.rules import Rule
from gateway_limiter.model.bucket import Verdict

__all__ = ["SlotReply", "channel", "release_call", "renew_call", "slot_keys", "take_call"]


def slot_keys(prefix: str, url: str) -> list[str]:
    """The leases, the queue, its lapses and the ticket counter of ``url``."""
    base = f"{prefix}:{{{url}}}:"
    return [base + "slots", base + "slotq", base + "slotl", base + "slotn"]


def channel(prefix: str) -> str:
    """The channel a release is announced on (the message: the interface URL)."""
    return f"{prefix}:slot-free"


def _ms(seconds: float) -> str:
    return str(max(1, round(seconds * 1000)))


def _place_ms(seconds: float) -> str:
    return "0" if seconds <= 0 else _ms(seconds)


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
    numkeys = int(decision.args[0])
    keys, argv = decision.args[1 : 1 + numkeys], decision.args[1 + numkeys :]
    return ScriptCall(
        f"slot_{decision.name}",
        [
            numkeys + 4,
            *slot_keys(prefix, rule.url),
            *keys,
            str(rule.max_concurrent),
            _ms(lease_s),
            lease_id,
            _place_ms(place_s),
            *argv,
        ],
    )


def release_call(prefix: str, url: str, lease_id: str) -> ScriptCall:
    """Give back the slot ``lease_id`` of ``url``, or its place in the queue."""
    leases, queue, lapses = slot_keys(prefix, url)[:3]
    return ScriptCall("slot_release", [3, leases, queue, lapses, lease_id, channel(prefix), url])


def renew_call(prefix: str, url: str, lease_ids: list[str], lease_s: float) -> ScriptCall:
    """Renew ``lease_ids`` of ``url`` for ``lease_s`` (none: count the live leases)."""
    return ScriptCall("slot_renew", [1, slot_keys(prefix, url)[0], _ms(lease_s), *lease_ids])


class SlotReply(NamedTuple):
    """What a take answered: ``state`` 1 taken, 0 refused by the rate, 2 queued; the
    calls in flight; when queued, the seconds until the first lease lapses (0: none)
    and the callers queued ahead; the rate's verdict (None when queued)."""

    state: int
    in_flight: int
    lapses_s: float
    ahead: int
    verdict: Verdict | None

    def releases_needed(self, max_concurrent: int | None) -> int:
        """Releases to hear before a queued caller could have a slot: those ahead of it
        take the first ones."""
        return max(1, self.in_flight + self.ahead - (max_concurrent or 0) + 1)


TAKEN, REFUSED, QUEUED = 1, 0, 2


def parse_take(reply: Any) -> SlotReply:
    """``slot.lua``'s reply (BackendError when it is not one)."""
    try:
        state, in_flight, lapses_ms, ahead, *decision = reply
        verdict = parse_reply(*decision) if decision else None
        if state not in (TAKEN, REFUSED, QUEUED) or (verdict is None) != (state == QUEUED):
            raise ValueError(state)
        return SlotReply(int(state), int(in_flight), float(lapses_ms) / 1000, int(ahead), verdict)
    except (TypeError, ValueError, BackendError) as e:
        raise BackendError(f"unexpected reply from the slot script: {reply!r}") from e


def parse_counts(reply: Any) -> tuple[int, int]:
    """A release's or renewal's reply: (leases released or renewed, leases live)."""
    try:
        done, live = reply
        return int(done), int(live)
    except (TypeError, ValueError) as e:
        raise BackendError(f"unexpected reply from a slot script: {reply!r}") from e
