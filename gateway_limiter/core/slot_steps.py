"""``limiter.slot`` as steps, written once for both shells: taking a slot (asking Redis,
queueing for a grant, or this process's share of the slots while Redis is away),
holding it through the rate permit's wait, giving it back, renewing the leases and
counting the calls in flight. Each is a generator of ``core/steps.py``'s steps, with no
I/O: the shells carry the steps out (``shell_async.py``, and ``shell.py`` generated
from it). What the steps share, the slots' state, is ``core/slots.py``.
"""

from __future__ import annotations

import asyncio

from gateway_limiter.backends.base import BackendError
from gateway_limiter.backends.slots import class_slots, parse_counts, parse_take
from gateway_limiter.config.rules import Rule
from gateway_limiter.core.pipeline import LimiterCore
from gateway_limiter.core.slots import (
    Held,
    Moved,
    SlotState,
    Taking,
    Waiter,
    fallback_cap,
    given_up,
    pause_s,
)
from gateway_limiter.core.steps import (
    START_RENEWER,
    SUBSCRIBE,
    Ask,
    Await,
    Reserve,
    Send,
    Shield,
    Sleep,
    Steps,
)

__all__ = ["counting", "giving_back", "holding", "renewing", "take_slot"]


def take_slot(core: LimiterCore, state: SlotState, taking: Taking, waiter: Waiter) -> Steps[Held]:
    """One ``slot()`` taking its slot, as steps for the shell: ask Redis (a grant heard
    needs no asking), wait in the queue for a grant, or, while Redis cannot be asked (or
    on ``memory://``), take one of this process's share of the slots and the rate
    permit from the failure policy (the backend, in-process). The slot, or ``Refused``."""
    rule = taking.rule
    url = rule.url
    failed = False
    while True:
        seen = state.wakeups.generation(url)
        remaining = taking.remaining()
        # a release handed this caller a slot: go, whatever the breaker says (Redis
        # published it), before the lease it was handed lapses
        granted = waiter.claim() if core._shared else None
        if granted is not None or (core._shared and not failed and core._breaker.allows()):
            if not state.subscribed:
                yield SUBSCRIBE
            reply = granted
            if reply is None:
                call = taking.call(state, core.settings, remaining)
                abandoned = giving_back(state, given_up(rule, taking.lease_id))
                asked = yield Send(call, parse_take, abandoned)
                if isinstance(asked, BackendError):
                    core._backend_failed(asked)
                    failed = True  # the failure policy decides this attempt
                    continue
                reply = asked
            held = taking.answered(core, state, reply, remaining)
            if held is None:
                yield Await(waiter, pause_s(remaining, reply.lapses_s, state.listening))
                continue
            yield START_RENEWER
            return held
        # memory://: the whole cap here; Redis away: the failure policy's share of it,
        # less the slots this process still holds through Redis (taken before the
        # outage, still in flight): they count against its share too
        if core._shared:
            cap = fallback_cap(core.policy.kind, rule, core._fleet.size)
            if cap is not None:
                cap -= state.leases.on(url)
        else:
            cap = rule.max_concurrent
        if cap is not None:  # a class below critical leaves its share of them free
            cap = class_slots(rule, cap)
        if cap is not None and not state.local.take(url, cap):
            taking.no_local_slot(core, state, remaining)
            # a local release wakes this; so does the breaker's next probe
            moved = Moved(state.wakeups, url, seen)
            yield Await(moved, min(remaining, max(0.01, core.settings.breaker_seconds)))
            failed = False  # Redis may be asked again, once the breaker allows
            continue
        if core._shared:
            outcome = core._settled(rule, *core._fall_back(rule, 1, remaining, taking.key))
        else:
            ask = Ask(rule, 1, remaining, taking.key, None)
            outcome = core._finish(ask, (yield Reserve(ask)))
        return taking.local_answered(core, state, outcome, remaining, cap)


def holding(
    core: LimiterCore,
    state: SlotState,
    rule: Rule,
    budget_s: float,
    key: str | None,
    loop: asyncio.AbstractEventLoop | None = None,
) -> Steps[Held]:
    """``slot()``'s slot of ``rule`` for ``key`` within ``budget_s``, as steps: taken
    (``take_slot``; ``loop``: the asyncio waiter's, None for a thread), then the rate
    permit's wait slept with the slot held. A caller that leaves early (refused after
    queueing, or interrupted) gives back its place or its slot, shielded."""
    lease_id = state.leases.new_id()
    clock = core.clock
    taking = Taking(rule, key, lease_id, clock.monotonic() + budget_s, budget_s, clock=clock)
    waiter = state.waiter(lease_id, loop)
    held: Held | None = None
    try:
        held = yield from take_slot(core, state, taking, waiter)
        if held.wait_s > 0:  # the rate permit's wait, the slot held
            yield Sleep(held.wait_s)
        return held
    except GeneratorExit:
        raise
    except BaseException:
        if held is not None:  # interrupted in the rate's wait: give the slot back
            yield Shield(giving_back(state, held))
        elif taking.placed:  # refused after waiting, or interrupted: give the place up
            yield Shield(giving_back(state, given_up(rule, lease_id)))
        raise
    finally:
        state.forget(lease_id)


def giving_back(state: SlotState, held: Held) -> Steps[None]:
    """Give back a slot, as steps: one round trip (none for this process's own slots);
    a failure leaves the lease to lapse."""
    call = state.give_back(held)
    if call is not None:
        state.counted(held.url, (yield Send(call, parse_counts)))


def renewing(state: SlotState) -> Steps[None]:
    """Renew every slot lease this limiter holds, one script call per interface (every
    third of ``slot_lease``, once a slot is taken: the shell's renewer)."""
    for call in state.renewals():
        yield Send(call, parse_counts)


def counting(shared: bool, state: SlotState, rule: Rule) -> Steps[int]:
    """``rule``'s calls in flight fleet-wide (one round trip), as steps; this process's
    own count on ``memory://`` or when Redis cannot be asked."""
    url = rule.url
    if not shared:
        return state.local.in_flight(url)
    counted = state.counted(url, (yield Send(state.count_call(rule), parse_counts)))
    return state.local.in_flight(url) if counted is None else counted
