"""What a supplier's answer means to the limiter: which statuses push back, and for how long.

Every client integration calls ``limiter.pushback`` after a response whose status is
in ``PUSHBACK_STATUSES`` (429 Too Many Requests, 503 Service Unavailable), with the
seconds of its ``Retry-After`` header when it has a usable one (RFC 9110: a number of
seconds, or an HTTP date), else none, which lowers the interface's effective rate
instead. A header that cannot be read is a plain pushback, never an error: the caller
asked for the supplier's answer, and a malformed header must not replace it with an
exception.

Every integration also passes on what the supplier says is left of its quota
(``quota_report``) to ``limiter.observe``, so the fleet's calendar quotas follow the
supplier's own count (which callers outside the fleet spend too):

- the IETF ``RateLimit`` field (draft-ietf-httpapi-ratelimit-headers): a list of
  policies, ``"day";r=50;t=3600``, each with what is left (``r``) and the seconds until
  it renews (``t``); the one with the fewest left is taken. The drafts before it are
  read too: ``RateLimit: limit=100, remaining=50, reset=30`` and the separate
  ``RateLimit-Remaining`` / ``RateLimit-Reset`` fields (seconds);
- else ``X-RateLimit-Remaining`` with ``X-RateLimit-Reset``, which suppliers send as
  epoch seconds (GitHub) or as seconds from now: a value below ``EPOCH_FROM``
  (2001-09-09) is seconds from now. ``X-RateLimit-Remaining`` alone is not taken: a
  count with no renewal may be of a window of a second, and would spend a day's quota.

A field that cannot be read is no report, never an error.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, Final, Generic, NamedTuple, TypeAlias, TypeVar

from gateway_limiter.core.decision import Decision
from gateway_limiter.core.pipeline import MAX_RETRY_AFTER_S, check_priority
from gateway_limiter.errors import Refused
from gateway_limiter.model.priority import Priority

if TYPE_CHECKING:
    from gateway_limiter.aio import AsyncGatewayLimiter
    from gateway_limiter.limiter import GatewayLimiter

__all__ = [
    "PUSHBACK_STATUSES",
    "ClassOf",
    "PriorityOption",
    "Seam",
    "admit",
    "decide",
    "decide_async",
    "default_interface",
    "observations",
    "pushbacks",
    "quota_report",
    "refused",
    "retry_after_seconds",
    "tell",
    "tell_async",
]

R = TypeVar("R")

#: An integration's ``priority`` option (``ClassOf``).
PriorityOption: TypeAlias = (
    Priority | str | Mapping[str, Priority | str] | Callable[[R], Priority | str | None] | None
)


class ClassOf(Generic[R]):
    """An integration's ``priority`` option: the class of each request's call. A class
    (``Priority.CRITICAL`` or its text) for every request; a mapping of interfaceUrl (the
    route) to class, the others taking their row's; or a function of the request (None:
    the row's). Values are checked when the integration is made, and a function's on
    each call."""

    __slots__ = ("_by_url", "_fixed", "_pick")

    def __init__(
        self,
        option: PriorityOption[R],
    ) -> None:
        self._fixed: Priority | None = None
        self._by_url: dict[str, Priority] | None = None
        self._pick: Callable[[R], Priority | str | None] | None = None
        if isinstance(option, str):
            self._fixed = check_priority(option)
        elif isinstance(option, Mapping):
            self._by_url = {url: check_priority(p) for url, p in option.items()}
        elif option is not None:
            if not callable(option):
                raise TypeError(
                    f"priority must be a class, a mapping or a function, got {option!r}"
                )
            self._pick = option

    def __call__(self, request: R, url: str) -> Priority | None:
        """The class of ``request``'s call to ``url`` (None: its row's)."""
        if self._pick is not None:
            picked = self._pick(request)
            return None if picked is None else check_priority(picked)
        if self._by_url is not None:
            return self._by_url.get(url)
        return self._fixed


L = TypeVar("L")


class Seam(Generic[R, L]):
    """What every client integration holds: the limiter it asks (``L``: a
    ``GatewayLimiter`` or an ``AsyncGatewayLimiter``), how it names a request's
    interface (``interface``; default ``path_of``, the request URL's path), and the class
    of each request's call (``ClassOf``). ``kwargs`` go to the client's own base class
    (requests' ``HTTPAdapter``: the pool sizes, ``max_retries``)."""

    __slots__ = ("interface", "limiter", "priority")

    def __init__(
        self,
        limiter: L,
        interface: Callable[[R], str | None] | None = None,
        priority: PriorityOption[R] = None,
        **kwargs: Any,
    ) -> None:
        self.limiter = limiter
        self.priority = ClassOf[R](priority)
        self.interface = interface if interface is not None else self.path_of
        super().__init__(**kwargs)

    @staticmethod
    def path_of(request: Any) -> str | None:
        """The interface a request is decided on by default (each integration's)."""
        raise NotImplementedError


#: The statuses that say the supplier cannot take the call now.
PUSHBACK_STATUSES: Final = frozenset({429, 503})

# delta-seconds is digits (RFC 9110 §10.2.3); a decimal fraction is accepted too, as
# some suppliers send one, but no sign, exponent or "inf".
_SECONDS = re.compile(r"\d+(\.\d+)?")


def retry_after_seconds(value: str | None, now: datetime | None = None) -> float | None:
    """The seconds a ``Retry-After`` header value asks for.

    Args:
        value: the header's value (RFC 9110: seconds, or an HTTP date), or None.
        now: the clock an HTTP date is counted from; default this host's.

    Returns:
        The seconds, 0.0 for a date in the past; None for no header, one that is
        neither form, or more than a day (more likely wrong than meant).

    Example:
        ```python
        >>> retry_after_seconds("2")
        2.0
        >>> retry_after_seconds("soon") is None
        True
        ```
    """
    if value is None:
        return None
    text = value.strip()
    if _SECONDS.fullmatch(text):
        seconds = float(text)
    else:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # RFC 9110 dates are GMT; parsedate leaves "-0000" naive
            when = when.replace(tzinfo=UTC)
        seconds = max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
    if not math.isfinite(seconds) or seconds > MAX_RETRY_AFTER_S:
        return None
    return seconds


#: An ``X-RateLimit-Reset`` of at least this is epoch seconds; below it, seconds from now.
EPOCH_FROM = 1_000_000_000
_WHOLE = re.compile(r"\d{1,18}")
_PARAM = re.compile(r"\s*([a-z][a-z0-9_.*-]*)\s*=\s*(\S*?)\s*")


#: The most ``remaining`` passed on (``observe`` takes an INT(11)'s worth).
_MOST = 2**31 - 1


def _whole(value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip()
    return min(int(text), _MOST) if _WHOLE.fullmatch(text) else None


def _reset_at(seconds: int | None, now_s: float, epoch: bool) -> float | None:
    if seconds is None:
        return None
    if epoch and seconds >= EPOCH_FROM:
        return float(seconds)
    return now_s + seconds if seconds <= MAX_RESET_IN_S else None


#: The longest renewal taken, in seconds from now: a year (quotas renew monthly at most).
MAX_RESET_IN_S = 366 * 86_400


def _ietf(field: str, now_s: float) -> tuple[int, float] | None:
    """The ``RateLimit`` field: the policy with the fewest left, or the older drafts'
    ``remaining=, reset=`` members."""
    best: tuple[int, float] | None = None
    members: dict[str, str] = {}
    for member in field.split(","):
        item, *params = member.split(";")
        values = {}
        for param in params:
            matched = _PARAM.fullmatch(param)
            if matched is not None:
                values[matched[1]] = matched[2]
        if "r" in values:  # a policy: "name";r=..;t=..
            left = _whole(values["r"])
            when = _reset_at(_whole(values.get("t")), now_s, epoch=False)
            if left is not None and when is not None and (best is None or left < best[0]):
                best = (left, when)
        elif (matched := _PARAM.fullmatch(item)) is not None:
            members[matched[1]] = matched[2]
    if best is None and "remaining" in members:
        left = _whole(members["remaining"])
        when = _reset_at(_whole(members.get("reset")), now_s, epoch=False)
        if left is not None and when is not None:
            best = (left, when)
    return best


def quota_report(
    headers: Mapping[str, str], now_s: float | None = None
) -> tuple[int, float] | None:
    """What a response's ``headers`` say is left of the supplier's quota: (remaining,
    when it renews in epoch seconds), or None when they say nothing usable (module
    docstring). ``headers`` is looked up case-insensitively by the clients' own types;
    ``now_s``: this host's clock."""
    now_s = time.time() if now_s is None else now_s
    field = headers.get("RateLimit")
    if field is not None:
        found = _ietf(field, now_s)
        if found is not None:
            return found
    left = _whole(headers.get("RateLimit-Remaining"))
    if left is not None:
        when = _reset_at(_whole(headers.get("RateLimit-Reset")), now_s, epoch=False)
        if when is not None:
            return left, when
    left = _whole(headers.get("X-RateLimit-Remaining"))
    if left is None:
        return None
    when = _reset_at(_whole(headers.get("X-RateLimit-Reset")), now_s, epoch=True)
    return None if when is None else (left, when)


def default_interface(path: str) -> str:
    """The interfaceUrl of a request whose URL path is ``path``: the path itself (an
    empty path is ``/``, as HTTP sends it)."""
    return path or "/"


def refused(url: str, decision: Decision) -> Refused:
    """The exception for a refused request on ``url``: names the interface, the reason
    and, when waiting can help, the seconds to wait."""
    when = "" if decision.retry_after is None else f", retry after {decision.retry_after:.3g} s"
    return Refused(decision, f"{url}: refused ({decision.reason}{when})")


def admit(url: str, decision: Decision) -> None:
    """Before a request on ``url``: raise ``Refused`` (``refused``) unless ``decision``
    admits it, so that a refused request never reaches the supplier."""
    if not decision.allowed:
        raise refused(url, decision)


def decide(limiter: GatewayLimiter, url: str | None, request: R, classes: ClassOf[R]) -> None:
    """Before ``request`` on ``url`` (None: not limited): decide it with ``limiter``, in
    the class ``classes`` gives it, and raise ``Refused`` unless admitted (``admit``)."""
    if url is not None:
        admit(url, limiter.decide(url, priority=classes(request, url)))


async def decide_async(
    limiter: AsyncGatewayLimiter, url: str | None, request: R, classes: ClassOf[R]
) -> None:
    """``decide``, for an asyncio limiter."""
    if url is not None:
        admit(url, await limiter.decide(url, priority=classes(request, url)))


class Pushback(NamedTuple):
    """The arguments of ``limiter.pushback`` for a supplier's answer."""

    url: str
    retry_after: float | None


def pushbacks(url: str | None, status: int, retry_after: str | None) -> list[Pushback]:
    """After a response with ``status`` and the ``Retry-After`` header ``retry_after``
    to a request on ``url`` (None: not limited): the pushback to tell the fleet, if any
    (a 429 or 503), as a list of none or one, for the integrations to loop over."""
    if url is None or status not in PUSHBACK_STATUSES:
        return []
    return [Pushback(url, retry_after_seconds(retry_after))]


class Observation(NamedTuple):
    """The arguments of ``limiter.observe`` for a supplier's answer."""

    url: str
    remaining: int
    reset_at: float


def observations(url: str | None, headers: Mapping[str, str]) -> list[Observation]:
    """After a response with ``headers`` to a request on ``url`` (None: not limited):
    what the supplier says is left of its quota (``quota_report``), as a list of none or
    one, for the integrations to loop over."""
    if url is None:
        return []
    report = quota_report(headers)
    return [] if report is None else [Observation(url, *report)]


def _told(limiter: Any, url: str | None, status: int, headers: Mapping[str, str]) -> Iterator[Any]:
    """``tell``'s calls on ``limiter``, in order, each one's result as it is made (an
    asyncio limiter's: a coroutine, awaited before the next call is made)."""
    for seen in observations(url, headers):
        yield limiter.observe(*seen)
    for push in pushbacks(url, status, headers.get("Retry-After")):
        yield limiter.pushback(*push)


def tell(limiter: GatewayLimiter, url: str | None, status: int, headers: Mapping[str, str]) -> None:
    """After a response with ``status`` and ``headers`` to a request on ``url`` (None: not
    limited): tell ``limiter`` what the supplier said, what is left of its quota
    (``limiter.observe``) and, after a 429 or 503, its pushback (``limiter.pushback``)."""
    for _ in _told(limiter, url, status, headers):
        pass


async def tell_async(
    limiter: AsyncGatewayLimiter, url: str | None, status: int, headers: Mapping[str, str]
) -> None:
    """``tell``, for an asyncio limiter."""
    for call in _told(limiter, url, status, headers):
        await call
