"""Every backend operation as what a transport sends and what its reply means, no I/O.

A Redis transport (one Redis, Sentinel, Cluster; threads or asyncio) knows two ways to
send: a script call (``ScriptCall``, ``backends/scripts.py``: a decision, a pushback, a
slot's or a lease's call), and a ``Batch`` of plain commands pipelined in one round trip
on the server that holds a key (a status peek, the fleet's heartbeat and members). This
module builds both for each operation, and reads their replies, once for every
transport: ``Calls`` knows the keys (``backends/state.py``, ``fleet.py``), the parsers
say what each reply means, and ``verdict`` applies the queued-time correction of a
decision written after it was asked for. ``backends/operations_async.py`` (and its
generated twin ``operations.py``) send them through a transport.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

from gateway_limiter.backends import fleet
from gateway_limiter.backends.base import BackendError, PeekedPushback, PeekedState
from gateway_limiter.backends.scripts import (
    IN_PAIR,
    Commands,
    clock_us,
    describe,
    is_sliding,
    parse_limit_state,
    parse_pushback,
    parse_pushback_state,
    parse_reply,
    parse_state,
    pushback_peek_key,
    queued_verdict,
)
from gateway_limiter.backends.state import bucket_home, state_key
from gateway_limiter.config.rules import Rule
from gateway_limiter.model.bucket import Verdict

__all__ = ["Batch", "Calls", "Command", "pushed", "verdict"]

#: One command of a batch: the redis-py client method, its arguments and keywords.
Command = tuple[str, tuple[Any, ...], dict[str, Any]]

_NONE: dict[str, Any] = {}


class Batch(NamedTuple):
    """Plain commands sent in one round trip on the server that holds ``key`` (on a
    cluster: its slot's master), and what their replies (in order; an error reply as
    the exception, not raised) mean."""

    key: str
    commands: tuple[Command, ...]
    parse: Callable[[list[Any]], Any]


def verdict(reply: Any, queued_s: float) -> Verdict:
    """A decision script's reply as a Verdict, counted from when it was asked for:
    ``queued_s`` after that it was written (``scripts.queued_verdict``)."""
    return queued_verdict(parse_reply(reply), queued_s)


def pushed(reply: Any, queued_s: float) -> tuple[float, float]:
    """``pushback.lua``'s reply (``scripts.parse_pushback``)."""
    return parse_pushback(reply)


def _ok(reply: Any) -> Any:
    """``reply``, unless it is an error reply: then BackendError, as the client's."""
    if isinstance(reply, Exception):
        raise BackendError(describe(reply)) from reply
    return reply


def _peeked(rule: Rule, replies: list[Any]) -> PeekedState:
    raw, time_reply = replies
    if isinstance(raw, Exception):  # WRONGTYPE: another value there, lost state
        raw = None
    return parse_limit_state(rule, raw), clock_us(_ok(time_reply))


def _peeked_pair(replies: list[Any]) -> PeekedState:
    raw, time_reply = replies
    if isinstance(raw, Exception):
        raw = None
    return parse_state(raw, IN_PAIR), clock_us(_ok(time_reply))


def _peeked_pushback(layout: str, replies: list[Any]) -> PeekedPushback:
    raw, time_reply = replies
    return parse_pushback_state(_ok(raw), layout), clock_us(_ok(time_reply))


def _beat(replies: list[Any]) -> fleet.Heartbeat:
    return fleet.parse_heartbeat(_ok(replies[0]))


def _members(replies: list[Any]) -> tuple[list[tuple[str, float]], float]:
    entries, time_reply = replies
    return fleet.members_reply(_ok(entries), _ok(time_reply))


def _tallies(replies: list[Any]) -> dict[str, dict[str, float]]:
    entries, time_reply, stored = (_ok(r) for r in replies)
    live, _ = fleet.parse_members(entries, time_reply)
    return fleet.sum_tallies(stored, {m.member for m in live})


_TIME: Command = ("time", (), _NONE)


class Calls:
    """What each operation sends, for one ``key_prefix``: the decisions' script calls
    (``Commands``, which keeps what depends only on the rule) and the batches."""

    __slots__ = ("_prefix", "commands")

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        #: the decisions' and pushbacks' script calls (its ``clock``: a calendar
        #: quota's boundaries are computed from it)
        self.commands = Commands(prefix)

    def peek(self, rule: Rule) -> Batch:
        """GET (a sliding window: LRANGE) of ``rule``'s own shared limit, and TIME (a
        bucket beside a calendar quota: of the quota's key, ``bucket_home``)."""
        home = bucket_home(rule)
        if home is not rule:
            key = state_key(self._prefix, home)
            return Batch(key, (("get", (key,), _NONE), _TIME), _peeked_pair)
        key = state_key(self._prefix, rule)
        read: Command = (
            ("lrange", (key, 0, -1), _NONE) if is_sliding(rule) else ("get", (key,), _NONE)
        )
        return Batch(key, (read, _TIME), functools.partial(_peeked, rule))

    def peek_pushback(self, rule: Rule) -> Batch:
        """GET of what pushbacks left on ``rule``'s interface for all callers, and TIME."""
        key, layout = pushback_peek_key(self._prefix, rule)
        return Batch(
            key, (("get", (key,), _NONE), _TIME), functools.partial(_peeked_pushback, layout)
        )

    def heartbeat(self, member: str, ttl_ms: int, demand: str, tallies: str | None) -> Batch:
        """One EVAL of the fleet's heartbeat (``backends/fleet.py``) where the set lives."""
        args = fleet.heartbeat_args(self._prefix, member, ttl_ms, demand, tallies)
        return Batch(fleet.fleet_key(self._prefix), (("eval", args, _NONE),), _beat)

    def members(self) -> Batch:
        """ZRANGE of the fleet's set with its scores, and TIME."""
        key = fleet.fleet_key(self._prefix)
        zrange: Command = ("zrange", (key, 0, -1), {"withscores": True})
        return Batch(key, (zrange, _TIME), _members)

    def fleet_tallies(self) -> Batch:
        """The fleet's set, TIME and the members' tallies, summed over the live ones."""
        key = fleet.fleet_key(self._prefix)
        zrange: Command = ("zrange", (key, 0, -1), {"withscores": True})
        stored: Command = ("hgetall", (fleet.tallies_key(self._prefix),), _NONE)
        return Batch(key, (zrange, _TIME, stored), _tallies)
