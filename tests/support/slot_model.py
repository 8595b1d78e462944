"""A Python model of ``slot.lua`` and ``slot_renew.lua`` (``backends/slots.py`` sends them).

What the two scripts keep, under one interface's six keys, and what they answer, line
for line: leases (id -> expiry, ms on the store's clock), the queue (id -> ticket), when
each place lapses, the ticket counter, what each queued caller asks of the rate, and
grants not yet claimed. ``tests/redis/test_slot_script_matches_model.py`` holds it equal
to the Lua on a real Redis (the Lua's ``TIME`` driven), so the simulated fleet
(``tests/support/sim.py``) can run slots while its store answers.

The rate part, which ``slot.lua`` asks of ``bucket.lua`` or ``limits.lua`` with the
caller's keys and arguments, is a function given to the model (``Rate``): the decision
scripts have models of their own. Not modelled: the keys' own expiries (each key is
kept at least a second past everything in it, so an expired key holds only what the
scripts drop as lapsed anyway; the ticket counter may restart, which changes no order).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway_limiter.backends.scripts import ScriptCall

#: (kind "bucket" or "limits", the decision's keys, its arguments) -> its reply (six
#: packed doubles, the first allowed, the second the wait in µs)
Rate = Callable[[str, list[str], list[Any]], bytes]
#: waiters the rate may refuse in one release (slot.lua's HAND_OVER_TRIES)
HAND_OVER_TRIES = 8


def admitted(reply: bytes) -> bool:
    return bool(struct.unpack_from("<d", reply)[0] == 1)


def wait_us(reply: bytes) -> float:
    return float(struct.unpack_from("<dd", reply)[1])


@dataclass
class Ask:
    """What a queued caller left in KEYS[5] (slot.lua's msgpack table)."""

    kind: str
    keys: list[str]
    argv: list[Any]
    timeout_at: int  # 1-based index of the timeout among argv
    deadline_ms: float  # -1: none
    lease_ms: float


@dataclass
class Interface:
    """One interface's six keys."""

    leases: dict[str, float] = field(default_factory=dict)
    queue: dict[str, int] = field(default_factory=dict)
    lapses: dict[str, float] = field(default_factory=dict)
    counter: int = 0
    asks: dict[str, Ask] = field(default_factory=dict)
    grants: dict[str, bytes] = field(default_factory=dict)

    def copy(self) -> Interface:
        return Interface(
            dict(self.leases),
            dict(self.queue),
            dict(self.lapses),
            self.counter,
            dict(self.asks),
            dict(self.grants),
        )

    def leave_queue(self, who: str) -> None:
        self.queue.pop(who, None)
        self.lapses.pop(who, None)
        self.asks.pop(who, None)

    def drop_lapsed(self, now_ms: float) -> None:
        for who in [w for w, until in self.leases.items() if until <= now_ms]:
            del self.leases[who]
            self.grants.pop(who, None)

    def head(self) -> str | None:
        if not self.queue:
            return None
        return min(self.queue, key=lambda w: (self.queue[w], w.encode("utf-8", "surrogateescape")))

    def lease(self, who: str, reply: bytes, ms: float, now_ms: float) -> float:
        lapses_ms = math.ceil(wait_us(reply) / 1000) + ms
        self.leases[who] = now_ms + lapses_ms
        return lapses_ms


class SlotModel:
    """Every interface's slots, as the two scripts keep them (keyed by the leases key)."""

    def __init__(self) -> None:
        self.interfaces: dict[str, Interface] = {}
        #: (channel, message) of every grant a release published
        self.published: list[tuple[str, bytes]] = []

    def copy(self) -> SlotModel:
        other = SlotModel()
        other.interfaces = {k: v.copy() for k, v in self.interfaces.items()}
        return other

    def live(self, leases_key: str, now_ms: float) -> dict[str, float]:
        """The leases of one interface that have not lapsed at ``now_ms``."""
        held = self.interfaces.get(leases_key)
        return {} if held is None else {w: t for w, t in held.leases.items() if t > now_ms}

    def run(self, call: ScriptCall, now_ms: float, rate: Rate) -> Any:
        """``call`` (a ``slot`` or ``slot_renew`` ScriptCall) at ``now_ms``."""
        numkeys = int(call.args[0])
        keys = [str(k) for k in call.args[1 : 1 + numkeys]]
        argv = list(call.args[1 + numkeys :])
        if call.name == "slot_renew":
            return self.renew(keys, argv, now_ms)
        if call.name != "slot":
            raise ValueError(call.name)
        iface = self.interfaces.setdefault(keys[0], Interface())
        op, cap, lease_ms, who = str(argv[0]), float(argv[1]), float(argv[2]), str(argv[3])
        iface.drop_lapsed(now_ms)
        for gone in [w for w, until in iface.lapses.items() if until <= now_ms]:
            iface.leave_queue(gone)
        if op == "release":
            return self._release(iface, who, cap, now_ms, str(argv[4]), rate)
        return self._take(iface, keys, argv, who, cap, lease_ms, now_ms, rate)

    def _release(
        self, iface: Interface, who: str, cap: float, now_ms: float, channel: str, rate: Rate
    ) -> list[int]:
        removed = 1 if iface.leases.pop(who, None) is not None else 0
        iface.leave_queue(who)
        iface.grants.pop(who, None)
        held, tries = len(iface.leases), 0
        while held < cap and tries < HAND_OVER_TRIES:
            head = iface.head()
            if head is None:
                break
            ask = iface.asks.get(head)
            iface.leave_queue(head)
            if ask is None:
                continue
            tries += 1
            argv = list(ask.argv)
            if ask.deadline_ms >= 0:
                argv[ask.timeout_at - 1] = _lua_number(max(0.0, ask.deadline_ms - now_ms) * 1000)
            reply = rate(ask.kind, ask.keys, argv)
            state = 0
            if admitted(reply):
                state, held = 1, held + 1
                iface.lease(head, reply, ask.lease_ms, now_ms)
                iface.grants[head] = reply
            message = f"{head}\n{state}\n{held}\n".encode("utf-8", "surrogateescape") + reply
            self.published.append((channel, message))
        return [removed, held]

    def _take(
        self,
        iface: Interface,
        keys: list[str],
        argv: list[Any],
        who: str,
        cap: float,
        lease_ms: float,
        now_ms: float,
        rate: Rate,
    ) -> list[Any]:
        held = len(iface.leases)
        if who in iface.leases:  # a release handed this caller a slot
            granted = iface.grants.pop(who, None)
            if granted is not None:
                return [1, held, 0, 0, granted]
        place_ms = float(argv[4])
        ahead = _rank(iface, who)
        kind, timeout_at = str(argv[5]), int(argv[6])
        rate_keys, rate_argv = keys[6:], argv[7:]
        if held + ahead < cap:
            reply = rate(kind, rate_keys, rate_argv)
            iface.leave_queue(who)
            if admitted(reply):
                iface.lease(who, reply, lease_ms, now_ms)
                return [1, held + 1, 0, 0, reply]
            return [0, held, 0, 0, reply]
        if place_ms > 0:
            if who not in iface.queue:
                iface.counter += 1
                iface.queue[who] = iface.counter
            iface.lapses[who] = now_ms + place_ms
            budget_us = float(rate_argv[timeout_at - 1])
            deadline = -1.0 if budget_us < 0 else now_ms + math.floor(budget_us / 1000)
            iface.asks[who] = Ask(kind, rate_keys, list(rate_argv), timeout_at, deadline, lease_ms)
        lapses = 0
        if iface.leases:
            first = min(iface.leases.values())
            lapses = int(max(1, first - now_ms))
        return [2, held, lapses, ahead]

    def renew(self, keys: list[str], argv: list[Any], now_ms: float) -> list[int]:
        iface = self.interfaces.setdefault(keys[0], Interface())
        until_ms = now_ms + float(argv[0])
        iface.drop_lapsed(now_ms)
        renewed = 0
        for who in argv[1:]:
            held = iface.leases.get(str(who))
            if held is not None:
                if held < until_ms:
                    iface.leases[str(who)] = until_ms
                renewed += 1
        return [renewed, len(iface.leases)]


def _rank(iface: Interface, who: str) -> int:
    """ZRANK of ``who`` in the queue, else ZCARD (slot.lua's ``ahead``)."""
    if who not in iface.queue:
        return len(iface.queue)
    mine = (iface.queue[who], who.encode("utf-8", "surrogateescape"))
    return sum(
        1 for w, t in iface.queue.items() if (t, w.encode("utf-8", "surrogateescape")) < mine
    )


def _lua_number(value: float) -> str:
    """``tostring`` of a Lua number (``%.14g``)."""
    return f"{value:.14g}"
