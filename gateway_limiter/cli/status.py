"""``gateway-limiter status [URL] [--watch]``: the rules in force and each bucket's live
state, once or refreshed in place until Ctrl-C."""

from __future__ import annotations

import argparse
import datetime as dt
import time
from collections.abc import Callable
from contextlib import suppress
from typing import TYPE_CHECKING

from gateway_limiter.cli.arguments import command, count_arg, interval_arg
from gateway_limiter.cli.context import (
    PROG,
    CliError,
    Context,
    database_problem,
    open_limiter,
    relaxed,
    sigterm_interrupts,
)
from gateway_limiter.cli.describe import (
    calendar_text,
    capacity,
    fmt_amount,
    on_off,
    url_effect,
)
from gateway_limiter.cli.listing import add_filters
from gateway_limiter.cli.output import Column, Report
from gateway_limiter.config.rules import Algorithm, Rule, read_ruleset
from gateway_limiter.core.status import CONDITIONS, condition
from gateway_limiter.model.bucket import US_PER_S, shape
from gateway_limiter.observe.redact import mask_secrets

if TYPE_CHECKING:
    from gateway_limiter.config.reload import Registry
    from gateway_limiter.core.status import BucketStatus
    from gateway_limiter.limiter import GatewayLimiter

#: The columns of ``status``. On a narrow terminal ``--watch`` takes the short headers,
#: leaves out the columns that change least (``drop``: 1 first), then cuts the state
#: and the URL.
STATUS_COLUMNS = (
    Column("interfaceUrl", short="URL", cut=24),
    Column("configId", numeric=True, short="id", drop=1),
    Column("rate", numeric=True, drop=5),
    Column("cache s", numeric=True, short="cache", drop=3),
    Column("capacity", numeric=True, short="cap", drop=4),
    Column("stored permits", numeric=True, short="stored"),
    # a window's permits counted in its window now, of its limit
    Column("used", numeric=True, drop=8),
    Column("debt ms", numeric=True, short="debt"),
    Column("next free ms", numeric=True, short="free ms"),
    # the supplier's pushbacks: the rate they leave, and what is left of a Retry-After
    # (too narrow for them, --watch says "held until" first in the state)
    Column("effective rate", numeric=True, short="eff", drop=6),
    Column("hold s", numeric=True, short="hold", drop=7),
    Column("algorithm", short="algo", drop=2),
    Column("state", cut=30),
)
#: The column a report gets, before ``algorithm``, when some interface has
#: ``maxConcurrent``: calls in flight fleet-wide / the cap.
IN_FLIGHT_COLUMN = Column("in flight", numeric=True, short="flight")
_IN_FLIGHT_AT = 11  # before "algorithm"
_USED_AT = 6  # "used": shown when some limit is a window
#: ``status --watch``: refresh every this many seconds unless --interval says otherwise.
WATCH_INTERVAL = 1.0


def register(parser: argparse.ArgumentParser) -> None:
    """Make ``parser`` the ``status`` command."""
    command(parser, cmd_status)
    parser.add_argument("url", metavar="URL", nargs="?", help="only this interface")
    parser.add_argument(
        "--watch",
        action="store_true",
        help="refresh every --interval seconds (in place on a terminal) until Ctrl-C",
    )
    parser.add_argument(
        "--interval",
        type=interval_arg,
        metavar="S",
        help=f"seconds between refreshes with --watch (default {WATCH_INTERVAL:g})",
    )
    add_filters(parser, "limits")
    parser.add_argument(
        "--status",
        dest="condition",
        choices=CONDITIONS,
        metavar="S",
        help="only limits in this condition: " + ", ".join(CONDITIONS),
    )
    # Stop --watch after N reports (tests, scripts); hidden from --help.
    parser.add_argument("--count", type=count_arg, metavar="N", help=argparse.SUPPRESS)


def cmd_status(ctx: Context) -> int:
    """The rules in force, after a reload like a gateway's, and each bucket's live state;
    with --watch, refreshed in place until Ctrl-C."""
    a = ctx.args
    if not a.watch and (a.interval is not None or a.count is not None):
        raise CliError("--interval and --count go with --watch", code=2)
    if a.watch and a.json:
        raise CliError("--json prints once: leave out --watch (or call it again)", code=2)
    limiter = open_limiter(relaxed(ctx.settings))
    try:
        # The switch of etcd or Apollo as a gateway starting now would see it (and
        # followed, while --watch refreshes).
        limiter.registry.start_following(wait=True)
        summary = limiter.registry.reload()
        if not summary.ok:
            raise CliError(database_problem(ctx.database, summary.error or "reload failed"))
        if a.watch:
            return _watch_status(ctx, limiter)
        if a.json:
            return _json_status(ctx, limiter)
        report, failed = status_report(ctx, limiter)
    finally:
        limiter.close()
    ctx.out.show(report)
    if failed:
        raise CliError(failed)
    return 0


def switch_origin(registry: Registry) -> str:
    """Where the switch in force comes from, in words (``status``)."""
    origin, source = registry.snapshot.switch_source, registry.switch_source
    if origin == "database":
        return "database row"
    if not source.external:
        return "settings default"
    where = f"{source.kind} {source.shown}"
    if origin == source.kind:
        return where
    if registry.switch_follower_reached():
        return f"settings default: no key {source.key!r} at {where}"
    return f"settings default: {where} not reached"


def status_report(ctx: Context, limiter: GatewayLimiter) -> tuple[Report, str]:
    """What ``status`` shows, from the limiter's current snapshot and live bucket state;
    and the first error reading bucket state ("" when none)."""
    settings, url = ctx.settings, ctx.args.url
    snapshot = limiter.registry.snapshot
    every = limiter.status(url)
    states = _filtered(ctx, limiter, every)
    report: Report = []
    report.append(f"switch: {on_off(snapshot.switch)} ({switch_origin(limiter.registry)})")
    if not snapshot.switch:
        report.append(
            "the switch is off: nothing is limited now; the rules below apply when it is on"
        )
    where = mask_secrets(settings.redis_url)
    if limiter.backend.shared:
        report.append(f"bucket state: {where}, key prefix {settings.key_prefix}")
        report.append(_fleet_line(limiter))
    else:
        report.append(
            f"bucket state: {where}: it lives inside each gateway process, so this command "
            "sees none (every bucket shows as full)"
        )
    if url is not None and not states:
        report.append(url_effect(url, *read_ruleset(limiter.registry.engine, settings)))
        return report, ""
    if every and not states:
        report.append(f"no limit of {len(every)} in force matches the filters")
    elif not states:
        report.append(f"no enabled rows: nothing is limited (see '{PROG} conf list')")
    else:
        flights = any(s.rule.max_concurrent is not None for s in states)
        columns: tuple[Column, ...] = STATUS_COLUMNS
        if flights:
            columns = (*columns[:_IN_FLIGHT_AT], IN_FLIGHT_COLUMN, *columns[_IN_FLIGHT_AT:])
        table = [_status_cells(s, flights) for s in states]
        if not any(s.rule.spec.window for s in states):
            columns = (*columns[:_USED_AT], *columns[_USED_AT + 1 :])  # only windows count
            table = [[*row[:_USED_AT], *row[_USED_AT + 1 :]] for row in table]
        report.append((columns, table))
    report.extend(f"skipped by the reload: {s}" for s in snapshot.skipped)
    failed = [s for s in states if s.error is not None]
    if failed:
        return report, f"cannot read bucket state from {where}: {failed[0].error}"
    return report, ""


def _filtered(
    ctx: Context, limiter: GatewayLimiter, states: list[BucketStatus]
) -> list[BucketStatus]:
    """The limits the filters pick (``--url``, ``--channel``, ``--algorithm``, ``--status``)."""
    from fnmatch import fnmatchcase

    from gateway_limiter.config.table import read_rows

    a = ctx.args
    channels: dict[int, str | None] = {}
    if a.channel is not None:
        channels = {r.config_id: r.channel_type for r in read_rows(limiter.registry.engine)}

    def picked(s: BucketStatus) -> bool:
        rule = s.rule
        if a.url_glob is not None and not fnmatchcase(rule.url, a.url_glob):
            return False
        if a.channel is not None and a.channel not in (rule.channel, channels.get(rule.config_id)):
            return False
        if a.algorithm is not None and rule.algorithm != a.algorithm:
            return False
        return a.condition is None or condition(s) == a.condition

    return [s for s in states if picked(s)]


def _json_status(ctx: Context, limiter: GatewayLimiter) -> int:
    """``status --json``: the switch, the fleet and every limit picked, as one object."""
    import json

    from gateway_limiter.backends.base import BackendError

    snapshot = limiter.registry.snapshot
    states = _filtered(ctx, limiter, limiter.status(ctx.args.url))
    fleet: int | None = None
    if limiter.backend.shared:
        with suppress(BackendError):
            fleet = len(limiter.backend.members()[0])
    out = {
        "switch": snapshot.switch,
        "switchSource": snapshot.switch_source,
        "shared": limiter.backend.shared,
        "fleet": fleet,
        "limits": [status_json(s) for s in states],
        "skipped": [str(s) for s in snapshot.skipped],
    }
    ctx.out.line(json.dumps(out, ensure_ascii=False, indent=1))
    failed = [s for s in states if s.error is not None]
    if failed:
        raise CliError(f"cannot read bucket state: {failed[0].error}")
    return 0


def status_json(s: BucketStatus) -> dict[str, object]:
    """One limit of ``status --json``: the row's numbers and the live state, times in
    milliseconds (null: not read, or not this kind of limit)."""
    rule = s.rule
    return {
        "interfaceUrl": rule.url,
        "configId": rule.config_id,
        "channelType": rule.channel,
        "callerKey": rule.caller,
        "algorithm": str(rule.table_key),  # a calendar quota's: "calendar"
        "rateLimit": rule.rate,
        "periodSeconds": rule.period,
        "cache": rule.cache,
        "capacity": capacity(rule),
        "perCaller": rule.per_caller,
        "shadow": rule.shadow,
        "condition": condition(s),
        "stored": s.stored,
        "debtMs": s.debt_ms,
        "used": s.used,
        "resetMs": s.reset_ms,
        "nextFreeMs": s.next_free_ms,
        "effectiveRate": s.effective_rate,
        "heldMs": s.held_ms,
        "heldUntil": s.held_until,
        "inFlight": s.in_flight,
        "maxConcurrent": rule.max_concurrent,
        "quota": quota_json(s),
        # priority classes: the class of calls that name none (null: default), and the
        # shares each class below critical leaves (null: none)
        "priority": None if rule.priority is None else rule.priority.value,
        "reserve": None if rule.reserve is None else str(rule.reserve),
        "error": s.error,
    }


def quota_json(s: BucketStatus) -> dict[str, object] | None:
    """A calendar quota's part of ``status --json`` (null for any other limit): used in
    the period the Redis clock is in (null: not read), its limit, when it renews (Unix
    seconds; null: not read), its period, zone and renewal, and its pacing."""
    rule = s.rule
    if rule.calendar is None:
        return None
    return {
        "used": s.quota_used,
        "limit": rule.rate,
        "resetsAt": s.renews_at,
        "period": str(rule.calendar.renewal.period),
        "zone": rule.calendar.zone.key,
        "renews": rule.calendar.renewal.text,
        "pacing": rule.pacing,
        "pacingBurst": rule.pace_burst if rule.pacing else None,
    }


def class_words(rule: Rule) -> str:
    """A limit's priority class and reserve, as ``status`` says them after its state
    ("" when it has neither)."""
    words = ""
    if rule.priority is not None:
        words += f"; calls {rule.priority.value} unless they say"
    if rule.reserve is not None:
        words += f"; reserve {rule.reserve}"
    return words


def _fleet_line(limiter: GatewayLimiter) -> str:
    """How many live processes share the rules (``share`` divides each rule by it)."""
    from gateway_limiter.backends.base import BackendError

    try:
        members, _ = limiter.backend.members()
    except BackendError as e:
        return f"fleet: unknown ({e})"
    n = len(members)
    return f"fleet: {n} live process{'es' if n != 1 else ''} (see '{PROG} fleet')"


def _watch_status(ctx: Context, limiter: GatewayLimiter) -> int:
    """Show ``status`` again every --interval seconds (in place on a terminal, one
    report after another otherwise) until Ctrl-C, SIGTERM, or --count reports.

    Each refresh reloads the rules like a gateway does; a database or Redis that fails
    meanwhile is shown in the report (the last good rules stay), never fatal.
    """
    a, out = ctx.args, ctx.out
    interval = WATCH_INTERVAL if a.interval is None else a.interval
    shown = 0

    def report() -> Report:
        summary = limiter.registry.reload() if shown else None
        body, failed = status_report(ctx, limiter)
        stamp = time.strftime("%H:%M:%S")
        head: Report = [f"{stamp}: every {interval:g} s, Ctrl-C to stop"]
        if summary is not None and not summary.ok:
            head.append(f"cannot reload ({summary.error}); showing the last good rules")
        if failed:
            head.append(failed)
        return head + body

    def more() -> bool:
        return a.count is None or shown < a.count

    with suppress(KeyboardInterrupt), sigterm_interrupts():
        if out.is_terminal:
            from rich.live import Live

            with Live(console=out.console, auto_refresh=False, transient=False) as live:
                while True:
                    live.update(out.renderable(report()), refresh=True)
                    shown += 1
                    if not more():
                        break
                    time.sleep(interval)
        else:
            while True:
                if shown:
                    out.line()
                out.show(report())
                shown += 1
                if not more():
                    break
                time.sleep(interval)
    return 0


def _quota_state(s: BucketStatus) -> str:
    """A calendar quota's state: "used 1,200 of 50,000; renews 2026-11-30 00:00 CST";
    "spent: " before it when no permit can go now, "idle: " when none is used; a paced
    one's burst and, between permits, when the next one comes ("paced, burst 30, next
    permit in 1.7 s; ")."""
    rule = s.rule
    assert rule.calendar is not None
    renews = calendar_text(rule)
    if rule.per_caller or rule.caller is not None:
        return f"each caller's count not shown; {renews}"
    if s.error is not None:
        return f"error: {s.error}"
    if s.quota_used is None or s.renews_at is None:
        return renews
    when = dt.datetime.fromtimestamp(s.renews_at, rule.calendar.zone)
    used_up = s.quota_used >= rule.rate
    state = condition(s)
    if state == "spent" and s.held_until is None:
        said = "spent: "
    elif state == "idle":  # as a window and --json say it
        said = "idle: "
    else:
        said = ""
    paced = ""
    if rule.pacing:
        paced = f"paced, burst {rule.pace_burst:,}"
        if s.next_free_ms and not used_up:
            paced += f", next permit in {fmt_duration(s.next_free_ms / 1000.0)}"
        paced += "; "
    return (
        f"{said}used {fmt_amount(s.quota_used)} of {fmt_amount(rule.rate)}; {paced}"
        f"renews {when:%Y-%m-%d %H:%M %Z} ({rule.calendar.zone.key})"
    )


def _for_each_caller(rule: Rule, state: str) -> str:
    return f"{state}, for each caller" if rule.per_caller else state


def _window_row(s: BucketStatus, row: Callable[..., list[str]]) -> list[str]:
    """A window's cells: its count of its limit in the ``used`` column, and in the state
    how long until the count is back to 0 (a spent window: until the next permit)."""
    rule = s.rule
    fixed = rule.algorithm == Algorithm.FIXED_WINDOW
    what = (
        f"{rule.rate:,} in each aligned {fmt_duration(rule.period)}"
        if fixed
        else f"{rule.rate:,} in any {fmt_duration(rule.period)}"
    )
    if rule.caller is not None:
        return row("-", "-", f"for caller {rule.caller!r} alone: at most {what} (not shown)")
    if rule.per_caller:
        return row("-", "-", f"per caller: at most {what} for each key (not shown)")
    if s.error is not None:
        return row("-", "-", f"error: {s.error}", "?")
    used = s.used or 0.0
    count = f"{used:,.0f}/{rule.rate:,}"
    cap = rule.rate if s.effective_rate is None else min(rule.rate, s.effective_rate)
    if used == 0.0:
        return row("-", "-", f"idle: none used; at most {what}", count)
    back = "" if s.reset_ms is None else fmt_duration(s.reset_ms / 1000.0)
    if used >= cap and s.next_free_ms:
        if fixed:
            return row("-", "-", f"spent: refused until it resets in {back}", count)
        wait = fmt_duration(s.next_free_ms / 1000.0)
        return row("-", "-", f"spent: next permit in {wait}; all back in {back}", count)
    state = f"resets in {back}" if fixed else f"all back in {back}"
    return row("-", "-", f"{used:,.0f} used; at most {what}; {state}", count)


def _ms(ms: float) -> str:
    """Milliseconds: one decimal below a second, whole ones above."""
    return f"{ms:.1f}" if ms < 1000.0 else f"{ms:.0f}"


def fmt_duration(seconds: float) -> str:
    """A span as people read it: ``350 ms``, ``12.5 s``, ``4 min 05 s``, ``23 h 59 min``,
    ``2 d 03 h``."""
    if seconds < 1.0:
        return f"{seconds * 1000.0:.0f} ms"
    if seconds < 60.0:
        return f"{seconds:.1f} s".replace(".0 s", " s")
    whole = int(seconds)
    for unit, name, sub, sub_name in ((86_400, "d", 3600, "h"), (3600, "h", 60, "min")):
        if whole >= unit:
            rest = whole % unit // sub
            return f"{whole // unit} {name}" + (f" {rest:02d} {sub_name}" if rest else "")
    return f"{whole // 60} min" + (f" {whole % 60:02d} s" if whole % 60 else "")


def _status_cells(s: BucketStatus, flights: bool = False) -> list[str]:
    rule = s.rule
    cap = capacity(rule)
    per = "" if rule.period == 1 else f"/{rule.period}s"  # the rate's and the effective's
    if rule.calendar is not None:
        per = f"/{rule.calendar.renewal.period}"
    rate = f"{rule.rate:,}{per}"
    url = f"* (channel {rule.channel})" if rule.caps_channel else rule.url
    head = [url, str(rule.config_id), rate, f"{rule.cache:g}", fmt_amount(cap)]
    shadow = "; shadow: counted, not enforced" if rule.shadow else ""
    if rule.lease_ms:  # stored permits exclude what processes hold in rate leases
        shadow += f"; rate leases of {rule.lease_ms} ms"
    shadow += class_words(rule)

    def row(stored: str, debt: str, state: str, used: str = "-") -> list[str]:
        free = "-" if s.next_free_ms is None else _ms(s.next_free_ms)
        effective = "-" if s.effective_rate is None else fmt_amount(s.effective_rate) + per
        hold = f"{s.held_ms / 1000.0:.1f}" if s.held_ms > 0 else "-"
        cells = [
            *head,
            stored,
            used,
            debt,
            free,
            effective,
            hold,
            rule.table_key,
            pushed + state + shadow,
        ]
        if flights:
            flight = "-" if s.in_flight is None else f"{s.in_flight}/{rule.max_concurrent}"
            cells.insert(_IN_FLIGHT_AT, flight)
        return cells

    pushed = ""
    if s.held_until is not None:
        ends = time.strftime("%H:%M:%S", time.gmtime(s.held_until))
        pushed = f"held until {ends} UTC (pushback); "
    elif s.effective_rate is not None and s.effective_rate < rule.rate:
        pushed = "slowed by pushbacks; "

    if rule.closed:
        return row("-", "-", "closed: every call refused")
    if rule.calendar is not None:
        count = "-" if s.used is None else f"{s.used:,.0f}/{rule.rate:,}"
        return row("-", "-", _quota_state(s), count)
    if rule.spec.window:
        return _window_row(s, row)
    if rule.caller is not None:
        return row("-", "-", f"for caller {rule.caller!r} alone: its own bucket (not shown)")
    if rule.per_caller:
        return row("-", "-", "per caller: each key has its own bucket (not shown)")
    if s.error is not None:
        return row("?", "?", f"error: {s.error}")
    cold = "; cold: paced below the rate until warm" if rule.algorithm == Algorithm.WARM_UP else ""
    if s.stored is None:
        return row(f"{cap:.2f}", "0.0", f"idle (full, no state stored){cold}")
    state = "in debt: callers queue" if s.debt_ms > 0 else "ok"
    if cold and s.stored > shape(rule.rate, rule.burst, rule.warmup * US_PER_S).threshold:
        state += cold
    return row(f"{s.stored:.2f}", f"{s.debt_ms:.1f}", state)
