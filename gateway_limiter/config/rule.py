"""One row of the limits table read as a limit: ``Rule``, and ``rule_from_row``, which
judges a row alone (a row that cannot apply is ``Skipped`` with the reason). What the
rows of an interface and of the table mean together is ``config/rules.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from gateway_limiter.config.row_checks import (
    CHANNEL_URL,
    MAX_CACHE,
    MAX_URL_LENGTH,
    algorithm_problem,
    calendar_problem,
    control_character,
    lease_range_problem,
    priority_problem,
    share_problem,
    type_problem,
)
from gateway_limiter.config.table import ConfRow
from gateway_limiter.model.algorithms import (
    ALGORITHM_TABLE,
    Algorithm,
    Kind,
    LimitKind,
    Quota,
    Spec,
    most_held,
)
from gateway_limiter.model.calendar import (
    DEFAULT_PACING_BURST,
    DEFAULT_TIME_ZONE,
    Calendar,
    QuotaPeriod,
)
from gateway_limiter.model.priority import (
    Priority,
    Reserve,
)

#: A calendar quota's nominal length in seconds (``Rule.period``): what its rate per
#: second and its place among an interface's limits are reckoned from. The month is the
#: longest one, so a rate derived from it never exceeds the quota's.
CALENDAR_SECONDS = {
    QuotaPeriod.DAY: 86_400,
    QuotaPeriod.WEEK: 7 * 86_400,
    QuotaPeriod.MONTH: 31 * 86_400,
}
#: The longest a token bucket may take to fill (s): a year. A bucket's key expires once
#: it would be full, and an expiry far beyond that is more than Redis takes.
MAX_FILL_S = 365 * 86_400


@dataclass(frozen=True, slots=True)
class Rule:
    """An enforced limit: ``rate`` permits per ``period`` s on ``url``; callers may wait
    ``cache`` s.

    In ``Snapshot.rules`` a Rule stands for its whole interface: its own limit first,
    the interface's other limits in ``also`` (decided with it, all or nothing), and
    ``cache`` the interface's wait budget.
    """

    url: str
    rate: int
    cache: float
    config_id: int
    capacity: int = 0  # token bucket: maxPermits; 0 = the rate (one period's worth)
    algorithm: Algorithm = Algorithm.TOKEN_BUCKET
    warmup: float = 0.0  # warm_up: seconds from cold to the full rate
    period: int = 1  # seconds that ``rate`` permits are for
    per_caller: bool = False  # True: each caller key has its own state
    also: tuple[Rule, ...] = ()  # the interface's other limits
    shadow: bool = False  # decided and counted, never enforced (the call always goes ahead)
    #: calls in flight at once across the fleet (``slot()``); None: no concurrency limit
    max_concurrent: int | None = None
    #: The capped channel (channelType) whose hash tag the limit's keys carry: set on a
    #: channel row (url ``*``) and on every limit of an interface under a channel cap.
    channel: str | None = None
    #: A named caller's row (``callerKey``): it applies to that caller alone.
    caller: str | None = None
    #: ``leaseMs``: the ms of the rate one process may take at a time (0: no lease); only
    #: ever set where ``lease_problem`` finds nothing against it.
    lease_ms: int = 0
    #: A calendar quota (``quotaPeriod``): ``rate`` permits per period of this calendar,
    #: counted as a fixed window on its periods; None: per ``period`` seconds.
    calendar: Calendar | None = None
    #: ``quotaPacing``: spread what is left of the quota over what is left of the period.
    pacing: bool = False
    #: A paced quota's burst: the most permits its pacing saves up (``maxPermits``, else
    #: the ``quota_pacing_burst`` setting).
    pace_burst: int = DEFAULT_PACING_BURST
    #: ``priority``: the class of calls to the interface that name none (None: default).
    priority: Priority | None = None
    #: ``reserve``: the share of this limit each class below critical must leave.
    reserve: Reserve | None = None
    #: In a class's variant (``classed``): each limit's share for that class, in
    #: ``limits`` order; None: no reserve in play (critical, or no limit has one).
    shares: tuple[float, ...] | None = None
    #: An interface with a reserve among its limits: its Rule for each class, by
    #: ``Priority.rank``, each with ``priority`` its class. Empty: every class alike.
    classed: tuple[Rule, ...] = field(default=(), compare=False, repr=False)
    #: ``rateLimit = 0`` here or in any of ``also`` (a closed channel closes its
    #: interfaces): every call refused. Computed, so the decision path reads a field.
    closed: bool = field(init=False, compare=False)

    if TYPE_CHECKING:
        # The generated __init__, except that ``algorithm`` may also be given as its
        # column value ("sliding_window"): __post_init__ makes it an Algorithm.
        def __init__(
            self,
            url: str,
            rate: int,
            cache: float,
            config_id: int,
            capacity: int = 0,
            algorithm: Algorithm | str = Algorithm.TOKEN_BUCKET,
            warmup: float = 0.0,
            period: int = 1,
            per_caller: bool = False,
            also: tuple[Rule, ...] = (),
            shadow: bool = False,
            max_concurrent: int | None = None,
            channel: str | None = None,
            caller: str | None = None,
            lease_ms: int = 0,
            calendar: Calendar | None = None,
            pacing: bool = False,
            pace_burst: int = DEFAULT_PACING_BURST,
            priority: Priority | None = None,
            reserve: Reserve | None = None,
            shares: tuple[float, ...] | None = None,
            classed: tuple[Rule, ...] = (),
        ) -> None: ...

    def __post_init__(self) -> None:
        if type(self.algorithm) is not Algorithm:  # ValueError naming an unknown one
            object.__setattr__(self, "algorithm", Algorithm(self.algorithm))
        closed = self.rate == 0 or (bool(self.also) and any(r.rate == 0 for r in self.also))
        object.__setattr__(self, "closed", closed)

    @property
    def caps_channel(self) -> bool:
        """True for a channel row's limit (``interfaceUrl`` ``*``): the sum of the calls
        of every interface of ``channel``."""
        return self.url == CHANNEL_URL

    @property
    def burst(self) -> int:
        """The most permits the bucket saves up."""
        return self.capacity or self.rate

    @property
    def table_key(self) -> Kind:
        """What the limit is looked up by in the one table (``model/algorithms.py``): a
        calendar quota's ``Quota.CALENDAR``, else the algorithm."""
        return self.algorithm if self.calendar is None else Quota.CALENDAR

    @property
    def spec(self) -> Spec:
        """What the limit is (``model/algorithms.py``)."""
        return ALGORITHM_TABLE[self.table_key]

    @property
    def kind(self) -> LimitKind:
        """The kind of state the limit keeps (its key's last part)."""
        return ALGORITHM_TABLE[self.table_key].kind

    @property
    def most(self) -> int:
        """The most permits the limit ever lets go at once: a bucket's capacity, a
        window's (or a calendar quota's) rate."""
        return most_held(self.table_key, self.rate, self.burst)

    @property
    def quota_most(self) -> int:
        """The most permits one call can ever get from this calendar quota (or window):
        its rate, and a paced quota's no more than its burst, all its pacing saves up
        (``model/calendar.py``, ``calendar_most``)."""
        if self.calendar is not None and self.pacing:
            return min(self.rate, self.pace_burst)
        return self.rate

    @property
    def window_most(self) -> int:
        """The most permits one call can ever get from the interface's limits: the least
        rate of its windows, a paced quota's burst if less (0: none of its limits is a
        window)."""
        return min((r.quota_most for r in self.limits if r.spec.window), default=0)

    @property
    def per_second(self) -> float:
        """The rate in permits per second (``rate / period``)."""
        return self.rate / self.period

    @property
    def quota_period(self) -> QuotaPeriod | None:
        """The calendar period (day, week, month) of a calendar quota, else None."""
        return None if self.calendar is None else self.calendar.renewal.period

    def for_class(self, priority: Priority) -> Rule:
        """The Rule a call of ``priority`` is decided by: this one, or its class's
        variant where a limit has a reserve."""
        return self.classed[priority.rank] if self.classed else self

    @property
    def limits(self) -> tuple[Rule, ...]:
        """Every limit of the interface: this one, then ``also``."""
        return (self, *self.also)

    @property
    def keyed(self) -> bool:
        """True when the caller's key matters: some limit is per caller."""
        return any(r.per_caller for r in self.limits)


@dataclass(frozen=True, slots=True)
class Skipped:
    """A row that was not applied, and why."""

    config_id: int
    reason: str
    #: the row's ``interfaceUrl`` (None: not known where the row was judged)
    url: str | None = None

    def __str__(self) -> str:
        where = "" if self.url is None else f" (interfaceUrl {_shown_url(self.url)})"
        return f"configId {self.config_id}: {self.reason}{where}"


def _shown_url(url: str) -> str:
    """``url`` as a log line shows it: quoted, control characters escaped, cut at 80."""
    return repr(url if len(url) <= 80 else url[:77] + "...")


def rule_from_row(
    row: ConfRow,
    default_cache: float,
    default_time_zone: str = DEFAULT_TIME_ZONE,
    pacing_burst: int = DEFAULT_PACING_BURST,
) -> Rule | Skipped | None:
    """The rule of one row, a Skipped with the reason and the row's URL, or None for a
    disabled row."""
    judged = _judged(row, default_cache, default_time_zone, pacing_burst)
    if isinstance(judged, Skipped) and isinstance(row.interface_url, str):
        return replace(judged, url=row.interface_url)
    return judged


def _judged(
    row: ConfRow, default_cache: float, default_time_zone: str, pacing_burst: int
) -> Rule | Skipped | None:
    """``rule_from_row``, the URL not yet named in a Skipped."""
    if row.status not in (0, 1):
        return Skipped(row.config_id, f"status {row.status!r} is not 0 or 1")
    if row.status == 0:
        return None
    problem = type_problem(row)
    if problem:
        return Skipped(row.config_id, problem)
    if row.shadow not in (None, 0, 1):
        return Skipped(row.config_id, f"shadow {row.shadow!r} is not 0 or 1")
    url = row.interface_url
    if url is None or url == "":
        return Skipped(row.config_id, "interfaceUrl is empty")
    if len(url) > MAX_URL_LENGTH:
        return Skipped(row.config_id, f"interfaceUrl longer than {MAX_URL_LENGTH} characters")
    bad = control_character(url)
    if bad is not None:
        return Skipped(
            row.config_id,
            f"interfaceUrl contains the control character {bad[1]!r} (character {bad[0]})",
        )
    if url != url.strip():
        # it never matches a call (callers pass the URL without them), and MySQL's
        # padding collations would match it to the URL without its trailing spaces
        return Skipped(row.config_id, f"interfaceUrl {url!r} starts or ends with whitespace")
    if row.rate_limit is None:
        return Skipped(row.config_id, "rateLimit is NULL")
    if row.rate_limit < 0:
        return Skipped(row.config_id, f"rateLimit {row.rate_limit} is negative")
    cache = default_cache if row.cache is None else float(row.cache)
    if not math.isfinite(cache) or cache < 0:
        return Skipped(row.config_id, f"cache {row.cache!r} is negative")
    # FLOAT(3,2) on MySQL reads back as e.g. 0.300000011920929; keep what was meant.
    cache = min(round(cache, 2), MAX_CACHE)
    problem, calendar = calendar_problem(row, default_time_zone)
    if problem:
        return Skipped(row.config_id, problem)
    problem, priority, reserve = priority_problem(row, calendar is not None)
    if problem:
        return Skipped(row.config_id, problem)
    algorithm = row.algorithm or Algorithm.TOKEN_BUCKET
    # NULL (a schema before revision 0004, or written so by hand): today's meaning.
    period = 1 if row.period_seconds is None else row.period_seconds
    per_caller = 0 if row.per_caller is None else row.per_caller
    if per_caller not in (0, 1):
        return Skipped(row.config_id, f"perCaller {per_caller!r} is not 0 or 1")
    problem = algorithm_problem(  # a calendar quota's maxPermits: its pacing burst
        algorithm,
        None if calendar is not None else row.max_permits,
        row.warmup_period,
        period,
        bool(per_caller),
    ) or share_problem(url, row.channel_type, row.caller_key, bool(per_caller))
    if problem:
        return Skipped(row.config_id, problem)
    if row.max_concurrent is not None and row.max_concurrent < 0:
        return Skipped(row.config_id, f"maxConcurrent {row.max_concurrent} is negative")
    if (
        row.max_permits
        and row.rate_limit
        and row.max_permits * period > MAX_FILL_S * row.rate_limit
    ):
        return Skipped(
            row.config_id,
            f"maxPermits {row.max_permits} takes more than a year to fill at rateLimit "
            f"{row.rate_limit} per {period} s",
        )
    problem = lease_range_problem(row)
    if problem:  # build_rules clears such a leaseMs first: only the edits' checks see this
        return Skipped(row.config_id, problem)
    capacity = row.max_permits or 0
    pace_burst = DEFAULT_PACING_BURST
    if calendar is not None:  # counted on the calendar's periods, as a fixed window
        algorithm = Algorithm.FIXED_WINDOW
        period = CALENDAR_SECONDS[calendar.renewal.period]
        pace_burst, capacity = capacity or pacing_burst, 0
    return Rule(
        url=url,
        rate=int(row.rate_limit),
        cache=cache,
        config_id=row.config_id,
        capacity=capacity,
        algorithm=Algorithm(algorithm),
        warmup=float(row.warmup_period or 0.0),
        period=period,
        per_caller=bool(per_caller),
        shadow=bool(row.shadow),
        # 0 is what `conf set --max-concurrent 0` clears: no concurrency limit, like NULL
        max_concurrent=row.max_concurrent or None,
        channel=row.channel_type if url == CHANNEL_URL else None,
        caller=row.caller_key,
        lease_ms=int(row.lease_ms or 0),
        calendar=calendar,
        pacing=bool(row.quota_pacing),
        pace_burst=pace_burst,
        priority=priority,
        reserve=reserve,
    )
