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
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from alembic.util import CommandError
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text
from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from .backends import BackendError
from .bucket import MICROS, shape, stored_cost
from .limiter import BucketStatus, GatewayLimiter
from .migrate import current_revision, head_revision, upgrade
from .registry import describe_db_error
from .rules import (
    ALGORITHMS,
    MAX_CACHE,
    MAX_URL_LENGTH,
    SLIDING_WINDOW,
    TOKEN_BUCKET,
    WARM_UP,
    Rule,
    RuleSet,
    algorithm_problem,
    build_rules,
)
from .settings import Settings, SettingsError, load_settings, mask_secrets
from .table import (
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
        # Narrow padding so a usual table fits without wrapping; on a narrow terminal
        # cells fold rather than lose characters.
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True)
        for c in columns:
            table.add_column(c.header, justify="right" if c.numeric else "left", overflow="fold")
        for row in rows:
            table.add_row(*(Text(cell) for cell in row))
        self.console.print(table)


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

    from .migrate import alembic_config

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


def _algorithm_text(rule: Rule) -> str:
    """What the rule's algorithm does with the rate, in a few words."""
    if rule.algorithm == SLIDING_WINDOW:
        return "sliding_window: never more in any 1 s"
    if rule.algorithm == WARM_UP:
        return f"warm_up: a third of the rate when idle, full after {rule.warmup:g} s of use"
    return f"token_bucket: bursts of up to {rule.burst}"


def _rule_text(rule: Rule) -> str:
    if rule.closed:
        return "closed: every call refused"
    return (
        f"limited to {rule.rate}/s ({_algorithm_text(rule)}), callers wait up to {rule.cache:g} s"
    )


def _rule_brief(rule: Rule) -> str:
    """A rule in a table cell: rate, what its algorithm adds, wait budget."""
    if rule.closed:
        return "closed"
    shaped = {
        SLIDING_WINDOW: f"{rule.rate}/s in any 1 s",
        WARM_UP: f"{rule.rate}/s, {rule.warmup:g} s warm-up",
    }.get(rule.algorithm, f"{rule.rate}/s, burst {rule.burst}")
    return f"{shaped}, wait <= {rule.cache:g} s"


def row_effect(row: ConfRow, ruleset: RuleSet) -> str:
    """What the reload makes of one row (the same ``build_rules`` the reload uses)."""
    if any(s.config_id == row.config_id for s in ruleset.skipped):
        return "skipped (see below)"
    if row.status == 0:
        return "disabled"
    rule = ruleset.rules.get(row.interface_url or "")
    if rule is not None and rule.config_id == row.config_id:
        return _rule_brief(rule)
    return "-"


def url_effect(url: str, rows: Sequence[ConfRow], ruleset: RuleSet) -> str:
    """What the reload makes of ``url``: its rule, or why it is not limited."""
    rule = ruleset.rules.get(url)
    if rule is not None:
        return f"{url} is {_rule_text(rule)} (configId {rule.config_id})"
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
    Column("lastModifyTime"),
    Column("algorithm"),
    Column("maxPermits", numeric=True),
    Column("warmupPeriod", numeric=True),
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
                _fmt_time(r),
                _fmt_opt(r.algorithm),
                _fmt_opt(r.max_permits),
                _fmt_seconds(r.warmup_period),
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


def algorithm_args_problem(given: dict[str, Any], old: RateLimitConf | None) -> str:
    """Why the row would have invalid algorithm columns after ``conf set``, as an error
    naming the argument to change ("" when the row will be valid).

    The row after the change is the old row (or a new one) with only the given columns
    replaced, judged by ``rules.algorithm_problem``: the very check the reload makes.
    A value left over from the old row is never cleared silently; the message says
    which flag clears or sets it.
    """
    after = {
        name: given[name] if name in given else getattr(old, name, None)
        for name in _ALGORITHM_FIELDS
    }
    algorithm = after["algorithm"] or TOKEN_BUCKET
    max_permits, warmup = after["max_permits"], after["warmup_period"]
    problem = algorithm_problem(algorithm, max_permits, warmup)
    if not problem:
        return ""
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


def cmd_conf_set(ctx: Context) -> int:
    """Create or update the row of a URL (lowest configId); a new row starts disabled.

    Only the columns given change. The algorithm columns are checked together with
    what the row already holds, by the same rule the reload uses, before anything is
    written: the reload never skips a row ``conf set`` wrote for its algorithm columns.
    """
    a = ctx.args
    engine = ctx.engine()
    before = _refuse_collation_twins(engine, a.url)
    old = before[0] if before else None
    given = _given_algorithm_fields(a)
    problem = algorithm_args_problem(given, old)
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
    row, created = upsert_conf(engine, a.url, **fields)
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
            f"note: {a.url} has other rows (configId {others}); "
            "of the enabled ones, the stricter applies"
        )
    rows = read_rows(engine)
    ctx.out.line(url_effect(a.url, rows, build_rules(rows, ctx.settings.default_cache)))
    if row.algorithm == WARM_UP and row.rate_limit and row.warmup_period:
        cache = ctx.settings.default_cache if row.cache is None else round(row.cache, 2)
        warning = warm_up_cache_warning(row.rate_limit, cache, row.warmup_period)
        if warning:
            ctx.out.line(warning)
    if row.status == 0:
        ctx.out.line(f"enable it with: {PROG} conf enable {a.url}")
    ctx.out.line(_reload_note(ctx))
    return 0


def _cmd_conf_status(ctx: Context, status: int) -> int:
    url = ctx.args.url
    engine = ctx.engine()
    _refuse_collation_twins(engine, url)
    count = set_status(engine, url, status)
    if count == 0:
        raise CliError(f"no row for URL {url}; create one with '{PROG} conf set {url} --rate N'")
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
    Column("rate/s", numeric=True),
    Column("cache s", numeric=True),
    Column("capacity", numeric=True),
    Column("stored permits", numeric=True),
    Column("debt ms", numeric=True),
    Column("algorithm"),
    Column("state"),
)


def cmd_status(ctx: Context) -> int:
    """The rules in force, after a reload like a gateway's, and each bucket's live state."""
    settings = ctx.settings
    relaxed = settings.replace(
        redis_timeout=max(settings.redis_timeout, CLI_REDIS_TIMEOUT),
        redis_connect_timeout=max(settings.redis_connect_timeout, CLI_REDIS_TIMEOUT),
    )
    _require_sqlite_file(settings.database_url)
    try:
        limiter = GatewayLimiter(relaxed)
    except (SettingsError, DatabaseUrlError):
        raise
    except ValueError as e:  # a redis_url the backend cannot use
        raise CliError(str(e)) from None
    url = ctx.args.url
    try:
        summary = limiter.registry.reload()
        if not summary.ok:
            raise CliError(database_problem(ctx.database, summary.error or "reload failed"))
        snapshot = limiter.registry.snapshot
        states = limiter.status(url)
        rows = read_rows(limiter.registry.engine) if url is not None and not states else []
    finally:
        limiter.close()

    out = ctx.out
    source = "database row" if snapshot.switch_source == "database" else "settings default"
    out.line(f"switch: {_on_off(snapshot.switch)} ({source})")
    if not snapshot.switch:
        out.line("the switch is off: nothing is limited now; the rules below apply when it is on")
    where = mask_secrets(settings.redis_url)
    if limiter.backend.shared:
        out.line(f"bucket state: {where}, key prefix {settings.key_prefix}")
    else:
        out.line(
            f"bucket state: {where}: it lives inside each gateway process, so this command "
            "sees none (every bucket shows as full)"
        )
    if url is not None and not states:
        out.line(url_effect(url, rows, build_rules(rows, settings.default_cache)))
        return 0
    if not states:
        out.line(f"no enabled rows: nothing is limited (see '{PROG} conf list')")
    else:
        out.table(STATUS_COLUMNS, [_status_cells(s) for s in states])
    for s in snapshot.skipped:
        out.line(f"skipped by the reload: {s}")
    failed = [s for s in states if s.error is not None]
    if failed:
        raise CliError(f"cannot read bucket state from {where}: {failed[0].error}")
    return 0


def _capacity(rule: Rule) -> float:
    """The most the bucket stores: maxPermits, or for warm_up the model's (rate x warm-up)."""
    if rule.algorithm == WARM_UP and rule.rate > 0:
        return shape(rule.rate, rule.burst, rule.warmup * MICROS).capacity
    return float(rule.burst)


def _status_cells(s: BucketStatus) -> list[str]:
    rule = s.rule
    capacity = _capacity(rule)
    head = [rule.url, str(rule.config_id), str(rule.rate), f"{rule.cache:g}", f"{capacity:g}"]

    def row(stored: str, debt: str, state: str) -> list[str]:
        return [*head, stored, debt, rule.algorithm, state]

    if rule.closed:
        return row("-", "-", "closed: every call refused")
    if rule.algorithm == SLIDING_WINDOW:
        # Its state is a list of admission times, not stored permits; not read here.
        return row("-", "-", f"at most {rule.rate} in any 1 s (window state not shown)")
    if s.error is not None:
        return row("?", "?", f"error: {s.error}")
    cold = "; cold: paced below the rate until warm" if rule.algorithm == WARM_UP else ""
    if s.stored is None:
        return row(f"{capacity:.2f}", "0.0", f"idle (full, no state stored){cold}")
    state = "in debt: callers queue" if s.debt_ms > 0 else "ok"
    if cold and s.stored > shape(rule.rate, rule.burst, rule.warmup * MICROS).threshold:
        state += cold
    return row(f"{s.stored:.2f}", f"{s.debt_ms:.1f}", state)


# --- demo ----------------------------------------------------------------------------------


def cmd_demo(ctx: Context) -> int:
    """Run the self-contained demo (temporary SQLite + memory://, or --redis-url)."""
    from .demo import run_demo

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
    for name, run, text in (
        ("enable", cmd_conf_enable, "set status 1 on the rows of URL"),
        ("disable", cmd_conf_disable, "set status 0 on the rows of URL"),
    ):
        leaf(conf, name, run, text).add_argument("url", metavar="URL", type=url_arg)

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
