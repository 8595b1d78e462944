"""A started limiter in a process that forks: what the child and the parent do.

How it works: docs/internals.md, section ``gateway_limiter.lifecycle``.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any, Final, Literal

from gateway_limiter.core.failure import attempt_async
from gateway_limiter.observe.logs import log
from gateway_limiter.observe.metrics import after_fork_in_child

#: How a limiter runs its background work: threads, or tasks of an event loop.
Kind = Literal["threaded", "asyncio"]
THREADED: Final[Kind] = "threaded"
ASYNCIO: Final[Kind] = "asyncio"

#: id -> (limiter, kind) for every started limiter of this process. Replaced whole on
#: each change (under ``_lock``), so a fork hook reads it without a lock: another
#: thread may hold the lock at the fork, and the child has no such thread to let it go.
_watched: dict[int, tuple[Any, Kind]] = {}
_lock = threading.Lock()
#: What children keep of their parent's limiters, unused: finalising them would close
#: the parent's sockets or unregister them from the parent's event loop (which shares
#: its epoll instance with the child).
_left_behind: list[object] = []
#: The parents' limiters that left the fleet at a fork and rejoin on their next decision.
_parked: set[int] = set()


def watch(limiter: Any, kind: Kind) -> None:
    """``limiter`` has started: restart it in a forked child, and let a forking parent
    leave the fleet."""
    global _watched  # noqa: PLW0603 - replaced whole: see _watched
    with _lock:
        _watched = {**_watched, id(limiter): (limiter, kind)}


def unwatch(limiter: Any) -> None:
    """``limiter`` is closing: nothing to do for it at a fork any more."""
    global _watched  # noqa: PLW0603 - replaced whole: see _watched
    with _lock:
        if id(limiter) in _watched:
            _watched = {k: v for k, v in _watched.items() if k != id(limiter)}
        _parked.discard(id(limiter))


# --- the child ----------------------------------------------------------------------------


def _in_child() -> None:
    global _lock  # noqa: PLW0603 - the parent's may be held by a thread the child lacks
    _lock = threading.Lock()
    _parked.clear()
    after_fork_in_child()
    for limiter, kind in list(_watched.values()):
        try:
            _restart(limiter, kind)
        except Exception:  # a fork must never fail on the limiter's account
            log.exception("could not restart the limiter in the forked process %d", os.getpid())


def _restart(limiter: Any, kind: Kind) -> None:
    """Build ``limiter`` afresh from its settings in this (forked) process and start it."""
    old_registry = limiter.registry
    _left_behind.append(_attributes(limiter))
    # The pool's connections are the parent's: forget them without closing them (closing
    # one, or a rollback when it is returned, would go over the parent's socket).
    old_registry.engine.dispose(close=False)
    limits = old_registry.snapshot  # a value: the last good limits, until the first reload
    limiter._started = False
    metrics, source = limiter._metrics, limiter._source
    if metrics is not None and source is not None and not metrics.multiprocess:
        metrics.detach(source)  # the process's metrics stay (a copy): not the old source
    type(limiter).__init__(limiter, limiter.settings)
    limiter.registry.snapshot = limits
    limiter._heartbeats = None
    # The reloads start now (a thread), so that the child follows the table whatever it
    # decides on; the fleet counts it from its first decision on a limited interface.
    limiter._running(limiter.registry.start())
    _beat_on_first_decision(limiter, kind)


def _attributes(limiter: Any) -> dict[str, object]:
    """Everything ``limiter`` holds now (slots and instance dict), to keep unused."""
    held: dict[str, object] = dict(getattr(limiter, "__dict__", {}))
    for cls in type(limiter).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if name not in held and hasattr(limiter, name):
                held[name] = getattr(limiter, name)
    return held


def _join_fleet(limiter: Any) -> None:
    """Beat now, then every ``fleet_heartbeat`` s: on a thread of its own (threaded), or
    as a task of the running loop (asyncio), never on the deciding caller's time."""
    if limiter._shared and limiter._started and limiter._heartbeats is None:
        limiter._start_heartbeats(join=True)
        limiter._keep_quotas_from_now()  # the calendar quotas' keeper, as the heartbeats


def _beat_on_first_decision(limiter: Any, kind: Kind) -> None:
    """Until ``limiter``'s next decision on a limited interface, that decision also has
    it join the fleet (once; every later decision counts as before, at no extra cost)."""
    count = limiter._fleet.tallies.add
    once = [kind]

    def first(url: str, allowed: bool, waited: bool) -> None:
        limiter._tally = count
        count(url, allowed, waited)
        try:
            once.pop()  # atomic: of two threads deciding at once, one has it join
        except IndexError:
            return
        _parked.discard(id(limiter))
        _join_fleet(limiter)

    limiter._tally = first


# --- the parent ---------------------------------------------------------------------------


def _in_parent() -> None:
    for limiter, kind in list(_watched.values()):
        if id(limiter) in _parked or not limiter._shared:
            continue
        try:
            _leave_fleet(limiter, kind)
        except Exception:
            log.exception("could not leave the fleet after a fork")


def _leave_fleet(limiter: Any, kind: Kind) -> None:
    """The parent forked: stop beating and leave the fleet until it decides again."""
    _parked.add(id(limiter))
    if kind == THREADED:
        limiter._stop_heartbeats()  # joins the heartbeat thread, then leaves the set
        _beat_on_first_decision(limiter, kind)
        return
    task, limiter._heartbeats = limiter._heartbeats, None
    if task is not None:
        task.cancel()
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None  # no loop here: the membership lapses after its time to live
    if loop is not None and limiter.backend_healthy:
        fleet = limiter._fleet
        leaving = loop.create_task(attempt_async(limiter.backend.heartbeat, fleet.member, 0))
        _left_behind.append(leaving)  # keep a reference until it has run
        leaving.add_done_callback(_left_behind.remove)
    _beat_on_first_decision(limiter, kind)


os.register_at_fork(after_in_child=_in_child, after_in_parent=_in_parent)
