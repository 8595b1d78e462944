"""The Lua scripts, and what one decision sends and gets back, without any I/O.

How it works: docs/internals.md, section ``gateway_limiter.backends.scripts``.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator
from hashlib import sha1
from importlib import resources
from typing import Any, Generic, NamedTuple, TypeVar, cast

from gateway_limiter.backends.base import BackendError
from gateway_limiter.backends.state import (
    bucket_and_quota,
    bucket_home,
    calendar_valid,
    caller_part,
    in_bucket,
    limit,
    own_limits,
    pushback_base,
    pushback_key,
    pushback_rate,
    single_bucket,
    state_key,
)
from gateway_limiter.config.rules import Rule
from gateway_limiter.model.algorithms import KIND_CODES, PACED_CALENDAR_CODE
from gateway_limiter.model.bucket import US_PER_S, BucketState, Verdict
from gateway_limiter.model.limits import (
    CalendarWindow,
    FixedWindow,
    LimitKind,
    LimitState,
    SlidingLog,
)
from gateway_limiter.model.pushback import PushbackState


def _lua(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


#: The line by which a script takes in a section of a fragment, alone on it:
#: ``-- include: <file>, <section>``; in the fragment, a line ``-- section: <name>``
#: begins each section (what comes before the first is the fragment's own account).
INCLUDE, SECTION = "-- include: ", "-- section: "


def fragment_sections(name: str) -> dict[str, str]:
    """The sections of the fragment ``name``, by name."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in _lua(name).splitlines(keepends=True):
        if line.startswith(SECTION):
            current = sections.setdefault(line[len(SECTION) :].strip(), [])
        elif current is not None:
            current.append(line)
    return {section: "".join(lines) for section, lines in sections.items()}


def with_fragments(name: str) -> str:
    """The script ``name`` with each section of a fragment it takes in (a line
    ``-- include: <file>, <section>``) in place of that line. ``calendar.lua``, a
    calendar quota's arithmetic, is written once and taken in by both decision scripts
    (``limits.lua`` for kinds 4 and 5, ``bucket.lua`` beside a token bucket), as text:
    a function would be a closure made on every call (calendar.lua says why)."""
    lines = []
    for line in _lua(name).splitlines(keepends=True):
        if line.startswith(INCLUDE):
            fragment, section = (part.strip() for part in line[len(INCLUDE) :].split(","))
            lines.append(fragment_sections(fragment)[section])
        else:
            lines.append(line)
    return "".join(lines)


BUCKET_LUA = with_fragments("bucket.lua")
LIMITS_LUA = with_fragments("limits.lua")
PUSHBACK_LUA = _lua("pushback.lua")


def with_slot() -> str:
    """``slot.lua`` composed after both decision scripts (``bucket.lua``, ``limits.lua``)
    wrapped as the functions it calls: one script that takes a slot and the rate permit
    together, and that gives a slot back by handing it (and a permit) to the first
    caller queued, while the rate's semantics stay in the decision scripts' own files."""
    return (
        f"local function rate_bucket(KEYS, ARGV)\n{BUCKET_LUA}\nend\n"
        f"local function rate_limits(KEYS, ARGV)\n{LIMITS_LUA}\nend\n{_lua('slot.lua')}"
    )


def with_lease(bucket_source: str) -> str:
    """``lease.lua`` composed after ``bucket.lua`` wrapped as the function it calls
    (``core/leases.py`` sends it)."""
    return f"local function bucket_decision(KEYS, ARGV)\n{bucket_source}\nend\n{_lua('lease.lua')}"


def with_descriptors() -> str:
    """``descriptors.lua`` composed after both decision scripts wrapped as the functions
    it calls, as ``with_slot`` composes ``slot.lua``: several interfaces decided
    together, all or nothing (Envoy's rate limit service, ``gateway_limiter/rls/``)."""
    return (
        f"local function rate_bucket(KEYS, ARGV)\n{BUCKET_LUA}\nend\n"
        f"local function rate_limits(KEYS, ARGV)\n{LIMITS_LUA}\nend\n{_lua('descriptors.lua')}"
    )


#: Script name -> source; a backend registers each once. The ``slot_`` ones are
#: ``limiter.slot``'s (``backends/slots.py``).
SCRIPTS = {
    "bucket": BUCKET_LUA,
    "limits": LIMITS_LUA,
    "pushback": PUSHBACK_LUA,
    "slot": with_slot(),
    "slot_renew": _lua("slot_renew.lua"),
    "lease": with_lease(BUCKET_LUA),
    "descriptors": with_descriptors(),
    "quota": _lua("quota.lua"),
}
#: Script name -> SHA1 of its source (what EVALSHA names).
SHAS = {name: sha1(source.encode()).hexdigest() for name, source in SCRIPTS.items()}


class ScriptCall(NamedTuple):
    """One decision as a script call: which script, and its arguments."""

    name: str  # a key of SCRIPTS
    args: list[Any]  # after the SHA: numkeys, the keys, ARGV

    @property
    def evalsha(self) -> tuple[Any, ...]:
        """The arguments of ``EVALSHA``: the SHA, numkeys, keys, ARGV."""
        return (SHAS[self.name], *self.args)

    @property
    def source(self) -> str:
        """The script's source: what ``SCRIPT LOAD`` sends after NOSCRIPT."""
        return SCRIPTS[self.name]

    @property
    def key(self) -> str:
        """The call's first key: on a cluster, its slot's master runs the call."""
        return str(self.args[1])


class _Plan:
    """What a decision on one Rule needs, computed once per Rule object."""

    __slots__ = (
        "args",
        "bucket",
        "key",
        "keyed",
        "keys",
        "paired",
        "per_caller",
        "pushed",
        "rule",
        "valid",
    )

    def __init__(self, rule: Rule, prefix: str, now_s: float = 0.0) -> None:
        self.rule = rule
        self.bucket = single_bucket(rule)
        #: a token bucket and a calendar quota: bucket.lua, in the quota's key
        self.paired = bucket_and_quota(rule)
        #: each limit's key without the caller part, and whether it takes one
        self.keys = [state_key(prefix, r) for r in rule.limits]
        self.per_caller = [r.per_caller for r in rule.limits]
        self.key = self.keys[0]  # the single bucket's
        self.keyed = any(self.per_caller)
        #: the pushback key; a per-caller limit's gets the caller part per call
        self.pushed = pushback_base(prefix, rule.url, rule.channel)
        self.args: list[str] | list[bytes]
        #: calendar quotas: the span of this process's clock (s) over which ``args`` hold
        self.valid: tuple[float, float] | None = None
        if self.bucket:
            self.args = [bucket_config(rule)]
            return
        if self.paired:
            self.args = [pair_config(rule, now_s)]
        else:
            self.args = limits_args(rule, now_s)
        spans = [calendar_valid(r.calendar, now_s) for r in rule.limits if r.calendar]
        if spans:
            self.valid = (max(s for s, _ in spans), min(e for _, e in spans))

    def keys_for(self, caller: str | None) -> list[str]:
        """The keys of every limit for ``caller`` (ignored by shared limits)."""
        part = caller_part(caller)
        return [k + part if p else k for k, p in zip(self.keys, self.per_caller, strict=True)]


def _holds(valid: tuple[float, float] | None, now_s: float) -> bool:
    return valid is None or valid[0] <= now_s < valid[1]


def bucket_config(rule: Rule) -> bytes:
    """``bucket.lua``'s ARGV[1] for ``rule``: its rate (per second), capacity and warm-up
    period (µs; 0 for a token bucket) as three little-endian doubles, which the script
    unpacks in one call rather than parsing three numbers from text; for a class's Rule
    with a reserve in play (priority classes), a fourth: the class's share."""
    config = (rule.per_second, float(rule.burst), rule.warmup * US_PER_S)
    if rule.shares is not None:
        return struct.pack("<dddd", *config, rule.shares[0])
    return struct.pack("<ddd", *config)


def pair_config(rule: Rule, now_s: float) -> bytes:
    """``bucket.lua``'s ARGV[1] for a token bucket with a calendar quota beside it, nine
    little-endian doubles unpacked in one call: the bucket's rate (per second) and
    capacity; the quota's permits per period, its four boundaries around ``now_s`` (as
    ``limits_args`` sends them) and its burst (0: not paced); and a class's share of the
    bucket (priority classes; -1: none)."""
    spec = limit(rule.also[0], now_s)
    share = -1.0 if rule.shares is None else rule.shares[0]
    return struct.pack(
        "<9d", rule.per_second, float(rule.burst), spec.rate, *spec.bounds, spec.size, share
    )


def timeout_arg(timeout: float | None) -> str:
    """A decision script's timeout argument: µs, negative for no timeout. The usual two,
    none and zero, are sent as "-1" and "0", which the scripts recognise without parsing
    (a Lua string compare is a pointer compare; ``tonumber`` is not cheap)."""
    if timeout is None:
        return "-1"
    return "0" if timeout == 0 else repr(timeout * US_PER_S)


def limits_args(rule: Rule, now_s: float | None = None) -> list[bytes]:
    """``limits.lua``'s ARGV[4] and ARGV[5] for ``rule``: the struct format, and how many
    limits are the interface's own followed by each limit's kind, rate and size (and three
    zeros the script fills), as little-endian doubles: the script unpacks them once
    rather than parsing each from text. A calendar quota sends its four boundaries
    around ``now_s`` (this process's clock) in place of the size and the zeros; a paced
    one its own code, and its burst after every limit's six. A class's Rule with a
    reserve in play (priority classes) adds each limit's share, last."""
    fields = [float(own_limits(rule))]
    bursts: list[float] = []
    for r in rule.limits:
        spec = limit(r, now_s)
        if spec.kind is LimitKind.CALENDAR and spec.size > 0.0:
            fields += (PACED_CALENDAR_CODE, spec.rate, *spec.bounds)
            bursts.append(spec.size)
        elif spec.kind is LimitKind.CALENDAR:
            fields += (KIND_CODES[spec.kind], spec.rate, *spec.bounds)
        else:
            fields += (KIND_CODES[spec.kind], spec.rate, spec.size, 0.0, 0.0, 0.0)
    fields += bursts
    if rule.shares is not None:
        fields += rule.shares
    layout = "<" + "d" * len(fields)
    return [layout.encode("ascii"), struct.pack(layout, *fields)]


class Commands:
    """The script call of each decision, with what depends only on the rule computed once.

    A rule is immutable, so its script, keys and fixed arguments are kept per URL (and
    rebuilt when a reload hands over a new Rule object); a decision then adds only the
    permits, the budget and, for per-caller limits, the caller's part of the keys.
    """

    __slots__ = ("_cache", "_prefix", "clock")

    #: Rules kept at most; past this the cache starts over (URLs of removed rows go).
    LIMIT = 65_536
    #: script name -> SHA1 of its source
    shas = SHAS

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._cache: dict[str, _Plan] = {}
        #: This process's clock (s): where a calendar quota's boundaries are computed
        #: from (the script picks among them by the server's clock).
        self.clock: Callable[[], float] = time.time

    def __call__(
        self, rule: Rule, permits: int, timeout: float | None, caller: str | None, now: float | None
    ) -> ScriptCall:
        """The script call of one decision: ``timeout`` in seconds (None: any wait);
        ``now`` (µs) drives the clock in tests (None: the server's)."""
        # a class's variant of an interface's Rule (priority classes) is planned apart
        cached = rule.url if rule.shares is None else f"{rule.url}\n{rule.shares}"
        plan = self._cache.get(cached)
        if (
            plan is None
            or plan.rule is not rule
            or (plan.valid is not None and not _holds(plan.valid, self.clock()))
        ):
            if len(self._cache) >= self.LIMIT:
                self._cache.clear()
            plan = self._cache[cached] = _Plan(rule, self._prefix, self.clock())
        timeout_us = timeout_arg(timeout)
        now_us = "" if now is None else repr(now)
        if plan.bucket:
            key = plan.key + caller_part(caller) if plan.keyed else plan.key
            args = [1, key, *plan.args, str(permits), timeout_us]
            return ScriptCall("bucket", args if now is None else [*args, now_us])
        if plan.keyed:
            keys, pushed = plan.keys_for(caller), plan.pushed + caller_part(caller)
        else:
            keys, pushed = plan.keys, plan.pushed
        if plan.paired:  # one key: the quota's counter, the bucket's state after it
            args = [1, keys[1], *plan.args, str(permits), timeout_us]
            return ScriptCall("bucket", args if now is None else [*args, now_us])
        return ScriptCall(
            "limits",
            [
                len(keys) + 1,
                *keys,
                pushed,
                str(permits),
                timeout_us,
                now_us,
                *plan.args,
            ],
        )

    def pushback(
        self, rule: Rule, retry_after: float | None, caller: str | None, now: float | None
    ) -> ScriptCall:
        """The script call of one pushback: ``retry_after`` in seconds (None: decrease
        the effective rate); ``now`` (µs) drives the clock in tests."""
        retry_us = "" if retry_after is None else repr(retry_after * US_PER_S)
        now_us = "" if now is None else repr(now)
        rate = repr(pushback_rate(rule))
        if in_bucket(rule):  # in the bucket's key (bucket.lua says why)
            home = bucket_home(rule)
            key = state_key(self._prefix, home)
            key = key + caller_part(caller) if home.per_caller else key
            layout = IN_PAIR if home is not rule else IN_BUCKET
            return ScriptCall("pushback", [1, key, rate, retry_us, now_us, layout])
        key = pushback_key(self._prefix, rule, caller)
        return ScriptCall("pushback", [1, key, rate, retry_us, now_us, OWN_KEY])


class Packer:
    """Commands in the Redis protocol, for the backends that write their own round trips
    (threads' and coroutines' shared pipelines). Script calls hold only str, int and the
    bytes of ``bucket_config`` and ``limits_args``, so this is redis-py's
    ``pack_command`` without its general cases; and decisions repeat
    (the same rule, permits and budget make the same EVALSHA), so packed commands are
    kept, up to ``LIMIT`` (~150 bytes each; past it the cache starts over)."""

    __slots__ = ("_encoding", "_errors", "_kept")

    LIMIT = 4096

    def __init__(self, encoding: str = "utf-8", errors: str = "strict") -> None:
        self._encoding = encoding
        self._errors = errors
        self._kept: dict[tuple[Any, ...], bytes] = {}

    def __call__(self, command: tuple[Any, ...]) -> bytes:
        """``command`` packed."""
        packed = self._kept.get(command)
        if packed is None:
            if len(self._kept) >= self.LIMIT:
                self._kept.clear()
            parts = [b"*%d\r\n" % len(command)]
            for arg in command:
                if isinstance(arg, bytes):  # a row's packed doubles (bucket_config, limits_args)
                    data = arg
                else:
                    data = (arg if isinstance(arg, str) else str(arg)).encode(
                        self._encoding, self._errors
                    )
                parts.append(b"$%d\r\n%b\r\n" % (len(data), data))
            packed = self._kept[command] = b"".join(parts)
        return packed


#: A decision script's reply: allowed (1/0), wait µs, stored, next free µs, factor, held
#: µs, as six little-endian doubles in one bulk string (bucket.lua says why).
REPLY = struct.Struct("<6d")
#: ``limits.lua``'s reply for an interface with a calendar quota: the six, then the
#: permits left in the binding quota's period, when it ends (epoch µs), its permits.
QUOTA_REPLY = struct.Struct("<9d")


def parse_reply(reply: Any) -> Verdict:
    """A decision script's reply as a Verdict (BackendError when it is not one)."""
    try:
        if len(reply) == QUOTA_REPLY.size:
            return _verdict(*QUOTA_REPLY.unpack(reply))
        allowed, wait_us, stored, next_free_us, factor, held_us = REPLY.unpack(reply)
    except (TypeError, struct.error) as e:
        raise BackendError(f"unexpected reply from the bucket script: {reply!r}") from e
    if allowed < 0.0:  # -1: refused for want of a reserve (priority classes)
        return Verdict(False, wait_us, stored, next_free_us, factor, held_us, reserved=True)
    return Verdict(allowed == 1.0, wait_us, stored, next_free_us, factor, held_us)


def _verdict(
    allowed: float,
    wait_us: float,
    stored: float,
    next_free_us: float,
    factor: float,
    held_us: float,
    left: float,
    reset_us: float,
    quota: float,
) -> Verdict:
    return Verdict(
        allowed == 1.0,
        wait_us,
        stored,
        next_free_us,
        factor,
        held_us,
        left,
        reset_us,
        quota,
        allowed < 0.0,
    )


def queued_verdict(verdict: Verdict, queued_s: float) -> Verdict:
    """``verdict`` of a call written ``queued_s`` after it was asked for (every transport:
    a thread queued behind another's round trip, a coroutine behind a lane's).

    next_free and a pushback's hold count from when the script ran, which is after the
    call was written, and that can be long after it was queued in a burst. Counted from
    when it was asked for instead (what the limiter goes by), each is that much later.
    """
    if verdict.next_free_us <= 0.0 or queued_s <= 0.0:
        return verdict
    more_us = queued_s * US_PER_S
    next_free_us = verdict.next_free_us + more_us
    held_us = verdict.held_us + more_us if verdict.held_us > 0.0 else 0.0
    return verdict._replace(next_free_us=next_free_us, held_us=held_us)


#: ``pushback.lua``'s reply: the factor after it, next free µs (two packed doubles).
PUSHBACK_REPLY = struct.Struct("<2d")


def parse_pushback(reply: Any) -> tuple[float, float]:
    """``pushback.lua``'s reply: the effective factor after it, and the µs from then
    before which no call goes (BackendError when it is not that)."""
    try:
        factor, next_free_us = PUSHBACK_REPLY.unpack(reply)
    except (TypeError, struct.error) as e:
        raise BackendError(f"unexpected reply from the pushback script: {reply!r}") from e
    return factor, next_free_us


#: Where ``pushback.lua`` finds (ARGV[4]) and ``parse_pushback_state`` reads what
#: pushbacks left: a key of its own; after a bucket's state in its key; after a calendar
#: quota's count and the bucket's state, in the quota's key (``bucket_and_quota``).
OWN_KEY, IN_BUCKET, IN_PAIR = "0", "1", "2"

#: A bucket's state in Redis: stored, balance, rate, capacity, refill (bucket.lua).
STATE = struct.Struct("<5d")
#: What pushbacks left, after a bucket's state in the same key (pushback.lua).
PUSHBACK = struct.Struct("<4d")


def parse_state(raw: object, layout: str = IN_BUCKET) -> BucketState | None:
    """A bucket's packed state (GET) as a BucketState, or None when there is none
    (pushback state that may follow it is not the bucket's); ``IN_PAIR``: read from a
    calendar quota's key, after the count (``count_size``)."""
    if not isinstance(raw, bytes):
        return None
    start = count_size(raw) if layout == IN_PAIR else 0
    if len(raw) - start not in (STATE.size, STATE.size + PUSHBACK.size):
        return None
    state = BucketState(*STATE.unpack_from(raw, start))
    return None if state.stored < 0 else state  # -1: pushback state alone


def count_size(raw: bytes) -> int:
    """How many bytes of a calendar quota's key are its count (``bucket.lua``): 16 (two
    doubles), 32 (four: a paced quota's) or 0 (none: not a counter), by its length
    with the bucket's state and the pushback's after it or not."""
    if len(raw) in (16, 16 + STATE.size, 16 + STATE.size + PUSHBACK.size):
        return 16
    if len(raw) in (32, 32 + STATE.size, 32 + STATE.size + PUSHBACK.size):
        return 32
    return 0


#: A fixed window's counter in Redis: the window k, the permits in it (limits.lua).
FIXED = struct.Struct("<2d")
#: A paced calendar quota's: its count's two, then its pacing bucket's permits and when
#: they were counted (limits.lua).
PACED = struct.Struct("<4d")


def is_sliding(rule: Rule) -> bool:
    """True when ``rule``'s limit is a sliding window: a list, read with LRANGE (any
    other limit is one string, read with GET)."""
    return rule.kind is LimitKind.SLIDING_WINDOW


def parse_limit_state(rule: Rule, raw: object) -> LimitState | None:
    """What ``peek`` read of ``rule``'s own limit: a bucket's state, a fixed window's
    counter or a calendar quota's count (GET), a sliding window's admission times
    (LRANGE; ``memory://`` answers the model's runs as they are), or None when there is
    none (or the key holds something else: lost state, as the scripts treat it)."""
    if is_sliding(rule):
        if isinstance(raw, SlidingLog):
            return raw
        if not isinstance(raw, list) or not raw:
            return None
        return SlidingLog.of([float(t) for t in raw])
    if rule.kind is LimitKind.FIXED_WINDOW:
        if not isinstance(raw, bytes) or len(raw) != FIXED.size:
            return None
        return FixedWindow(*FIXED.unpack(raw))
    if rule.kind is LimitKind.CALENDAR:  # the period's start, µs, and the permits in it
        # (a bucket beside it may follow: bucket.lua)
        size = count_size(raw) if isinstance(raw, bytes) else 0
        if size == PACED.size:  # and a paced one's bucket
            return CalendarWindow(*PACED.unpack_from(cast(bytes, raw)))
        if size != FIXED.size:
            return None
        return CalendarWindow(*FIXED.unpack_from(cast(bytes, raw)))
    return parse_state(raw)


def parse_pushback_state(raw: object, layout: str) -> PushbackState | None:
    """What pushbacks left (GET of ``state.pushback_key``, ``OWN_KEY``; of the bucket's
    own key, ``IN_BUCKET``: after its five doubles; of a calendar quota's key beside the
    bucket, ``IN_PAIR``: after the count and the five), or None when there is none."""
    if not isinstance(raw, bytes):
        return None
    if layout == OWN_KEY:
        return PushbackState(*PUSHBACK.unpack(raw)) if len(raw) == PUSHBACK.size else None
    start = (count_size(raw) if layout == IN_PAIR else 0) + STATE.size
    if len(raw) - start != PUSHBACK.size:
        return None
    return PushbackState(*PUSHBACK.unpack_from(raw, start))


def pushback_peek_key(prefix: str, rule: Rule) -> tuple[str, str]:
    """Where an interface's pushback state lives for all callers: the key, and how it
    lies there (``OWN_KEY``, ``IN_BUCKET``, ``IN_PAIR``; ``Commands.pushback`` says why)."""
    if in_bucket(rule):
        home = bucket_home(rule)
        return state_key(prefix, home), IN_PAIR if home is not rule else IN_BUCKET
    return pushback_key(prefix, rule, None), OWN_KEY


def clock_us(time_reply: Any) -> float:
    """Redis ``TIME`` (seconds, microseconds) as microseconds."""
    sec, usec = time_reply
    return float(sec * US_PER_S + usec)


#: NOSCRIPT rounds of a batch before its calls give up (a SCRIPT FLUSH between the LOAD
#: and the EVALSHAs, again and again).
RELOADS = 3

C = TypeVar("C")


class Reloads(Generic[C]):
    """The NOSCRIPT rounds of one batch of script calls, the same on every transport
    (threads' shared round trips, asyncio lanes): Redis restarted, flushed its scripts or
    was promoted, so the calls it answered NOSCRIPT go again, after a SCRIPT LOAD of
    their scripts, up to ``RELOADS`` more rounds; then they fail with ``error``.

    >>> rounds = Reloads(["a", "b"], lambda c: "bucket")
    >>> for calls, load in rounds:  # write ``load``'s LOADs and ``calls``, read replies
    ...     if not rounds.again:
    ...         rounds.missing("b")  # NOSCRIPT for "b" in the first round
    >>> rounds.sent, rounds.lost
    ([(['a', 'b'], ()), (['b'], ('bucket',))], [])
    """

    __slots__ = ("_name", "_reload", "again", "lost", "sent")

    #: what a call still missing its script after the last round fails with
    error = "NOSCRIPT: Redis keeps losing the script"

    def __init__(self, calls: list[C], name: Callable[[C], str], load: tuple[str, ...] = ()):
        self._name = name
        self._reload: list[C] = []
        #: True from the second round on (the first is written by whoever made the batch)
        self.again = False
        #: each round's calls and the scripts loaded before them
        self.sent: list[tuple[list[C], tuple[str, ...]]] = [(calls, load)]
        #: the calls that got NOSCRIPT in every round (fail them with ``error``)
        self.lost: list[C] = []

    def missing(self, call: C) -> None:
        """Redis answered ``call`` NOSCRIPT in this round: it goes again."""
        self._reload.append(call)

    def __iter__(self) -> Iterator[tuple[list[C], tuple[str, ...]]]:
        calls, load = self.sent[0]
        for attempt in range(RELOADS + 1):
            if attempt:
                calls = self._reload
                load = tuple(sorted({self._name(c) for c in calls}))
                self.again = True
                self.sent.append((calls, load))
            self._reload = []
            yield calls, load
            if not self._reload:
                return
        self.lost = self._reload


def describe(error: BaseException) -> str:
    """An error of the Redis client, for a BackendError."""
    return f"{type(error).__name__}: {error}"
