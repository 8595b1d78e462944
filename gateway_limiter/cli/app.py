"""The ``gateway-limiter`` command line: the table, the switch, live bucket state, a demo.

Every command runs through ``main(argv) -> int``: 0 on success, 2 on bad usage (argparse,
and values checked before anything is written), 1 on any other error. An expected error
(a bad setting, an unreachable database, a missing table) is one line on stderr with
passwords masked; only a bug shows a traceback.

Output goes through rich: tables on a terminal, plain aligned text when piped (no ANSI
codes, no wrapping at 80 columns), so ``gateway-limiter conf list | grep`` works.

Commands that write (``conf set/enable/disable``, ``switch``) change one row in one
transaction, after every argument has been checked: an error never leaves half a change.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from alembic.util import CommandError
from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text
from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from gateway_limiter.backends.base import BackendError
from gateway_limiter.config.migrate import current_revision, head_revision, upgrade
from gateway_limiter.config.reload import describe_db_error
from gateway_limiter.config.rules import (
    ALGORITHMS,
    FIXED_WINDOW,
    MAX_CACHE,
    MAX_PERIOD,
    MAX_URL_LENGTH,
    SLIDING_WINDOW,
    TOKEN_BUCKET,
    WARM_UP,
    Rule,
    RuleSet,
    algorithm_problem,
    build_rules,
    scope_text,
)
from gateway_limiter.config.settings import Settings, SettingsError, load_settings, mask_secrets
from gateway_limiter.config.table import (
    CONF_TABLE,
    ConfRow,
    DatabaseUrlError,
    RateLimitConf,
    find_rows,
    make_engine,
    read_rows,
    read_switch,
    set_status,
    upsert_conf,
    write_switch,
)
from gateway_limiter.limiter import (
    BucketStatus,
    GatewayLimiter,
    chosen_limits,
    describe_state,
    has_shared_bucket,
)
from gateway_limiter.model.bucket import MICROS, shape, stored_cost

if TYPE_CHECKING:
    from gateway_limiter.observe.metrics import BucketSample

PROG = "gateway-limiter"
#: INT(11) is a signed 32-bit column.
MAX_RATE = 2**31 - 1
#: channelType and interfaceNo are VARCHAR(24).
MAX_LABEL_LENGTH = 24
#: The command line is not the hot path: give Redis this long before calling it down.
CLI_REDIS_TIMEOUT = 2.0
#: Loggers kept quiet unless --verbose: the CLI reports what matters itself, once.
QUIET_LOGGERS = ("gateway_limiter", "apscheduler")
#: How ``--max-permits`` and ``--warmup`` say "clear the column to NULL".
NONE_WORD = "none"


class CliError(Exception):
    """An expected failure: reported as one line on stderr, exit code ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# --- argument values, checked before anything is written -------------------------------


def _shown(text: str) -> str:
    """A value as an error message quotes it (long values shortened)."""
    return repr(text) if len(text) <= 40 else f"{text[:37]!r}... ({len(text)} characters)"


def rate_arg(text: str) -> int:
    """``--rate``: a whole number of permits per second, 0 (closed) up to INT(11)."""
    if not re.fullmatch(r"[0-9]+", text.strip()) or int(text) > MAX_RATE:
        raise argparse.ArgumentTypeError(
            f"invalid value {_shown(text)}: must be a whole number from 0 to {MAX_RATE}"
        )
    return int(text)


def cache_arg(text: str) -> float:
    """``--cache``: seconds a caller may wait, 0 to 9.99 with at most 2 decimals."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 <= value <= MAX_CACHE):
        raise argparse.ArgumentTypeError(
            f"invalid value {_shown(text)}: must be a number of seconds from 0 to {MAX_CACHE}"
        )
    # The column is FLOAT(3,2): refuse what it would silently round.
    if round(value, 2) != value:
        raise argparse.ArgumentTypeError(
            f"invalid value {_shown(text)}: at most 2 decimals (the column is FLOAT(3,2))"
        )
    return value


def url_arg(text: str) -> str:
    """``URL``: the interfaceUrl, 1 to 128 characters, no surrounding spaces."""
    if not 1 <= len(text) <= MAX_URL_LENGTH:
        raise argparse.ArgumentTypeError(
            f"invalid value {_shown(text)}: must be 1 to {MAX_URL_LENGTH} characters"
        )
    if text != text.strip():
        # Callers never pass the spaces, so such a row would never match a call.
        raise argparse.ArgumentTypeError(
            f"invalid value {_shown(text)}: must not start or end with whitespace"
        )
    return text


def label_arg(text: str) -> str:
    """``--channel``/``--interface-no``: at most 24 characters ('' clears it to NULL)."""
    if len(text) > MAX_LABEL_LENGTH:
        raise argparse.ArgumentTypeError(
            f"invalid value {_shown(text)}: at most {MAX_LABEL_LENGTH} characters"
        )
    return text


def max_permits_arg(text: str) -> int | None:
    """``--max-permits``: a whole number (INT(11)), or ``none`` for NULL (capacity = rate).

    Only the form is checked here; whether the value suits the row's algorithm is
    ``rules.algorithm_problem``'s to say, as it is for the reload.
    """
    if text.strip().lower() == NONE_WORD:
        return None
    if not re.fullmatch(r"-?[0-9]+", text.strip()) or not -MAX_RATE <= int(text) <= MAX_RATE:
        raise argparse.ArgumentTypeError(
            f"invalid value {_shown(text)}: must be a whole number of permits (1 to "
            f"{MAX_RATE}) or '{NONE_WORD}'"
        )
    return int(text)


def warmup_arg(text: str) -> float | None:
    """``--warmup``: seconds from cold to the full rate, or ``none`` for NULL.

    Only the form is checked here; the range is ``rules.algorithm_problem``'s to say.
    """
    if text.strip().lower() == NONE_WORD:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(
            f"invalid value {_shown(text)}: must be a number of seconds or '{NONE_WORD}'"
        )
    return value


def period_arg(text: str) -> int:
    """``--period``: the seconds a rate is for, a whole number from 1 to a day."""
    if not re.fullmatch(r"[0-9]+", text.strip()) or not 1 <= int(text) <= MAX_PERIOD:
        raise argparse.ArgumentTypeError(
            f"invalid value {_shown(text)}: must be a whole number of seconds from 1 to "
            f"{MAX_PERIOD}"
        )
    return int(text)


def interval_arg(text: str) -> float:
    """``status --interval``: seconds between refreshes, 0.1 to 3600."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0.1 <= value <= 3600):
        raise argparse.ArgumentTypeError(
            f"invalid value {_shown(text)}: must be a number of seconds from 0.1 to 3600"
        )
    return value


def count_arg(text: str) -> int:
    """``status --count``: a whole number of reports, 1 or more."""
    if not re.fullmatch(r"[0-9]+", text.strip()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"invalid value {_shown(text)}: must be 1 or more")
    return int(text)


def port_arg(text: str) -> int:
    """``serve-metrics --port``: a TCP port, 0 (any free one) to 65535."""
    if not re.fullmatch(r"[0-9]+", text.strip()) or int(text) > 65535:
        raise argparse.ArgumentTypeError(
            f"invalid value {_shown(text)}: must be a port number from 0 to 65535"
        )
    return int(text)


def seconds_arg(text: str) -> int:
    """``demo --seconds``: a whole number from 3 to 3600."""
    if not re.fullmatch(r"[0-9]+", text.strip()) or not 3 <= int(text) <= 3600:
        raise argparse.ArgumentTypeError(
            f"invalid value {_shown(text)}: must be a whole number of seconds from 3 to 3600"
        )
    return int(text)


# --- output ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Column:
    """A column of a table: its header, and whether it holds numbers (right-aligned)."""

    header: str
    numeric: bool = False


def plain_table(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows as aligned text lines, header first (for output that is not a terminal)."""
    widths = [max([len(c.header), *(len(row[i]) for row in rows)]) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.rjust(w) if c.numeric else cell.ljust(w)
            for cell, w, c in zip(cells, widths, columns, strict=True)
        ).rstrip()

    return [line([c.header for c in columns]), *(line(row) for row in rows)]


class Output:
    """Where results go: rich tables on a terminal, plain aligned text otherwise."""

    def __init__(self, console: Console | None = None) -> None:
        # soft_wrap: piped output is never cut at 80 columns; highlight off: no colours
        # guessed from the text.
        self.console = console or Console(highlight=False, soft_wrap=True)

    @property
    def is_terminal(self) -> bool:
        """True when stdout is a terminal (rich styles and tables)."""
        return self.console.is_terminal

    def line(self, text: str = "") -> None:
        """One line, printed as is (no markup: URLs may hold brackets)."""
        self.console.out(text, highlight=False)

    def table(self, columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> None:
        """A table: boxed on a terminal, aligned columns otherwise."""
        if not self.is_terminal:
            for text in plain_table(columns, rows):
                self.line(text)
            return
        self.console.print(rich_table(columns, rows))

    def show(self, report: Report) -> None:
        """Print a report's lines and tables in order."""
        for item in report:
            if isinstance(item, str):
                self.line(item)
            else:
                self.table(*item)

    def renderable(self, report: Report) -> Group:
        """A report as one rich renderable (for ``Live``, which redraws it in place)."""
        return Group(
            *(Text(item) if isinstance(item, str) else rich_table(*item) for item in report)
        )


def rich_table(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> Table:
    """A table for a terminal."""
    # Narrow padding so a usual table fits without wrapping; on a narrow terminal
    # cells fold rather than lose characters.
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True)
    for c in columns:
        table.add_column(c.header, justify="right" if c.numeric else "left", overflow="fold")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    return table


#: What a command reports, in order: lines, and tables (columns, rows).
Report = list[str | tuple[Sequence[Column], Sequence[Sequence[str]]]]


def error_line(message: str) -> None:
    """Report an error as one line on stderr, passwords masked."""
    flat = " ".join(mask_secrets(message).split())
    print(f"{PROG}: error: {flat}", file=sys.stderr, flush=True)


# --- the context a command runs in -------------------------------------------------------


@dataclass
class Context:
    """Parsed arguments, output, and the settings and engine, made on first use."""

    args: argparse.Namespace
    out: Output
    _settings: Settings | None = None
    _engine: Engine | None = field(default=None, repr=False)

    @property
    def settings(self) -> Settings:
        """Settings: file < environment < --database-url/--redis-url."""
        if self._settings is None:
            self._settings = load_settings(
                self.args.settings,
                database_url=self.args.database_url,
                redis_url=self.args.redis_url,
            )
        return self._settings

    @property
    def database(self) -> str:
        """The database URL, masked, for messages."""
        return mask_secrets(self.settings.database_url)

    def engine(self, *, create: bool = False) -> Engine:
        """An engine on the configured database.

        ``create=False`` refuses a SQLite file that does not exist: connecting would
        create an empty one, a side effect of a command that then fails anyway.
        """
        if self._engine is None:
            url = self.settings.database_url
            if not create:
                _require_sqlite_file(url)
            self._engine = make_engine(url)
        return self._engine

    @property
    def database_or_unknown(self) -> str:
        """The masked database URL if settings were loaded (for error messages)."""
        return "?" if self._settings is None else self.database

    def close(self) -> None:
        """Release the engine's connections."""
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None


def _require_sqlite_file(url: str) -> None:
    try:
        parsed = make_url(url)
    except ArgumentError:
        return  # make_engine has accepted it; nothing more to check here
    path = parsed.database
    if parsed.get_backend_name() != "sqlite" or not path or path == ":memory:":
        return
    if parsed.query.get("uri") or path.startswith("file:"):
        return  # SQLite URI filenames: let SQLite decide
    if not Path(path).exists():
        raise CliError(f"database file {path} does not exist; create it with '{PROG} db upgrade'")


# How SQLite, MySQL/MariaDB (1146), PostgreSQL and SQLAlchemy's inspector say a table
# is missing (kept narrow: "database x does not exist" needs another fix than upgrade).
_MISSING_TABLE = re.compile(
    r"no such table|\(1146,|NoSuchTableError|relation \S+ does not exist", re.IGNORECASE
)
# ... and a missing column (a schema older than the code: 1054 on MySQL).
_MISSING_COLUMN = re.compile(r"no such column|\(1054,|unknown column", re.IGNORECASE)


def database_problem(database: str, reason: str) -> str:
    """The one-line message for a database error, with the fix when the schema is behind."""
    if _MISSING_TABLE.search(reason):
        return (
            f"database {database} has no limits tables ({reason}); "
            f"create them with '{PROG} db upgrade'"
        )
    if _MISSING_COLUMN.search(reason):
        return (
            f"database {database} has an older schema than this gateway-limiter ({reason}); "
            f"run '{PROG} db upgrade'"
        )
    return f"database {database}: {reason}"


# --- db ------------------------------------------------------------------------------------


def cmd_db_upgrade(ctx: Context) -> int:
    """Migrate the database to the newest revision; say from which to which."""
    engine = ctx.engine(create=True)
    before = current_revision(engine)
    head = head_revision(engine)
    if before == head:
        ctx.out.line(f"{ctx.database} is already at revision {head} (head); nothing to do")
        return 0
    try:
        upgrade(engine)
    except SQLAlchemyError as e:
        reason = describe_db_error(e)
        if before is None and "already exists" in reason:
            raise CliError(
                f"database {ctx.database}: {reason}; the tables exist but no revision is "
                f"recorded (made from sql/?): record the revision they match with "
                f"'{PROG} db stamp REVISION' (head if made from this release's sql/)"
            ) from None
        raise
    after = current_revision(engine)
    ctx.out.line(
        f"upgraded {ctx.database} from {before or 'an empty schema (no revision)'} "
        f"to revision {after} (head)"
    )
    return 0


def cmd_db_current(ctx: Context) -> int:
    """Print the database's revision and the newest one this package knows."""
    engine = ctx.engine()
    current = current_revision(engine)
    head = head_revision(engine)
    if current is None:
        ctx.out.line(
            f"{ctx.database}: no revision (never migrated); head is {head}: run '{PROG} db upgrade'"
        )
    elif current == head:
        ctx.out.line(f"{ctx.database}: revision {current} (head, up to date)")
    else:
        ctx.out.line(f"{ctx.database}: revision {current}, head is {head}: run '{PROG} db upgrade'")
    return 0


def cmd_db_stamp(ctx: Context) -> int:
    """Record a revision without running migrations (tables made from sql/ by hand)."""
    from alembic import command

    from gateway_limiter.config.migrate import alembic_config

    engine = ctx.engine()
    before = current_revision(engine)
    command.stamp(alembic_config(engine), ctx.args.revision)
    ctx.out.line(
        f"{ctx.database}: recorded revision {current_revision(engine)} "
        f"(was {before or 'none'}); no table was changed"
    )
    return 0


# --- conf ----------------------------------------------------------------------------------


def _not_a_number(value: object) -> bool:
    # SQLite keeps whatever it is given; conf list shows such a value as it is.
    return not isinstance(value, (int, float)) or isinstance(value, bool)


def _fmt_cache(value: float | None) -> str:
    # FLOAT(3,2) reads back from MySQL as e.g. 0.200000002980232.
    if value is None or _not_a_number(value):
        return _fmt_opt(value)
    return f"{round(value, 2):g}"


def _fmt_opt(value: object) -> str:
    return "NULL" if value is None else str(value)


def _fmt_seconds(value: float | None) -> str:
    # warmupPeriod is a FLOAT: 0.1 reads back from MySQL as 0.100000001490116.
    if value is None or _not_a_number(value):
        return _fmt_opt(value)
    return f"{value:.6g}"


def _fmt_field(name: str, value: Any) -> str:
    """A column's value as messages show it (model attribute ``name``)."""
    if name == "cache":
        return _fmt_cache(value)
    if name == "warmup_period":
        return _fmt_seconds(value)
    return _fmt_opt(value)


def _fmt_time(row: ConfRow) -> str:
    t = row.last_modify_time
    if not isinstance(t, dt.datetime):
        return "-" if t is None else repr(t)
    return t.isoformat(sep=" ", timespec="seconds")


def _per(rule: Rule) -> str:
    """A limit's rate with its period: "20/s", "200 per 60 s"."""
    return f"{rule.rate}/s" if rule.period == 1 else f"{rule.rate} per {rule.period} s"


def _algorithm_text(rule: Rule) -> str:
    """What the rule's algorithm does with the rate, in a few words."""
    if rule.algorithm == SLIDING_WINDOW:
        return f"sliding_window: never more in any {rule.period} s"
    if rule.algorithm == FIXED_WINDOW:
        return f"fixed_window: at most {rule.rate} in each aligned {rule.period} s window"
    if rule.algorithm == WARM_UP:
        return f"warm_up: a third of the rate when idle, full after {rule.warmup:g} s of use"
    return f"token_bucket: bursts of up to {rule.burst}"


def _limit_text(rule: Rule) -> str:
    caller = " for each caller" if rule.per_caller else ""
    return f"{_per(rule)}{caller} ({_algorithm_text(rule)})"


def _rule_text(rule: Rule) -> str:
    """An interface's rule in words: every limit, and the wait budget."""
    if rule.closed:
        text = "closed: every call refused"
    else:
        limits = " and ".join(_limit_text(r) for r in rule.limits)
        text = f"limited to {limits}, callers wait up to {rule.cache:g} s"
    if rule.shadow:
        return f"{text}, IN SHADOW MODE: decided and counted, never enforced"
    return text


def _rule_brief(rule: Rule, cache: float) -> str:
    """One limit in a table cell: rate, what its algorithm adds, scope, wait budget."""
    shadow = "shadow (not enforced): " if rule.shadow else ""
    if rule.closed:
        return f"{shadow}closed"
    shaped = {
        SLIDING_WINDOW: f"{_per(rule)} in any {rule.period} s",
        FIXED_WINDOW: f"{_per(rule)} in aligned windows",
        WARM_UP: f"{_per(rule)}, {rule.warmup:g} s warm-up",
    }.get(rule.algorithm, f"{_per(rule)}, burst {rule.burst}")
    caller = ", per caller" if rule.per_caller else ""
    return f"{shadow}{shaped}{caller}, wait <= {cache:g} s"


def row_effect(row: ConfRow, ruleset: RuleSet) -> str:
    """What the reload makes of one row (the same ``build_rules`` the reload uses)."""
    if any(s.config_id == row.config_id for s in ruleset.skipped):
        return "skipped (see below)"
    if row.status == 0:
        return "disabled"
    rule = ruleset.rules.get(row.interface_url or "")
    if rule is None:
        return "-"
    for limit in rule.limits:
        if limit.config_id == row.config_id:
            # a closed limit closes its interface: the other rows say so too
            return _rule_brief(rule if rule.closed else limit, rule.cache)
    return "-"


def url_effect(url: str, rows: Sequence[ConfRow], ruleset: RuleSet) -> str:
    """What the reload makes of ``url``: its rule, or why it is not limited."""
    rule = ruleset.rules.get(url)
    if rule is not None:
        ids = ", ".join(str(r.config_id) for r in rule.limits)
        return f"{url} is {_rule_text(rule)} (configId {ids})"
    mine = {r.config_id for r in rows if r.interface_url == url}
    reasons = [str(s) for s in ruleset.skipped if s.config_id in mine]
    if reasons:
        return f"{url} is not limited: the reload skips " + "; ".join(reasons)
    if mine:
        return f"{url} is not limited: {'its rows are' if len(mine) > 1 else 'its row is'} disabled"
    return f"{url} is not limited: no row"


def _switch_line(engine: Engine, settings: Settings) -> str:
    try:
        stored = read_switch(engine)
    except SQLAlchemyError:
        # As the reload does: the switch table missing means the settings default.
        return (
            f"switch: {_on_off(settings.switch)} (settings default; the switch table is "
            f"missing: run '{PROG} db upgrade')"
        )
    if stored is None:
        return f"switch: {_on_off(settings.switch)} (settings default)"
    return f"switch: {_on_off(stored)} (database row)"


def _on_off(value: bool) -> str:
    return "on" if value else "off"


CONF_COLUMNS = (
    Column("configId", numeric=True),
    Column("channelType"),
    Column("interfaceNo"),
    Column("interfaceUrl"),
    Column("rateLimit", numeric=True),
    Column("cache", numeric=True),
    Column("status", numeric=True),
    Column("shadow", numeric=True),
    Column("lastModifyTime"),
    Column("algorithm"),
    Column("maxPermits", numeric=True),
    Column("warmupPeriod", numeric=True),
    Column("periodSeconds", numeric=True),
    Column("perCaller", numeric=True),
    Column("effect"),
)


def cmd_conf_list(ctx: Context) -> int:
    """Every row, what the reload makes of it, and each skipped row with its reason."""
    engine = ctx.engine()
    rows = read_rows(engine)
    ruleset = build_rules(rows, ctx.settings.default_cache)
    ctx.out.line(_switch_line(engine, ctx.settings))
    if not rows:
        ctx.out.line(
            f"{CONF_TABLE} is empty: nothing is limited. Add a row with "
            f"'{PROG} conf set URL --rate N --enable'"
        )
        return 0
    ctx.out.table(
        CONF_COLUMNS,
        [
            [
                str(r.config_id),
                _fmt_opt(r.channel_type),
                _fmt_opt(r.interface_no),
                _fmt_opt(r.interface_url),
                _fmt_opt(r.rate_limit),
                _fmt_cache(r.cache),
                _fmt_opt(r.status),
                "-" if r.shadow is None else str(r.shadow),  # None: schema before 0005
                _fmt_time(r),
                _fmt_opt(r.algorithm),
                _fmt_opt(r.max_permits),
                _fmt_seconds(r.warmup_period),
                _fmt_opt(r.period_seconds),
                _fmt_opt(r.per_caller),
                row_effect(r, ruleset),
            ]
            for r in rows
        ],
    )
    if any(r.cache is None and r.status == 1 for r in rows):
        ctx.out.line(
            f"cache NULL: callers wait up to default_cache = {ctx.settings.default_cache:g} s"
        )
    for s in ruleset.skipped:
        ctx.out.line(f"skipped by the reload: {s}")
    return 0


def _refuse_collation_twins(engine: Engine, url: str) -> list[RateLimitConf]:
    """The rows the database matches for ``url``; an error if it matches another spelling.

    MySQL's default collations compare case- and trailing-space-insensitively, the
    limiter's lookup does not: '/IBE/x' would update the row of '/ibe/x', and neither
    URL would then be limited as the operator meant.
    """
    matches = find_rows(engine, url)
    twins = [r for r in matches if r.interface_url != url]
    if twins:
        other = twins[0]
        raise CliError(
            f"the database matches URL {url!r} to configId {other.config_id} "
            f"({other.interface_url!r}), which the limiter treats as another URL; "
            "use that row's exact URL"
        )
    return matches


def _reload_note(ctx: Context) -> str:
    return (
        "gateway processes apply it at their next reload "
        f"(reload_interval = {ctx.settings.reload_interval:g} s in these settings)"
    )


_CONF_FIELDS = (
    ("rate_limit", "rateLimit"),
    ("cache", "cache"),
    ("channel_type", "channelType"),
    ("interface_no", "interfaceNo"),
    ("status", "status"),
    ("algorithm", "algorithm"),
    ("max_permits", "maxPermits"),
    ("warmup_period", "warmupPeriod"),
    ("period_seconds", "periodSeconds"),
    ("per_caller", "perCaller"),
    ("shadow", "shadow"),
)

#: The algorithm columns: model attribute -> (column, the ``conf set`` flag that sets it).
_ALGORITHM_FIELDS = {
    "algorithm": ("algorithm", "--algorithm"),
    "max_permits": ("maxPermits", "--max-permits"),
    "warmup_period": ("warmupPeriod", "--warmup"),
}


def _given_algorithm_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The algorithm columns given on the command line (their defaults are SUPPRESS, so
    a flag left out is absent, and ``none`` is a given NULL)."""
    return {name: getattr(args, name) for name in _ALGORITHM_FIELDS if hasattr(args, name)}


def algorithm_args_problem(
    given: dict[str, Any], old: RateLimitConf | None, period: int = 1, per_caller: bool = False
) -> str:
    """Why the row would have invalid algorithm columns after ``conf set``, as an error
    naming the argument to change ("" when the row will be valid).

    The row after the change is the old row (or a new one) with only the given columns
    replaced, judged by ``rules.algorithm_problem``: the very check the reload makes.
    A value left over from the old row is never cleared silently; the message says
    which flag clears or sets it. ``period`` and ``per_caller`` pick the row, so they
    are the row's: a problem with them (warm_up is per second and shared) names the
    ``--period`` or ``--per-caller`` that picked it.
    """
    after = {
        name: given[name] if name in given else getattr(old, name, None)
        for name in _ALGORITHM_FIELDS
    }
    algorithm = after["algorithm"] or TOKEN_BUCKET
    max_permits, warmup = after["max_permits"], after["warmup_period"]
    problem = algorithm_problem(algorithm, max_permits, warmup, period, per_caller)
    if not problem:
        return ""
    if not algorithm_problem(algorithm, max_permits, warmup):
        flag = "--period" if period != 1 else "--per-caller"
        return f"argument {flag}: {problem}"
    # algorithm_problem checks algorithm, then maxPermits, then warmupPeriod: the first
    # whose removal changes the answer is the one it complains about.
    if algorithm not in ALGORITHMS:
        culprit = "algorithm"
    elif max_permits is not None and algorithm_problem(algorithm, None, warmup) != problem:
        culprit = "max_permits"
    else:
        culprit = "warmup_period"
    column, flag = _ALGORITHM_FIELDS[culprit]
    if culprit in given:
        # The flag given is wrong, or right only with another algorithm than the row's.
        wants = {"max_permits": TOKEN_BUCKET, "warmup_period": WARM_UP}.get(culprit)
        hint = ""
        if given[culprit] is not None and wants and wants != algorithm:
            hint = f"; the row's algorithm is {algorithm}: add --algorithm {wants}"
        return f"argument {flag}: {problem}{hint}"
    left = after[culprit]
    if culprit == "algorithm":  # an unknown name written by SQL
        fix = f"the row has algorithm {left!r}: add --algorithm {{{','.join(ALGORITHMS)}}}"
    elif left is None:  # warm_up without a warmupPeriod
        fix = f"add {flag} S (seconds, more than 0, at most 3600)"
    else:
        value = _fmt_field(culprit, left)
        fix = f"the row has {column} {value}: add '{flag} {NONE_WORD}' to clear it"
    blamed = "--algorithm" if "algorithm" in given else flag
    return f"argument {blamed}: {problem}; {fix}"


def warm_up_cache_warning(rate: int, cache: float, warmup: float) -> str:
    """A warning when a warm-up row's wait budget is below the price of its first cold
    permit: every call on a cold interface would be refused, so it never warms up."""
    if rate <= 0:
        return ""
    sh = shape(rate, rate, warmup * MICROS)
    first = stored_cost(sh, sh.capacity, 1.0) / MICROS
    if cache >= first:
        return ""
    need = math.ceil(first * 100) / 100
    return (
        f"warning: on a cold warm_up interface the first call waits {first * 1000:.0f} ms "
        f"(about 3 / rate), more than cache {cache:g} s: callers that wait only the row's "
        f"cache are all refused and it never warms up; give --cache {need:g} or more"
    )


def combination_problem(
    rows: Sequence[ConfRow], url: str, after: ConfRow, default_cache: float
) -> str:
    """Why the reload would skip a row of ``url`` once ``after`` is written (the row as
    changed, or a new one), when the rows now do not make it skip that ("" if not).

    Duplicates of one period and scope are not a problem (the stricter applies, as
    ever); what is left is ``warm_up`` beside other limits of its URL.
    """
    before = build_rules(rows, default_cache).skipped
    changed = [after if r.config_id == after.config_id else r for r in rows]
    if all(r.config_id != after.config_id for r in rows):
        changed.append(after)
    mine = {r.config_id for r in changed if r.interface_url == url}
    for skipped in build_rules(changed, default_cache).skipped:
        new = skipped not in before and not skipped.reason.startswith("duplicate")
        if new and skipped.config_id in mine:
            return str(skipped)
    return ""


def cmd_conf_set(ctx: Context) -> int:
    """Create or update the row of a URL for one period and scope (lowest configId); a
    new row starts disabled.

    Only the columns given change. The algorithm columns are checked together with
    what the row already holds, by the same rule the reload uses, before anything is
    written: the reload never skips a row ``conf set`` wrote for its algorithm columns.
    """
    a = ctx.args
    engine = ctx.engine()
    period, per_caller = a.period or 1, bool(a.per_caller)
    everything = _refuse_collation_twins(engine, a.url)
    scope: dict[str, int] = {"period_seconds": period, "per_caller": int(per_caller)}
    before = [r for r in everything if (r.period_seconds, r.per_caller) == (period, per_caller)]
    old = before[0] if before else None
    given = _given_algorithm_fields(a)
    problem = algorithm_args_problem(given, old, period, per_caller)
    if problem:
        raise CliError(problem, code=2)
    fields: dict[str, Any] = {"rate_limit": a.rate, **given}
    if a.cache is not None:
        fields["cache"] = a.cache
    if a.channel is not None:
        fields["channel_type"] = a.channel or None
    if a.interface_no is not None:
        fields["interface_no"] = a.interface_no or None
    if a.status is not None:
        fields["status"] = a.status
    if a.shadow is not None:
        fields["shadow"] = a.shadow
    rows = read_rows(engine)
    if old is None:
        target = ConfRow(
            config_id=max([0, *(r.config_id for r in rows)]) + 1,
            channel_type=None,
            interface_no=None,
            interface_url=a.url,
            rate_limit=None,
            cache=None,
            status=0,
            period_seconds=period,
            per_caller=int(per_caller),
        )
    else:
        target = next(r for r in rows if r.config_id == old.config_id)
    clash = combination_problem(rows, a.url, replace(target, **fields), ctx.settings.default_cache)
    if clash:
        raise CliError(f"{a.url} would not be limited as meant: the reload would skip {clash}", 2)
    row, created = upsert_conf(engine, a.url, where=scope, **fields)
    if created or old is None:  # (old is None only when created; this tells mypy)
        values = ", ".join(
            f"{column} {_fmt_field(name, getattr(row, name))}" for name, column in _CONF_FIELDS
        )
        ctx.out.line(f"created configId {row.config_id} for {a.url}: {values}")
    else:
        pairs = [
            (column, _fmt_field(name, getattr(old, name)), _fmt_field(name, getattr(row, name)))
            for name, column in _CONF_FIELDS
        ]
        changes = [f"{column} {was} -> {now}" for column, was, now in pairs if was != now]
        ctx.out.line(
            f"updated configId {row.config_id} for {a.url}: "
            + (", ".join(changes) if changes else "no change")
        )
    if len(before) > 1:
        others = ", ".join(str(r.config_id) for r in before[1:])
        ctx.out.line(
            f"note: {a.url} has other rows {scope_text(period, per_caller)} "
            f"(configId {others}); of the enabled ones, the stricter applies"
        )
    rows = read_rows(engine)
    ctx.out.line(url_effect(a.url, rows, build_rules(rows, ctx.settings.default_cache)))
    if row.algorithm == WARM_UP and row.rate_limit and row.warmup_period:
        cache = ctx.settings.default_cache if row.cache is None else round(row.cache, 2)
        warning = warm_up_cache_warning(row.rate_limit, cache, row.warmup_period)
        if warning:
            ctx.out.line(warning)
    if row.status == 0:
        # the URL's other rows stay as they are: name exactly this one
        flags = _scope_flags(row) if any(r.config_id != row.config_id for r in everything) else ""
        ctx.out.line(f"enable it with: {PROG} conf enable {a.url}{flags}")
    ctx.out.line(_reload_note(ctx))
    return 0


def _scope_flags(row: RateLimitConf) -> str:
    """The ``conf enable/disable`` flags that pick ``row``'s period and scope."""
    return f" --period {row.period_seconds} --{'per-caller' if row.per_caller else 'shared'}"


def _scope_of(args: argparse.Namespace) -> dict[str, Any]:
    """``conf enable/disable``: the rows ``--period``, ``--per-caller``/``--shared`` pick."""
    scope: dict[str, Any] = {}
    if args.period is not None:
        scope["period_seconds"] = args.period
    if args.per_caller is not None:
        scope["per_caller"] = int(args.per_caller)
    return scope


def _cmd_conf_status(ctx: Context, status: int) -> int:
    url = ctx.args.url
    engine = ctx.engine()
    _refuse_collation_twins(engine, url)
    scope = _scope_of(ctx.args)
    count = set_status(engine, url, status, **scope)
    if count == 0:
        which = f" {scope_text(ctx.args.period or 1, bool(ctx.args.per_caller))}" if scope else ""
        raise CliError(
            f"no row for URL {url}{which}; create one with '{PROG} conf set {url} --rate N'"
        )
    verb = "enabled" if status else "disabled"
    rows = read_rows(engine)
    ids = ", ".join(str(r.config_id) for r in rows if r.interface_url == url)
    ctx.out.line(f"{verb} {count} row{'s' if count > 1 else ''} for {url} (configId {ids})")
    ctx.out.line(url_effect(url, rows, build_rules(rows, ctx.settings.default_cache)))
    ctx.out.line(_reload_note(ctx))
    return 0


def cmd_conf_enable(ctx: Context) -> int:
    """Set status 1 on every row of a URL."""
    return _cmd_conf_status(ctx, 1)


def cmd_conf_disable(ctx: Context) -> int:
    """Set status 0 on every row of a URL."""
    return _cmd_conf_status(ctx, 0)


# --- switch --------------------------------------------------------------------------------


def cmd_switch(ctx: Context) -> int:
    """``switch on|off|default`` writes the switch row; ``switch status`` reads it."""
    state = ctx.args.state
    engine = ctx.engine()
    if state != "status":
        write_switch(engine, {"on": True, "off": False, "default": None}[state])
    stored = read_switch(engine)
    effective = ctx.settings.switch if stored is None else stored
    if stored is None:
        source = (
            f"settings default: switch = {str(ctx.settings.switch).lower()}; "
            "the database row is NULL"
        )
    else:
        source = "database row"
    ctx.out.line(f"switch {_on_off(effective)} ({source})")
    if state != "status":
        ctx.out.line(_reload_note(ctx))
    if not effective:
        ctx.out.line("while the switch is off nothing is limited: every call is admitted at once")
    return 0


# --- status --------------------------------------------------------------------------------

STATUS_COLUMNS = (
    Column("interfaceUrl"),
    Column("configId", numeric=True),
    Column("rate", numeric=True),
    Column("cache s", numeric=True),
    Column("capacity", numeric=True),
    Column("stored permits", numeric=True),
    Column("debt ms", numeric=True),
    Column("next free ms", numeric=True),
    Column("algorithm"),
    Column("state"),
)
#: ``status --watch``: refresh every this many seconds unless --interval says otherwise.
WATCH_INTERVAL = 1.0


def _relaxed(settings: Settings) -> Settings:
    """The settings with Redis timeouts fit for a command line, not for the hot path."""
    return settings.replace(
        redis_timeout=max(settings.redis_timeout, CLI_REDIS_TIMEOUT),
        redis_connect_timeout=max(settings.redis_connect_timeout, CLI_REDIS_TIMEOUT),
    )


def _open_limiter(ctx: Context, settings: Settings) -> GatewayLimiter:
    _require_sqlite_file(settings.database_url)
    try:
        return GatewayLimiter(settings)
    except (SettingsError, DatabaseUrlError):
        raise
    except ValueError as e:  # a redis_url the backend cannot use
        raise CliError(str(e)) from None


def cmd_status(ctx: Context) -> int:
    """The rules in force, after a reload like a gateway's, and each bucket's live state;
    with --watch, refreshed in place until Ctrl-C."""
    a = ctx.args
    if not a.watch and (a.interval is not None or a.count is not None):
        raise CliError("--interval and --count go with --watch", code=2)
    limiter = _open_limiter(ctx, _relaxed(ctx.settings))
    try:
        summary = limiter.registry.reload()
        if not summary.ok:
            raise CliError(database_problem(ctx.database, summary.error or "reload failed"))
        if a.watch:
            return _watch_status(ctx, limiter)
        report, failed = status_report(ctx, limiter)
    finally:
        limiter.close()
    ctx.out.show(report)
    if failed:
        raise CliError(failed)
    return 0


def status_report(ctx: Context, limiter: GatewayLimiter) -> tuple[Report, str]:
    """What ``status`` shows, from the limiter's current snapshot and live bucket state;
    and the first error reading bucket state ("" when none)."""
    settings, url = ctx.settings, ctx.args.url
    snapshot = limiter.registry.snapshot
    states = limiter.status(url)
    report: Report = []
    source = "database row" if snapshot.switch_source == "database" else "settings default"
    report.append(f"switch: {_on_off(snapshot.switch)} ({source})")
    if not snapshot.switch:
        report.append(
            "the switch is off: nothing is limited now; the rules below apply when it is on"
        )
    where = mask_secrets(settings.redis_url)
    if limiter.backend.shared:
        report.append(f"bucket state: {where}, key prefix {settings.key_prefix}")
    else:
        report.append(
            f"bucket state: {where}: it lives inside each gateway process, so this command "
            "sees none (every bucket shows as full)"
        )
    if url is not None and not states:
        rows = read_rows(limiter.registry.engine)
        report.append(url_effect(url, rows, build_rules(rows, settings.default_cache)))
        return report, ""
    if not states:
        report.append(f"no enabled rows: nothing is limited (see '{PROG} conf list')")
    else:
        report.append((STATUS_COLUMNS, [_status_cells(s) for s in states]))
    report.extend(f"skipped by the reload: {s}" for s in snapshot.skipped)
    failed = [s for s in states if s.error is not None]
    if failed:
        return report, f"cannot read bucket state from {where}: {failed[0].error}"
    return report, ""


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

    with suppress(KeyboardInterrupt), _sigterm_interrupts():
        if out.is_terminal:
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


def _for_each_caller(rule: Rule, state: str) -> str:
    return f"{state}, for each caller" if rule.per_caller else state


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM stops a long-running command the way Ctrl-C does (cleanly, exit 0)."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only; nothing to install
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _capacity(rule: Rule) -> float:
    """The most the bucket stores: maxPermits, or for warm_up the model's (rate x warm-up)."""
    if rule.algorithm == WARM_UP and rule.rate > 0:
        return shape(rule.rate, rule.burst, rule.warmup * MICROS).capacity
    return float(rule.burst)


def _status_cells(s: BucketStatus) -> list[str]:
    rule = s.rule
    capacity = _capacity(rule)
    rate = str(rule.rate) if rule.period == 1 else f"{rule.rate}/{rule.period}s"
    head = [rule.url, str(rule.config_id), rate, f"{rule.cache:g}", f"{capacity:g}"]
    shadow = "; shadow: counted, not enforced" if rule.shadow else ""

    def row(stored: str, debt: str, state: str) -> list[str]:
        free = "-" if s.next_free_ms is None else f"{s.next_free_ms:.1f}"
        return [*head, stored, debt, free, rule.algorithm, state + shadow]

    if rule.closed:
        return row("-", "-", "closed: every call refused")
    if rule.algorithm == SLIDING_WINDOW:
        # Its state is a list of admission times, not stored permits; not read here.
        state = f"at most {rule.rate} in any {rule.period} s (window state not shown)"
        return row("-", "-", _for_each_caller(rule, state))
    if rule.algorithm == FIXED_WINDOW:
        state = f"at most {rule.rate} in each aligned {rule.period} s (window state not shown)"
        return row("-", "-", _for_each_caller(rule, state))
    if rule.per_caller:
        return row("-", "-", "per caller: each key has its own bucket (not shown)")
    if s.error is not None:
        return row("?", "?", f"error: {s.error}")
    cold = "; cold: paced below the rate until warm" if rule.algorithm == WARM_UP else ""
    if s.stored is None:
        return row(f"{capacity:.2f}", "0.0", f"idle (full, no state stored){cold}")
    state = "in debt: callers queue" if s.debt_ms > 0 else "ok"
    if cold and s.stored > shape(rule.rate, rule.burst, rule.warmup * MICROS).threshold:
        state += cold
    return row(f"{s.stored:.2f}", f"{s.debt_ms:.1f}", state)


# --- serve-metrics -------------------------------------------------------------------------

#: ``serve-metrics`` listens here unless --port says otherwise.
METRICS_PORT = 9464


def cmd_serve_metrics(ctx: Context) -> int:
    """Serve the Prometheus metrics of a limiter that follows the table like a gateway,
    plus every bucket's live state, until Ctrl-C or SIGTERM."""
    from gateway_limiter.observe.metrics import MetricsUnavailable, Source, process_metrics, serve

    metrics = process_metrics()
    if metrics is None:
        raise CliError("prometheus-client is not installed: pip install 'gateway-limiter[metrics]'")
    a, out = ctx.args, ctx.out
    # The hot path's timeouts: a scrape must not hang on a dead Redis.
    limiter = _open_limiter(ctx, ctx.settings.replace(metrics=True))
    source = Source(
        lambda: limiter.registry.snapshot,
        lambda: not limiter.backend_healthy,
        buckets=lambda: bucket_samples(limiter),
    )
    try:
        summary = limiter.start()
        if not summary.ok:
            error_line(
                database_problem(ctx.database, summary.error or "reload failed")
                + "; serving anyway (reloads are retried and counted)"
            )
        try:
            server = serve(a.port, a.host)
        except (OSError, MetricsUnavailable) as e:
            raise CliError(f"cannot serve metrics on {a.host}:{a.port}: {e}") from None
        metrics.attach(source)
        try:
            out.line(f"serving metrics on http://{a.host}:{server.port}/metrics; Ctrl-C to stop")
            if not limiter.backend.shared:
                out.line(
                    f"note: redis_url {mask_secrets(ctx.settings.redis_url)} keeps bucket "
                    "state inside each gateway process; the bucket gauges here show none"
                )
            sys.stdout.flush()
            with suppress(KeyboardInterrupt), _sigterm_interrupts():
                while True:
                    time.sleep(3600)
        finally:
            metrics.detach(source)
            server.close()
    finally:
        limiter.close()
    return 0


def bucket_samples(limiter: GatewayLimiter) -> list[BucketSample]:
    """Every token/warm-up bucket's live state; stops at the first Redis error (one
    timeout per scrape at most, however many rules)."""
    from gateway_limiter.observe.metrics import BucketSample

    samples = []
    seen: set[str] = set()
    for rule in chosen_limits(limiter.registry, None):
        # One sample per interface (its first shared bucket): the label is the URL.
        if rule.closed or not has_shared_bucket(rule) or rule.url in seen:
            continue
        seen.add(rule.url)
        status = describe_state(rule, limiter.backend)
        if status.error is not None:
            break
        stored = _capacity(rule) if status.stored is None else status.stored
        free = None if status.next_free_ms is None else status.next_free_ms / 1000.0
        samples.append(BucketSample(rule.url, stored, status.debt_ms / 1000.0, free))
    return samples


# --- demo ----------------------------------------------------------------------------------


def cmd_demo(ctx: Context) -> int:
    """Run the self-contained demo (temporary SQLite + memory://, or --redis-url)."""
    from gateway_limiter.cli.demo import run_demo

    return run_demo(
        ctx.args.seconds,
        console=ctx.out.console,
        # Only an explicit --redis-url: the demo never reads settings files or env.
        redis_url=ctx.args.redis_url or "memory://",
    )


# --- the parser ----------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors; the usage text is a ``--help`` away."""

    def error(self, message: str) -> NoReturn:
        """Print one line and exit 2 (the message quotes arguments: passwords masked,
        newlines in them flattened)."""
        flat = " ".join(mask_secrets(message).split())
        self.exit(2, f"{self.prog}: error: {flat} (see '{self.prog} --help')\n")


def _global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    # Accepted before or after the command; only the top level shows them in --help.
    def shown(text: str) -> str:
        return text if top else argparse.SUPPRESS

    default = None if top else argparse.SUPPRESS
    parser.add_argument(
        "--settings",
        metavar="FILE",
        default=default,
        help=shown("settings file (default: $GATEWAY_LIMITER_SETTINGS, else ./settings.toml)"),
    )
    parser.add_argument(
        "--database-url",
        metavar="URL",
        default=default,
        help=shown("SQLAlchemy URL of the limits table (overrides the settings)"),
    )
    parser.add_argument(
        "--redis-url",
        metavar="URL",
        default=default,
        help=shown("where bucket state lives (overrides the settings)"),
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help=shown("also show the library's log messages"),
    )


Command = Callable[[Context], int]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``gateway-limiter``."""
    parser = _Parser(
        prog=PROG,
        description="Manage gateway-limiter: the limits table, the global switch, live state.",
        epilog=f"Start with '{PROG} demo' (no servers needed).",
    )
    _global_options(parser, top=True)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def leaf(
        group: Any, name: str, run: Command, help_text: str, **kw: Any
    ) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = group.add_parser(
            name, help=help_text, description=help_text, **kw
        )
        _global_options(sub, top=False)
        sub.set_defaults(run=run)
        return sub

    db = commands.add_parser("db", help="database schema (Alembic)").add_subparsers(
        dest="action", metavar="ACTION", required=True
    )
    leaf(db, "upgrade", cmd_db_upgrade, "migrate the database to the newest revision")
    leaf(db, "current", cmd_db_current, "show the database's revision and the newest one")
    stamp = leaf(
        db, "stamp", cmd_db_stamp, "record a revision without migrating (tables made from sql/)"
    )
    stamp.add_argument("revision", metavar="REVISION", help="e.g. head")

    conf = commands.add_parser("conf", help=f"rows of {CONF_TABLE}").add_subparsers(
        dest="action", metavar="ACTION", required=True
    )
    leaf(conf, "list", cmd_conf_list, "every row, its effect, and rows the reload skips")
    setp = leaf(
        conf,
        "set",
        cmd_conf_set,
        "create or update the row of URL (a new row is disabled unless --enable)",
        epilog="Only the columns given change. The algorithm columns are checked together "
        "with what the row already holds, as the reload checks them, before anything is "
        "written; nothing is cleared silently. maxPermits is for token_bucket only and "
        "warmupPeriod for warm_up only, so switching a row's algorithm away from them "
        f"needs '--max-permits {NONE_WORD}' or '--warmup {NONE_WORD}' too (the error says "
        f"which), e.g. '{PROG} conf set URL --rate 50 --algorithm sliding_window "
        f"--max-permits {NONE_WORD}'.",
    )
    setp.add_argument("url", metavar="URL", type=url_arg, help="interfaceUrl (1-128 characters)")
    setp.add_argument(
        "--rate", required=True, type=rate_arg, metavar="N", help="permits per second (0: closed)"
    )
    setp.add_argument(
        "--period",
        type=period_arg,
        metavar="S",
        help=f"the row for a rate per S seconds (periodSeconds, 1 to {MAX_PERIOD}; default 1): "
        "a URL may have a row for each period, and every enabled one applies",
    )
    setp.add_argument(
        "--per-caller",
        dest="per_caller",
        action="store_true",
        help="the row whose limits apply to each caller key apart (perCaller 1); without "
        "it, the row for all callers together",
    )
    setp.add_argument(
        "--cache", type=cache_arg, metavar="S", help="seconds a caller may wait (0-9.99)"
    )
    setp.add_argument("--channel", type=label_arg, metavar="C", help="channelType ('' clears it)")
    setp.add_argument(
        "--interface-no", type=label_arg, metavar="N", help="interfaceNo ('' clears it)"
    )
    # SUPPRESS: a flag left out leaves its column as it is; 'none' clears it to NULL.
    setp.add_argument(
        "--algorithm",
        choices=ALGORITHMS,
        default=argparse.SUPPRESS,
        help="token_bucket (the default for a new row): bursts of up to --max-permits; "
        "sliding_window: never more than N in any 1 s; warm_up: a third of the rate "
        "after idling, the full rate after --warmup seconds of use",
    )
    setp.add_argument(
        "--max-permits",
        dest="max_permits",
        type=max_permits_arg,
        default=argparse.SUPPRESS,
        metavar="N",
        help=f"token_bucket capacity (maxPermits, >= 1); '{NONE_WORD}': NULL, one "
        "second's worth (the rate)",
    )
    setp.add_argument(
        "--warmup",
        dest="warmup_period",
        type=warmup_arg,
        default=argparse.SUPPRESS,
        metavar="S",
        help=f"warm_up: seconds from cold to the full rate (warmupPeriod, 0 < S <= 3600); "
        f"'{NONE_WORD}': NULL",
    )
    onoff = setp.add_mutually_exclusive_group()
    onoff.add_argument("--enable", dest="status", action="store_const", const=1, help="status 1")
    onoff.add_argument("--disable", dest="status", action="store_const", const=0, help="status 0")
    shadow = setp.add_mutually_exclusive_group()
    shadow.add_argument(
        "--shadow",
        dest="shadow",
        action="store_const",
        const=1,
        help="shadow 1: decide and count as usual, but never refuse or delay a call "
        "(try a new limit on live traffic; the refusals it would make are counted and logged)",
    )
    shadow.add_argument(
        "--no-shadow", dest="shadow", action="store_const", const=0, help="shadow 0: enforce"
    )
    for name, run, text in (
        ("enable", cmd_conf_enable, "set status 1 on the rows of URL"),
        ("disable", cmd_conf_disable, "set status 0 on the rows of URL"),
    ):
        flip = leaf(conf, name, run, text)
        flip.add_argument("url", metavar="URL", type=url_arg)
        flip.add_argument(
            "--period", type=period_arg, metavar="S", help="only the rows for S seconds"
        )
        scope = flip.add_mutually_exclusive_group()
        scope.add_argument(
            "--per-caller",
            dest="per_caller",
            action="store_const",
            const=True,
            help="only the per-caller rows",
        )
        scope.add_argument(
            "--shared",
            dest="per_caller",
            action="store_const",
            const=False,
            help="only the rows for all callers together",
        )

    switch = leaf(
        commands,
        "switch",
        cmd_switch,
        "the global switch: on, off, default (follow the settings), or status",
    )
    switch.add_argument(
        "state",
        choices=("on", "off", "default", "status"),
        metavar="STATE",
        help="on | off | default | status",
    )

    status = leaf(commands, "status", cmd_status, "rules in force and live bucket state")
    status.add_argument("url", metavar="URL", nargs="?", help="only this interface")
    status.add_argument(
        "--watch",
        action="store_true",
        help="refresh every --interval seconds (in place on a terminal) until Ctrl-C",
    )
    status.add_argument(
        "--interval",
        type=interval_arg,
        metavar="S",
        help=f"seconds between refreshes with --watch (default {WATCH_INTERVAL:g})",
    )
    # Stop --watch after N reports (tests, scripts); hidden from --help.
    status.add_argument("--count", type=count_arg, metavar="N", help=argparse.SUPPRESS)

    serve = leaf(
        commands,
        "serve-metrics",
        cmd_serve_metrics,
        "serve Prometheus metrics (rules, switch, reloads, live buckets) over HTTP",
        epilog="Needs prometheus-client: pip install 'gateway-limiter[metrics]'. Reloads the "
        "table like a gateway and reads every bucket in Redis at each scrape. A gateway "
        "process exposes its own decisions on prometheus_client's default registry, or "
        "with gateway_limiter.metrics.serve(port).",
    )
    serve.add_argument(
        "--port",
        type=port_arg,
        default=METRICS_PORT,
        metavar="N",
        help=f"TCP port (default {METRICS_PORT}; 0: any free port, printed at start)",
    )
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        metavar="ADDR",
        help="address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)",
    )

    demo = leaf(
        commands,
        "demo",
        cmd_demo,
        "live demo on a temporary SQLite file and memory:// (no servers needed)",
    )
    demo.add_argument(
        "--seconds", type=seconds_arg, default=12, metavar="N", help="how long (default 12)"
    )
    return parser


@contextmanager
def _library_logging(verbose: bool) -> Iterator[None]:
    """Quiet the library's logs (the CLI reports what matters), or show them with -v."""
    saved = [(logging.getLogger(n), logging.getLogger(n).level) for n in QUIET_LOGGERS]
    handler: logging.Handler | None = None
    lib = logging.getLogger(QUIET_LOGGERS[0])
    if verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"{PROG}: %(levelname)s: %(message)s"))
        lib.addHandler(handler)
        lib.setLevel(logging.INFO)
    else:
        for logger, _ in saved:
            logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        if handler is not None:
            lib.removeHandler(handler)
        for logger, level in saved:
            logger.setLevel(level)


def main(argv: list[str] | None = None) -> int:
    """Run ``gateway-limiter`` with ``argv`` (default: sys.argv[1:]); return the exit code."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help (0) or bad usage (2): argparse has printed it
        return e.code if isinstance(e.code, int) else 2
    ctx = Context(args=args, out=Output())
    run: Command = args.run
    try:
        with _library_logging(args.verbose):
            return run(ctx)
    except CliError as e:
        error_line(str(e))
        return e.code
    except (SettingsError, DatabaseUrlError) as e:
        error_line(str(e))
        return 1
    except BackendError as e:  # demo --redis-url with a Redis that does not answer
        error_line(f"redis {mask_secrets(ctx.args.redis_url or '')}: {e}")
        return 1
    except SQLAlchemyError as e:
        error_line(database_problem(ctx.database_or_unknown, describe_db_error(e)))
        return 1
    except CommandError as e:  # Alembic: e.g. a revision it does not know
        error_line(f"database {ctx.database}: {e}")
        return 1
    except KeyboardInterrupt:
        error_line("interrupted")
        return 130
    except BrokenPipeError:
        # `gateway-limiter conf list | head`: the reader left. Point stdout at devnull so
        # the interpreter's final flush does not complain a second time.
        with suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    finally:
        ctx.close()
