"""Prometheus metrics, when prometheus-client is installed (``gateway-limiter[metrics]``).

How it works: docs/internals.md, section ``gateway_limiter.observe.metrics``.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any, Final, Literal, NamedTuple
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from gateway_limiter.model.bucket import US_PER_S
from gateway_limiter.model.pushback import effective_rate

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

    from gateway_limiter.config.reload import ReloadSummary, Snapshot

try:
    import prometheus_client
except ImportError:  # the optional extra is not installed: no metrics
    prometheus_client = None  # type: ignore[assignment]

PREFIX: Final = "gateway_limiter_"
#: The ``interface`` label of every URL that has no row in the table.
UNCONFIGURED: Final = "<unconfigured>"
#: Wait histogram buckets, seconds: 0 (no wait) up to the largest ``cache`` (9.99 s).
WAIT_BUCKETS: Final = (0.0, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class MetricsUnavailable(RuntimeError):
    """prometheus-client is not installed."""


def interface_label(snapshot: Snapshot, url: str) -> str:
    """``url`` when the table has a row for it (enabled or disabled), else UNCONFIGURED.

    Any string a caller passes could otherwise become a label value, without bound.
    """
    if url in snapshot.rules or url in snapshot.disabled:
        return url
    return UNCONFIGURED


class BucketSample(NamedTuple):
    """One bucket's live state, for the ``gateway_limiter_bucket_*`` gauges."""

    url: str
    stored: float  # permits saved up now
    debt: float  # seconds of queued debt
    next_free: float | None  # seconds until one permit would be granted; None: unknown


@dataclass(frozen=True, slots=True, eq=False)
class Source:
    """Where the gauges come from: a limiter's snapshot, breaker, and (optionally) buckets."""

    snapshot: Callable[[], Snapshot]
    fallback: Callable[[], bool]
    #: Set by ``serve-metrics`` only: peeks every bucket in Redis at each scrape.
    buckets: Callable[[], Iterable[BucketSample]] | None = None
    #: The live processes of the fleet last seen (a limiter's ``fleet_size``).
    fleet_size: Callable[[], int] | None = None
    #: interface -> its effective rate as a fraction of the row's, where the last reply
    #: said it was below 1 (pushback); the others run at the row's rate.
    factors: Callable[[], Mapping[str, float]] | None = None
    #: interface -> calls in flight fleet-wide, as the last slot call saw it.
    in_flight: Callable[[], Mapping[str, int]] | None = None
    #: (interface, period) -> the used ratio of its calendar quota, as last seen.
    quota_used: Callable[[], Mapping[tuple[str, str], float]] | None = None


class Tally:
    """A count bumped without a lock: ``bump()`` is ``next()`` on an ``itertools.count``,
    one C call that holds the GIL throughout, so concurrent bumps are never lost.

    The count is read back from the counter's repr (``count(41)``): the one way to
    read an ``itertools.count`` without bumping it.
    """

    __slots__ = ("_count", "bump")

    def __init__(self) -> None:
        self._count = itertools.count()
        #: Add one (the bound ``__next__``: no Python frame on the decision path).
        self.bump: Callable[[], int] = self._count.__next__

    @property
    def value(self) -> int:
        """How many bumps so far."""
        return int(repr(self._count)[len("count(") : -1])


#: The finite upper bounds of the wait histogram's buckets above 0.
_BOUNDS: Final = WAIT_BUCKETS[1:]
#: Every bucket's ``le`` label as Prometheus writes it ("0.0", "0.001", ..., "+Inf").
_LE: Final = (*(repr(b) for b in WAIT_BUCKETS), "+Inf")


class WaitHistogram:
    """Waits of one interface: no-wait calls in a Tally, the rest under a lock."""

    __slots__ = ("_counts", "_lock", "_sum", "no_wait")

    def __init__(self) -> None:
        self.no_wait = Tally()
        self._lock = threading.Lock()
        self._counts = [0] * (len(_BOUNDS) + 1)  # per bucket above 0, the last one +Inf
        self._sum = 0.0

    def observe(self, seconds: float) -> None:
        """Count a wait of ``seconds`` (> 0)."""
        i = bisect_left(_BOUNDS, seconds)  # the first bucket whose bound is >= seconds
        with self._lock:
            self._counts[i] += 1
            self._sum += seconds

    def buckets(self) -> tuple[list[tuple[str, float]], float]:
        """Cumulative buckets in Prometheus' form (``le`` text, count), and the sum."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        running = self.no_wait.value
        cumulative = [(_LE[0], float(running))]
        for le, count in zip(_LE[1:], counts, strict=True):
            running += count
            cumulative.append((le, float(running)))
        return cumulative, total


class ProcessMetrics:
    """The process's metrics on one registry: tallies for the decision path, counters
    for the rest, gauges computed on scrape."""

    #: False: the gauges are computed at scrape time (see ``MultiProcessMetrics``).
    multiprocess = False

    def __init__(self, registry: CollectorRegistry | None) -> None:
        assert prometheus_client is not None
        from prometheus_client import Counter

        self.backend_errors = Counter(
            PREFIX + "backend_errors", "Redis calls that failed.", registry=registry
        )
        self.backend_fallbacks = Counter(
            PREFIX + "backend_fallbacks",
            "Decisions made by on_backend_error because Redis could not be asked.",
            registry=registry,
        )
        self.reloads = Counter(
            PREFIX + "reloads", "Reloads of the limits, by outcome.", ["outcome"], registry=registry
        )
        for outcome in ("ok", "failed"):  # both series exist from the start, at 0
            self.reloads.labels(outcome=outcome)
        #: ``slot()`` calls that queued for a slot / were refused, by interface
        self.slot_waits = Counter(
            PREFIX + "slot_waits",
            "slot() calls that had to wait for a free slot.",
            ["interface"],
            registry=registry,
        )
        self.slot_refusals = Counter(
            PREFIX + "slot_refusals",
            "slot() calls refused: no slot or no rate permit within the wait budget.",
            ["interface"],
            registry=registry,
        )
        # (interface, reason, allowed) -> its tally; interface -> its waits.
        self._decided: dict[tuple[str, str, bool, str], Tally] = {}
        self._bumps: dict[tuple[str, str, bool, str], Callable[[], int]] = {}
        self._waited: dict[str, WaitHistogram] = {}
        self._local = Tally()  # refusals decided in-process
        #: Count one refusal decided in-process, with no round trip (``core.local_refusal``).
        self.local_refusal = self._local.bump
        self._sources: list[Source] = []
        self._lock = threading.Lock()
        if registry is not None:  # None: multiprocess mode, where the files say it all
            registry.register(_Collector(self))

    def factor_seen(self, url: str, rate: float, algorithm: str, factor: float) -> None:
        """A reply said ``url`` runs at ``factor`` (only ``multiprocess`` metrics care:
        here the gauge is computed at scrape time)."""

    def quota_seen(self, url: str, period: str, ratio: float) -> None:
        """A reply said ``url``'s calendar quota of ``period`` is ``ratio`` used (only
        ``multiprocess`` metrics care: here the gauge is computed at scrape time)."""

    # --- the decision path --------------------------------------------------------------

    def record(
        self,
        interface: str,
        reason: str,
        allowed: bool,
        wait_micros: float | None,
        priority: str = "default",
    ) -> None:
        """Count one decision of class ``priority``; count its wait (µs) too when
        ``wait_micros`` is not None."""
        bump = self._bumps.get((interface, reason, allowed, priority))
        if bump is None:
            bump = self._bind(interface, reason, allowed, priority)
        bump()
        if wait_micros is not None:
            waits = self._waited.get(interface)
            if waits is None:
                waits = self._waited.setdefault(interface, WaitHistogram())
            if wait_micros <= 0:
                waits.no_wait.bump()
            else:
                waits.observe(wait_micros / US_PER_S)

    def _bind(self, interface: str, reason: str, allowed: bool, priority: str) -> Callable[[], int]:
        key = (interface, reason, allowed, priority)
        with self._lock:  # two threads binding the same key at once keep one tally
            tally = self._decided.setdefault(key, Tally())
            return self._bumps.setdefault(key, tally.bump)

    def decisions(self) -> list[tuple[tuple[str, str, bool, str], int]]:
        """Every (interface, reason, allowed, priority) counted so far, with its count."""
        return [(key, tally.value) for key, tally in list(self._decided.items())]

    def local_refusals(self) -> int:
        """Refusals decided in-process so far."""
        return self._local.value

    def waits(self) -> list[tuple[str, WaitHistogram]]:
        """Every interface's wait histogram."""
        return list(self._waited.items())

    # --- off the decision path ----------------------------------------------------------

    def backend_error(self) -> None:
        """A Redis call failed."""
        self.backend_errors.inc()

    def fallback(self) -> None:
        """``on_backend_error`` made a decision."""
        self.backend_fallbacks.inc()

    def reloaded(self, summary: ReloadSummary) -> None:
        """A reload finished (Registry listener); a switch etcd or Apollo changed is no
        reload, and not counted as one."""
        if not summary.switch_only:
            self.reloads.labels(outcome="ok" if summary.ok else "failed").inc()

    def attach(self, source: Source) -> None:
        """Make ``source`` the one the gauges describe (the newest attached wins)."""
        with self._lock:
            self._sources.append(source)

    def detach(self, source: Source) -> None:
        """``source``'s limiter closed: the gauges go back to the one attached before."""
        with self._lock:
            if source in self._sources:
                self._sources.remove(source)

    def current(self) -> Source | None:
        """The source the gauges describe now."""
        with self._lock:
            return self._sources[-1] if self._sources else None


class _Collector:
    """The decision path's tallies, and gauges computed at scrape time from the current
    source."""

    def __init__(self, owner: ProcessMetrics) -> None:
        self._owner = owner

    def describe(self) -> Iterator[Metric]:
        """The metrics' names, for the registry (without reading any state)."""
        return iter(_counted(None) + _families(None))

    def collect(self) -> Iterator[Metric]:
        """Every metric, as of now."""
        return iter(_counted(self._owner) + _families(self._owner.current()))


def _counted(owner: ProcessMetrics | None) -> list[Metric]:
    from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

    decisions = CounterMetricFamily(
        PREFIX + "decisions",
        "Decisions, by interface, outcome (admitted, refused), reason and priority class.",
        labels=["interface", "outcome", "reason", "priority"],
    )
    waits = HistogramMetricFamily(
        PREFIX + "wait_seconds",
        "Waits granted to admitted calls on limited interfaces, seconds "
        "(shadow rules: the wait the limit would have imposed).",
        labels=["interface"],
    )
    local = CounterMetricFamily(
        PREFIX + "local_refusals",
        "Of the refusals, those decided in-process with no round trip: an earlier reply "
        "said the interface was not free within the caller's timeout.",
    )
    if owner is not None:
        local.add_metric([], owner.local_refusals())
        for (interface, reason, allowed, priority), count in sorted(owner.decisions()):
            outcome = "admitted" if allowed else "refused"
            decisions.add_metric([interface, outcome, reason, priority], count)
        for interface, histogram in sorted(owner.waits(), key=lambda item: item[0]):
            buckets, total = histogram.buckets()
            waits.add_metric([interface], buckets, total)
    return [decisions, local, waits]


def _families(source: Source | None) -> list[Metric]:
    from prometheus_client.core import GaugeMetricFamily

    def gauge(name: str, doc: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
        return GaugeMetricFamily(PREFIX + name, doc, labels=list(labels))

    rules = gauge("rules_in_force", "Rules loaded from the table (shadow ones included).")
    shadow = gauge("shadow_rules", "Rules in shadow mode: decided and counted, not enforced.")
    skipped = gauge("rows_skipped", "Rows the last reload skipped as invalid.")
    switch = gauge("switch_on", "The global switch: 1 on (limits apply), 0 off.")
    age = gauge("reload_age_seconds", "Seconds since the last successful reload.")
    fallback = gauge("backend_fallback", "1 while on_backend_error decides instead of Redis.")
    rates = gauge(
        "rule_permits_per_second", "Each rule's rateLimit (0: closed).", labels=["interface"]
    )
    stored = gauge("bucket_stored_permits", "Permits saved up in the bucket.", ["interface"])
    debt = gauge("bucket_debt_seconds", "Seconds of debt queued in the bucket.", ["interface"])
    free = gauge(
        "bucket_next_free_seconds", "Seconds until one permit would be granted.", ["interface"]
    )
    fleet = gauge("fleet_size", "Live processes sharing the rules, as Redis last said.")
    effective = gauge(
        "effective_rate",
        "Each rule's rate after the supplier's pushbacks, as this process last saw it "
        "(permits per period; the rateLimit when none).",
        labels=["interface"],
    )
    in_flight = gauge(
        "in_flight",
        "Calls in flight fleet-wide on interfaces with maxConcurrent, as this process's "
        "last slot call saw it.",
        labels=["interface"],
    )
    quota = gauge(
        "quota_used_ratio",
        "Each calendar quota's period used (0 to 1), fleet-wide, as this process's last "
        "decision on the interface saw it.",
        labels=["interface", "period"],
    )
    families: list[Metric] = [rules, shadow, skipped, switch, age, fallback, fleet]
    families += [rates, stored, debt, free, effective, in_flight, quota]
    if source is None:
        return families
    snapshot = source.snapshot()
    rules.add_metric([], len(snapshot.rules))
    shadow.add_metric([], sum(r.shadow for r in snapshot.rules.values()))
    skipped.add_metric([], len(snapshot.skipped))
    switch.add_metric([], 1.0 if snapshot.switch else 0.0)
    if snapshot.loaded_at is not None:
        age.add_metric([], max(0.0, time.time() - snapshot.loaded_at))
    fallback.add_metric([], 1.0 if source.fallback() else 0.0)
    if source.fleet_size is not None:
        fleet.add_metric([], source.fleet_size())
    factors = {} if source.factors is None else source.factors()
    for url in sorted(snapshot.rules):
        rates.add_metric([url], snapshot.rules[url].rate)
        rule = snapshot.rules[url]
        effective.add_metric(
            [url], effective_rate(rule.rate, factors.get(url, 1.0), rule.algorithm)
        )
    seen = {} if source.in_flight is None else source.in_flight()
    for url in sorted(snapshot.rules):
        if snapshot.rules[url].max_concurrent is not None:
            in_flight.add_metric([url], seen.get(url, 0))
    if source.quota_used is not None:
        for (url, period), ratio in sorted(source.quota_used().items()):
            if url in snapshot.rules:
                quota.add_metric([url, period], ratio)
    if source.buckets is not None:
        for sample in source.buckets():
            stored.add_metric([sample.url], sample.stored)
            debt.add_metric([sample.url], sample.debt)
            if sample.next_free is not None:
                free.add_metric([sample.url], sample.next_free)
    return families


# --- pre-forking servers: prometheus-client's multiprocess mode ------------------------


def multiprocess_mode() -> bool:
    """True when prometheus-client runs in multiprocess mode: ``PROMETHEUS_MULTIPROC_DIR``
    was set when it was imported, and every value lives in a file of that directory."""
    if prometheus_client is None:
        return False
    from prometheus_client import values

    return values.ValueClass is not values.MutexValue


#: How a gauge's values in several workers' files come together (those used here).
_Mode = Literal["mostrecent", "max"]


class MultiProcessMetrics(ProcessMetrics):
    """The process's metrics as prometheus-client objects writing to
    ``PROMETHEUS_MULTIPROC_DIR``, for a ``MultiProcessCollector`` in whichever process
    serves the scrape to add up (docs/observability.md, "Pre-forking servers").

    A scrape of a pre-forked server is answered by one worker, which cannot compute
    another worker's gauges at that moment: so nothing is registered (every metric
    lives in the directory), counters and the histogram are recorded as they happen, and
    the gauges are set when their value changes, each with the ``multiprocess_mode``
    that makes sense of several workers: what the table says (rules, switch, rates) and
    the effective rate are the most recent any worker saw; the fleet's size, the
    largest. ``reload_age_seconds``, ``backend_fallback`` and the ``bucket_*`` gauges
    need the scrape's own moment and are not kept here (``reloads_total`` and
    ``backend_fallbacks_total`` say the same over time).
    """

    multiprocess = True

    def __init__(self) -> None:
        assert prometheus_client is not None
        from prometheus_client import Counter, Gauge, Histogram

        super().__init__(None)
        self._counted = Counter(
            PREFIX + "decisions",
            "Decisions, by interface, outcome (admitted, refused), reason and priority class.",
            ["interface", "outcome", "reason", "priority"],
            registry=None,
        )
        self._waits = Histogram(
            PREFIX + "wait_seconds",
            "Waits granted to admitted calls on limited interfaces, seconds "
            "(shadow rules: the wait the limit would have imposed).",
            ["interface"],
            buckets=WAIT_BUCKETS,
            registry=None,
        )
        local = Counter(
            PREFIX + "local_refusals",
            "Of the refusals, those decided in-process with no round trip.",
            registry=None,
        )
        self.local_refusal = local.inc  # type: ignore[assignment]

        def gauge(name: str, doc: str, mode: _Mode, labels: Iterable[str] = ()) -> Any:
            return Gauge(PREFIX + name, doc, list(labels), registry=None, multiprocess_mode=mode)

        #: interface -> the rate its effective_rate gauge was last set under by _publish
        self._published: dict[str, int] = {}
        recent: _Mode = "mostrecent"
        self._rules = gauge("rules_in_force", "Rules loaded from the table.", recent)
        self._shadow = gauge("shadow_rules", "Rules in shadow mode.", recent)
        self._skipped = gauge("rows_skipped", "Rows the last reload skipped.", recent)
        self._switch = gauge("switch_on", "The global switch: 1 on, 0 off.", recent)
        self._fleet = gauge("fleet_size", "Live processes sharing the rules.", "max")
        self._rates = gauge(
            "rule_permits_per_second", "Each rule's rateLimit.", recent, ["interface"]
        )
        self._effective = gauge(
            "effective_rate",
            "Each rule's rate after the supplier's pushbacks, as a worker last saw it.",
            recent,
            ["interface"],
        )
        # The ratio is the fleet's (Redis counts), as each worker's last decision saw it:
        # the most recent is the truest. Not the largest: a period's renewal, or a quota
        # raised mid-period, lowers it, and a worker idle since would hold it up.
        self._quota = gauge(
            "quota_used_ratio",
            "Each calendar quota's period used (0 to 1), fleet-wide, as the last decision "
            "of any worker on the interface saw it.",
            recent,
            ["interface", "period"],
        )

    def record(
        self,
        interface: str,
        reason: str,
        allowed: bool,
        wait_micros: float | None,
        priority: str = "default",
    ) -> None:
        """Count one decision (and its wait) in this worker's files."""
        super().record(interface, reason, allowed, wait_micros, priority)
        if wait_micros is not None:
            self._waits.labels(interface).observe(max(0.0, wait_micros / US_PER_S))

    def _bind(self, interface: str, reason: str, allowed: bool, priority: str) -> Callable[[], int]:
        key = (interface, reason, allowed, priority)
        outcome = "admitted" if allowed else "refused"
        child = self._counted.labels(interface, outcome, reason, priority)
        with self._lock:  # as ProcessMetrics._bind: one tally (and file entry) per key
            tally = self._decided.setdefault(key, Tally())

            def bump() -> int:
                child.inc()
                return tally.bump()

            return self._bumps.setdefault(key, bump)

    def attach(self, source: Source) -> None:
        """As ``ProcessMetrics.attach``, and the gauges set from ``source`` now."""
        super().attach(source)
        self._publish(source)

    def reloaded(self, summary: ReloadSummary) -> None:
        """A reload finished: counted, and the gauges set from what it loaded."""
        super().reloaded(summary)
        source = self.current()
        if source is not None and summary.ok:
            self._publish(source)

    def factor_seen(self, url: str, rate: float, algorithm: str, factor: float) -> None:
        """A reply said ``url`` runs at ``factor`` of its ``rate``: the gauge follows."""
        self._effective.labels(url).set(effective_rate(rate, factor, algorithm))

    def quota_seen(self, url: str, period: str, ratio: float) -> None:
        """A reply said ``url``'s calendar quota of ``period`` is ``ratio`` used."""
        self._quota.labels(url, period).set(ratio)

    def _publish(self, source: Source) -> None:
        snapshot = source.snapshot()
        self._rules.set(len(snapshot.rules))
        self._shadow.set(sum(r.shadow for r in snapshot.rules.values()))
        self._skipped.set(len(snapshot.skipped))
        self._switch.set(1.0 if snapshot.switch else 0.0)
        if source.fleet_size is not None:
            self._fleet.set(source.fleet_size())
        factors = {} if source.factors is None else source.factors()
        for url, rule in snapshot.rules.items():
            self._rates.labels(url).set(rule.rate)
            # The effective rate follows the replies (factor_seen); here only what this
            # worker has not said yet, or a new rate: a reload must not undo a pushback
            # another worker saw and this one did not.
            if self._published.get(url) != rule.rate:
                self._published[url] = rule.rate
                factor = factors.get(url, 1.0)
                self._effective.labels(url).set(effective_rate(rule.rate, factor, rule.algorithm))


_process: ProcessMetrics | None = None
_process_lock = threading.Lock()


def process_metrics() -> ProcessMetrics | None:
    """The process's metrics on the default registry (made on first use), or in
    ``PROMETHEUS_MULTIPROC_DIR`` under prometheus-client's multiprocess mode; None
    without prometheus-client."""
    global _process  # noqa: PLW0603 - one set of metrics per registry, per process
    if prometheus_client is None:
        return None
    if _process is None:
        with _process_lock:
            if _process is None:
                if multiprocess_mode():
                    _process = MultiProcessMetrics()
                else:
                    _process = ProcessMetrics(prometheus_client.REGISTRY)
    return _process


def after_fork_in_child() -> None:
    """This process was forked from one whose metrics may be in use (``lifecycle.py``).

    Under multiprocess mode the child's metrics are made afresh on first use: its values
    go to files of its own pid, and its gauges are set again (the parent's record of
    what it had published means nothing to the child's files). Otherwise the child keeps
    the parent's counts (a copy) with locks of its own: a thread of the parent may have
    held them at the fork, and the child has no such thread to let them go.
    """
    global _process, _process_lock  # noqa: PLW0603 - the child's own
    _process_lock = threading.Lock()
    if _process is None:
        return
    if _process.multiprocess:
        _process = None
    else:
        _process._lock = threading.Lock()


# --- the HTTP endpoint -------------------------------------------------------------------


class _QuietHandler(WSGIRequestHandler):
    """No line on stderr per scrape."""

    def log_message(self, format: str, *args: Any) -> None:
        """Say nothing."""


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    """One thread per scrape, so a slow scraper never holds up the next."""

    daemon_threads = True


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


class MetricsServer:
    """The default registry in Prometheus' text format over HTTP, served by a daemon thread.

    >>> server = serve(9464)  # doctest: +SKIP
    >>> server.port, server.close()  # doctest: +SKIP
    """

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        if prometheus_client is None:
            raise MetricsUnavailable(
                "prometheus-client is not installed: pip install 'gateway-limiter[metrics]'"
            )
        app = prometheus_client.make_wsgi_app(prometheus_client.REGISTRY)
        server_class = _ThreadingServer6 if ":" in host else _ThreadingServer
        self._server = make_server(
            host, port, app, server_class=server_class, handler_class=_QuietHandler
        )
        #: The port listened on (the one chosen by the system when asked for 0).
        self.port: int = self._server.server_port
        self.host = host
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="gateway_limiter.metrics", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def serve(port: int, host: str = "127.0.0.1") -> MetricsServer:
    """Serve the default registry on ``http://host:port/metrics`` until ``close()``.

    Any path answers with the metrics; port 0 picks a free port (see ``.port``).
    Raises MetricsUnavailable without prometheus-client, OSError if the port is taken.
    """
    return MetricsServer(port, host)
