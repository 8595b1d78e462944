"""Every descriptor of one request decided together, all or nothing, on the limiter.

How it works: docs/internals.md, section ``gateway_limiter.rls.judge``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.backends.base import BackendError
from gateway_limiter.backends.scripts import REPLY, Commands, ScriptCall, parse_reply
from gateway_limiter.core import engine
from gateway_limiter.core.decision import Reason
from gateway_limiter.core.failure import attempt_async
from gateway_limiter.core.pipeline import Outcome, route
from gateway_limiter.core.steps import Ask
from gateway_limiter.model.bucket import Verdict
from gateway_limiter.rls.descriptors import Wanted

#: The first double of ``descriptors.lua``'s reply: 1 all admitted, 0 nothing taken.
_ALL = REPLY.size // 6


@dataclass(frozen=True, slots=True)
class Judged:
    """One descriptor's part in the answer."""

    wanted: Wanted
    #: What the limiter decided for it (the rule None: not limited); None when it was
    #: not asked because another descriptor was refused without Redis.
    outcome: Outcome | None
    #: Its own answer: False when its limits refused it (OVER_LIMIT); True when they
    #: had room, even where another descriptor's refusal took nothing from them
    admitted: bool


@dataclass(frozen=True, slots=True)
class Judgement:
    """A request's answer: ``allowed`` (every descriptor admitted, and only then did any
    take permits) and each descriptor's part, in the request's order."""

    allowed: bool
    judged: tuple[Judged, ...]
    #: What decided: ``redis``, ``memory`` (``memory://``), ``on_backend_error:<policy>``
    #: while Redis is away, or ``none`` (nothing limited)
    decided_by: str


def _unlimited() -> Outcome:
    return (Verdict(True, 0.0, 0.0), Reason.NOT_CONFIGURED, None)


class Judge:
    """Decides requests' descriptors on ``limiter`` (started, on this event loop).

    ``domain_channel`` (the setting ``rls_domain_channel``): a request's domain names
    the channelType, and only interfaces under that channel's cap are limited for it.
    """

    __slots__ = ("_cluster", "_combined", "_commands", "domain_channel", "limiter")

    def __init__(self, limiter: AsyncGatewayLimiter, domain_channel: bool = False) -> None:
        self.limiter = limiter
        self.domain_channel = domain_channel
        self._commands = Commands(limiter.settings.key_prefix)
        url = limiter.settings.redis_url.lower()
        #: One script call holds several interfaces on one Redis or a Sentinel's master;
        #: on a Cluster only those under one hash tag (one channel's); memory:// has no
        #: scripts
        self._combined = not url.startswith(("redis+cluster:", "memory:"))
        self._cluster = url.startswith("redis+cluster:")

    async def judge(self, domain: str, wanted: list[Wanted]) -> Judgement:
        """Decide every descriptor of one request: all or nothing (see the module)."""
        limiter = self.limiter
        snapshot = limiter.registry.snapshot
        steps: list[Outcome | Ask] = []
        for w in wanted:
            url = w.interface
            if url is None or (
                self.domain_channel
                and ((rule := route(snapshot, url, w.caller)) is None or rule.channel != domain)
            ):
                steps.append(_unlimited())
                continue
            steps.append(limiter._begin(url, w.permits, 0.0, w.caller))
        refused_here = any(not isinstance(s, Ask) and not s[0].allowed for s in steps)
        outcomes: list[Outcome | None] = [None] * len(steps)
        admitted = [True] * len(steps)
        enforced: list[int] = []
        for i, step in enumerate(steps):
            if not isinstance(step, Ask):
                outcomes[i] = step
                admitted[i] = step[0].allowed
            elif not refused_here:
                if step.rule.shadow:  # decided alone: it never refuses the others
                    outcomes[i] = await limiter._run(engine.asking(limiter, step))
                else:
                    enforced.append(i)
        asks = [s for s in (steps[i] for i in enforced) if isinstance(s, Ask)]
        if refused_here:
            self._unsent([s for s in steps if isinstance(s, Ask)])
        elif len(asks) > 1 and (self._combined or (self._cluster and self._one_slot(asks))):
            self._unsent(asks)  # decided by bucket.lua in the call, not from a lease
            await self._together(asks, enforced, outcomes, admitted)
        else:
            for i, ask in zip(enforced, asks, strict=True):  # the limiter's own round trip
                outcome = await limiter._run(engine.asking(limiter, ask))
                outcomes[i] = outcome
                admitted[i] = outcome[0].allowed
        allowed = all(admitted) and not any(o is not None and not o[0].allowed for o in outcomes)
        judged = tuple(Judged(w, o, a) for w, o, a in zip(wanted, outcomes, admitted, strict=True))
        return Judgement(allowed, judged, self._decided_by(outcomes))

    async def _together(
        self,
        asks: list[Ask],
        where: list[int],
        outcomes: list[Outcome | None],
        admitted: list[bool],
    ) -> None:
        """Several interfaces in one ``descriptors.lua`` call, all or nothing."""
        limiter = self.limiter
        call = self.call(asks)
        reply = await attempt_async(limiter.backend.script, call)
        if isinstance(reply, BackendError):  # the failure policy decides each
            for i, ask in zip(where, asks, strict=True):
                outcome = outcomes[i] = limiter._finish(ask, reply)
                admitted[i] = outcome[0].allowed
            return
        try:
            all_in, verdicts = parse_together(reply, len(asks))
        except BackendError as e:
            for i, ask in zip(where, asks, strict=True):
                outcome = outcomes[i] = limiter._finish(ask, e)
                admitted[i] = outcome[0].allowed
            return
        for i, ask, said in zip(where, asks, verdicts, strict=True):
            admitted[i] = said.allowed
            verdict = said
            if not all_in:
                # Nothing was taken: an admitted one is refused after all, and nothing is
                # learnt of when an interface is next free (each reply saw the permits the
                # decisions before it took, since given back).
                wait_us = 0.0 if said.allowed else said.wait_us
                verdict = Verdict(False, wait_us, said.stored, 0.0, said.factor, said.held_us)
                if said.quota_left >= 0.0:  # a calendar quota: its permits given back too
                    left = said.quota_left + (ask.permits if said.allowed else 0)
                    verdict = verdict._replace(
                        quota_left=min(left, said.quota_limit),
                        quota_reset_us=said.quota_reset_us,
                        quota_limit=said.quota_limit,
                    )
            outcomes[i] = limiter._finish(ask, verdict)

    def call(self, asks: list[Ask]) -> ScriptCall:
        """The ``descriptors.lua`` call of several decisions (each with no wait)."""
        keys: list[str] = []
        argv: list[object] = [str(len(asks))]
        for ask in asks:
            one = self._commands(ask.rule, ask.permits, 0.0, ask.key, None)
            numkeys = one.args[0]
            own_keys, own_args = one.args[1 : 1 + numkeys], one.args[1 + numkeys :]
            keys += own_keys
            argv += [one.name, str(numkeys), str(len(own_args)), *own_args]
        return ScriptCall("descriptors", [len(keys), *keys, *argv])

    def _unsent(self, asks: list[Ask]) -> None:
        """A rate lease's renewal that ``_begin`` began for ``asks`` will not be sent:
        give it up now, or the limiter's next callers on that row would wait for it.
        What the old lease had left is not handed back (the bucket under-admits it)."""
        leases = self.limiter._leases
        for ask in asks:
            if ask.lease is not None and leases is not None:
                leases.failed(ask.rule)

    def _one_slot(self, asks: list[Ask]) -> bool:
        """True when every key of ``asks`` carries one hash tag: one Cluster slot (the
        interfaces of one capped channel)."""
        tags = {
            key[key.index("{") + 1 : key.index("}")]
            for ask in asks
            for key in self._commands(ask.rule, ask.permits, 0.0, ask.key, None).args[1:2]
        }
        return len(tags) == 1

    def _decided_by(self, outcomes: list[Outcome | None]) -> str:
        reasons = {o[1] for o in outcomes if o is not None and o[2] is not None}
        if Reason.BACKEND_FALLBACK in reasons:
            return f"on_backend_error:{self.limiter.policy.kind}"
        if not reasons:
            return "none"
        return "redis" if self.limiter.backend.shared else "memory"


def parse_together(reply: object, n: int) -> tuple[bool, list[Verdict]]:
    """``descriptors.lua``'s reply: whether all admitted, and each decision's verdict
    (each reply after the double that counts its doubles: 6, or 9 with a calendar
    quota)."""
    if not isinstance(reply, bytes) or len(reply) < _ALL:
        raise BackendError(f"unexpected reply from the descriptors script: {reply!r}")
    all_in = reply[:_ALL] == b"\x00\x00\x00\x00\x00\x00\xf0\x3f"  # 1.0, little-endian
    verdicts = []
    at = _ALL
    for _ in range(n):
        if len(reply) < at + _ALL:
            raise BackendError(f"unexpected reply from the descriptors script: {reply!r}")
        (count,) = struct.unpack_from("<d", reply, at)
        end = at + _ALL + int(count) * _ALL
        verdicts.append(parse_reply(reply[at + _ALL : end]))
        at = end
    if at != len(reply):
        raise BackendError(f"unexpected reply from the descriptors script: {reply!r}")
    return all_in, verdicts
