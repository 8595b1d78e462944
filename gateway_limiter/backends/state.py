"""Where a limit's state lives (its key), and what the scripts are told about it.

How it works: docs/internals.md, section ``gateway_limiter.backends.state``.
"""

from __future__ import annotations

import re
import time
from hashlib import sha1

from gateway_limiter.config.rules import Algorithm, Rule
from gateway_limiter.model.algorithms import LimitKind
from gateway_limiter.model.bucket import US_PER_S
from gateway_limiter.model.calendar import Calendar
from gateway_limiter.model.limits import LIMIT_MODELS, Limit

#: Plain caller keys are kept as they are up to this many characters.
MAX_PLAIN_CALLER = 64
_PLAIN_CALLER = re.compile(rf"[A-Za-z0-9._:@/+=-]{{0,{MAX_PLAIN_CALLER}}}")
#: A key's caller part at its end (``caller_part``'s two forms).
_CALLER_TAIL = re.compile(rf":k(?:=[A-Za-z0-9._:@/+=-]{{0,{MAX_PLAIN_CALLER}}}|#[0-9a-f]{{40}})\Z")


def state_key(prefix: str, rule: Rule) -> str:
    """The key of ``rule``'s own limit, without the caller part (see ``caller_part``)."""
    if rule.channel is None:
        key = f"{interface_base(prefix, rule.url)}:{rule.kind}"
    else:  # under its channel's hash tag: one slot for the channel and its interfaces
        key = f"{prefix}:{{{channel_tag(rule.channel)}}}:{rule.url}:{rule.kind}"
    if rule.calendar is not None:  # cq:day, cq:week, cq:month
        return f"{key}:{rule.calendar.renewal.period}"
    return key if rule.period == 1 else f"{key}:{rule.period}s"


def interface_base(prefix: str, url: str) -> str:
    """``<prefix>:{<url>}``, the start of every key of ``url`` (no channel caps it). A URL
    that begins with ``}`` would make ``{}`` an empty hash tag, which Redis Cluster
    ignores (each key would hash whole, to slots of its own): its tag is the SHA1 of the
    URL, and the URL follows it."""
    if url[:1] == "}":
        return f"{prefix}:{{#{sha1(url.encode('utf-8', 'surrogatepass')).hexdigest()}}}:{url}"
    return f"{prefix}:{{{url}}}"


def channel_tag(channel: str) -> str:
    """The hash tag of a capped channel's keys: ``=`` and the channelType (plain), or
    its SHA1 (any other: braces would end the tag early)."""
    if _PLAIN_CALLER.fullmatch(channel):
        return f"={channel}"
    return f"=#{sha1(channel.encode('utf-8', 'surrogatepass')).hexdigest()}"


def caller_part(caller: str | None) -> str:
    """The suffix a per-caller limit's key gets for ``caller``: bounded and plain."""
    if caller is None:
        return ":k="
    if _PLAIN_CALLER.fullmatch(caller):
        return f":k={caller}"
    return f":k#{sha1(caller.encode('utf-8', 'surrogatepass')).hexdigest()}"


def per_caller_key(key: str) -> bool:
    """True when ``key`` ends in a caller part: a per-caller limit's or pushback's, whose
    number grows with the callers (``memory://`` bounds them). A shared key never does
    unless its URL, outside the braces of a hash tag (a channel's keys, a URL that
    begins with ``}``), holds ``:k=`` or ``:k#`` itself."""
    return _CALLER_TAIL.search(key) is not None


def limit(rule: Rule, now_s: float | None = None) -> Limit:
    """``rule``'s own limit as ``limits.lua`` and ``limits.reserve_limits`` take it (its
    kind's model, from the table). A calendar quota's carries the boundaries around
    ``now_s`` (None: this process's clock): see ``calendar_bounds``."""
    own = LIMIT_MODELS[rule.kind].limit(rule.rate, rule.period, rule.burst)
    if rule.calendar is not None:
        bounds = calendar_bounds(rule.calendar, time.time() if now_s is None else now_s)
        if rule.pacing:  # a paced quota's size is its pacing burst
            return own._replace(size=float(rule.pace_burst), bounds=bounds)
        return own._replace(bounds=bounds)
    return own


def calendar_bounds(calendar: Calendar, now_s: float) -> tuple[float, float, float, float]:
    """The boundaries (epoch µs) a calendar quota is decided with at ``now_s``: the start
    of the period before the current one, the current one's start and end, and the
    next one's end. The script picks among them by the shared clock, so a process clock
    off by less than a whole period (at least 23 hours) never moves a renewal."""
    start, end = calendar.period_at(now_s)
    before, _ = calendar.period_at(start - 1)
    _, after = calendar.period_at(end)
    return (before * US_PER_S, start * US_PER_S, end * US_PER_S, after * US_PER_S)


def calendar_valid(calendar: Calendar, now_s: float) -> tuple[float, float]:
    """The span of this process's clock (s) over which ``calendar_bounds`` stays the
    same: the current period."""
    start, end = calendar.period_at(now_s)
    return float(start), float(end)


def own_limits(rule: Rule) -> int:
    """How many of ``rule.limits`` are its interface's own: the rest (last) are its
    channel's, which the interface's pushback neither scales nor delays."""
    return sum(1 for r in rule.limits if not r.caps_channel)


def single_bucket(rule: Rule) -> bool:
    """True when ``rule``'s interface is one token bucket (or warm-up): ``bucket.lua``."""
    return not rule.also and not rule.spec.window


def bucket_and_quota(rule: Rule) -> bool:
    """True when ``rule``'s interface is one token bucket and one calendar quota, both
    its own (no channel cap), both shared or both per caller: ``bucket.lua`` decides the
    pair in one call on one key, the quota's counter, with the bucket's state and the
    pushback's after the count (bucket.lua says why), as ``limits.lua`` would decide it."""
    if len(rule.also) != 1:
        return False
    quota = rule.also[0]
    return (
        rule.kind is LimitKind.TOKEN_BUCKET
        and rule.warmup == 0.0
        and quota.calendar is not None
        and not rule.caps_channel
        and not quota.caps_channel
        and rule.per_caller == quota.per_caller
    )


def bucket_home(rule: Rule) -> Rule:
    """The limit whose key holds the state of ``rule``'s bucket: the calendar quota's
    beside it (``bucket_and_quota``), else its own."""
    return rule.also[0] if bucket_and_quota(rule) else rule


def in_bucket(rule: Rule) -> bool:
    """True when ``bucket.lua`` decides ``rule``'s interface (alone, or with a calendar
    quota): its pushback state lives in the bucket's key (``bucket_home``'s)."""
    return single_bucket(rule) or bucket_and_quota(rule)


def pushback_key(prefix: str, rule: Rule, caller: str | None) -> str:
    """The key of what pushbacks left for ``rule``'s interface (``pushback.lua``): beside
    its limits, under the same hash tag; per caller where a limit is per caller."""
    key = pushback_base(prefix, rule.url, rule.channel)
    return key + caller_part(caller) if rule.keyed else key


def pushback_base(prefix: str, url: str, channel: str | None = None) -> str:
    """``url``'s pushback key without a caller part (under its channel's hash tag where a
    channel caps it)."""
    if channel is None:
        return f"{interface_base(prefix, url)}:pb"
    return f"{prefix}:{{{channel_tag(channel)}}}:{url}:pb"


def pushback_rate(rule: Rule) -> float:
    """The rate a pushback's factor is recorded under: the first limit's rate as the
    decision script is told it (so a reload that changes it voids the factor)."""
    return rule.per_second if in_bucket(rule) else limit(rule).rate


def bucket_key(prefix: str, url: str) -> str:
    """The key of ``url``'s shared per-second bucket (the URL is the hash tag)."""
    return state_key(prefix, Rule(url, 1, 0.0, 0))


def window_key(prefix: str, url: str) -> str:
    """The key of ``url``'s shared per-second sliding window (same hash tag)."""
    return state_key(prefix, Rule(url, 1, 0.0, 0, algorithm=Algorithm.SLIDING_WINDOW))
