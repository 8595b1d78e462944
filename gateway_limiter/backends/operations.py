# This file is generated from gateway_limiter/backends/operations_async.py
# by scripts/generate_sync.py: do not edit it. Change backends/operations_async.py
# (and the twins it uses), then run `python scripts/generate_sync.py`; CI fails while
# this file is stale (`--check`). How: docs/design.md, "One shell, two ways to wait",
# and the script's docstring.
"""``Operations``: every backend operation written once, over a narrow threaded transport.

A threaded Redis transport (``RedisBackend``, ``SentinelBackend``,
``RedisClusterBackend``) implements only how to send: ``call``, ``batch``,
``subscribe``, ``close`` and ``prepare`` (``backends/base.py``'s ``Transport``). What
each operation sends and what its reply means is ``backends/calls.py`` (no I/O).

This module is generated from ``gateway_limiter/backends/operations_async.py`` by
``scripts/generate_sync.py``.
"""

from __future__ import annotations

from typing import Any

from gateway_limiter.backends import fleet
from gateway_limiter.backends.base import Clocks, Heard, Listener, PeekedPushback, PeekedState
from gateway_limiter.backends.calls import Batch, Calls, pushed, verdict
from gateway_limiter.backends.scripts import Commands, ScriptCall
from gateway_limiter.config.rules import Rule
from gateway_limiter.config.settings import Settings
from gateway_limiter.model.bucket import Verdict

__all__ = ["Operations"]


class Operations:
    """The operations of a backend (``backends/base.py``'s ``Backend``) over the
    transport a subclass implements (``Transport``: ``call``, ``batch``,
    ``subscribe``, ``close``, and ``prepare``)."""

    __slots__ = ("_calls", "_commands", "_prefix")

    #: True: the state is shared between processes (the transports' is in Redis).
    shared = True

    def _use(self, settings: Settings, clocks: Clocks) -> None:
        """Build the calls for ``settings.key_prefix`` (from a transport's ``__init__``);
        ``clocks.wall``: the limiter's wall clock, where a calendar quota's boundaries
        are computed from (the script picks among them by the server's clock)."""
        self._prefix = settings.key_prefix
        self._calls = Calls(settings.key_prefix)
        self._commands: Commands = self._calls.commands
        self._commands.clock = clocks.wall

    def call(self, call: ScriptCall) -> tuple[Any, float]:
        """Send ``call`` where its keys live: its raw reply, and how long after it was
        asked for it was written (s; 0.0: at once). BackendError when unanswered."""
        raise NotImplementedError

    def batch(self, batch: Batch) -> list[Any]:
        """Send ``batch``'s commands in one round trip on the server that holds its key:
        the replies in order (an error reply as the exception). BackendError when
        unanswered."""
        raise NotImplementedError

    def subscribe(self, channel: str, heard: Heard) -> Listener | None:
        """Hear ``channel``'s messages on a connection of its own, on a thread of its
        own (``backends/subscriptions.py``); None when no subscription can be made."""
        raise NotImplementedError

    def prepare(self) -> None:
        """Get ready for decisions (load the scripts); BackendError when unreachable."""
        raise NotImplementedError

    def close(self) -> None:
        """Release connections."""
        raise NotImplementedError

    def reserve(
        self,
        rule: Rule,
        permits: int,
        timeout: float | None,
        caller: str | None = None,
        *,
        now: float | None = None,
    ) -> Verdict:
        """One script call of ``bucket.lua`` or ``limits.lua`` (``now``, µs: for tests
        that drive the clock)."""
        return verdict(*self.call(self._commands(rule, permits, timeout, caller, now)))

    def pushback(
        self,
        rule: Rule,
        retry_after: float | None,
        caller: str | None = None,
        *,
        now: float | None = None,
    ) -> tuple[float, float]:
        """One script call of ``pushback.lua`` (``now``, µs: for tests that drive the clock)."""
        return pushed(*self.call(self._commands.pushback(rule, retry_after, caller, now)))

    def script(self, call: ScriptCall) -> Any:
        """Any other script call the core packed (slots', leases'): its raw reply."""
        reply, _queued_s = self.call(call)
        return reply

    def peek(self, rule: Rule) -> PeekedState:
        """The stored state of ``rule``'s own shared limit, and the server's clock (µs)."""
        batch = self._calls.peek(rule)
        return batch.parse(self.batch(batch))  # type: ignore[no-any-return]

    def peek_pushback(self, rule: Rule) -> PeekedPushback:
        """What pushbacks left on ``rule``'s interface, and the server's clock (µs)."""
        batch = self._calls.peek_pushback(rule)
        return batch.parse(self.batch(batch))  # type: ignore[no-any-return]

    def heartbeat(
        self, member: str, ttl_ms: int, demand: str = "", tallies: str | None = None
    ) -> fleet.Heartbeat:
        """The fleet's heartbeat (``backends/fleet.py``), in one round trip."""
        batch = self._calls.heartbeat(member, ttl_ms, demand, tallies)
        return batch.parse(self.batch(batch))  # type: ignore[no-any-return]

    def members(self) -> tuple[list[tuple[str, float]], float]:
        """The live members with the moment each dies (ms), and the server's clock (ms)."""
        batch = self._calls.members()
        return batch.parse(self.batch(batch))  # type: ignore[no-any-return]

    def fleet_tallies(self) -> dict[str, dict[str, float]]:
        """The fleet's live numbers per interface, summed over the live members."""
        batch = self._calls.fleet_tallies()
        return batch.parse(self.batch(batch))  # type: ignore[no-any-return]
