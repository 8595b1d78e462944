"""Argument values, checked before anything is written, and what every command accepts.

Each checker raises ``argparse.ArgumentTypeError`` naming the bad value, so argparse
reports it as one line with exit status 2. The limits they check against live in
``config.rules``; it is imported inside the checkers, when a command's arguments are
parsed, so that ``gateway-limiter --help`` loads no database code.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway_limiter.cli.context import Context

#: INT(11) is a signed 32-bit column.
MAX_RATE = 2**31 - 1
#: channelType and interfaceNo are VARCHAR(24).
MAX_LABEL_LENGTH = 24
#: The longest ``--lease-ms``: ``config.rules.MAX_LEASE_MS`` (not imported: the parser
#: loads no SQLAlchemy).
MAX_LEASE_MS = 60_000
#: How ``--max-permits`` and ``--warmup`` say "clear the column to NULL".
NONE_WORD = "none"

#: What runs a command: the parsed context in, the exit status out.
Command = Callable[["Context"], int]


def _shown(text: str) -> str:
    """A value as an error message quotes it (long values shortened)."""
    return repr(text) if len(text) <= 40 else f"{text[:37]!r}... ({len(text)} characters)"


def rate_arg(text: str) -> int:
    """``--rate``: a whole number of permits per period, 0 (closed) up to INT(11)."""
    if not re.fullmatch(r"[0-9]+", text.strip()) or int(text) > MAX_RATE:
        raise argparse.ArgumentTypeError(
            f"invalid value {_shown(text)}: must be a whole number from 0 to {MAX_RATE}"
        )
    return int(text)


def cache_arg(text: str) -> float:
    """``--cache``: seconds a caller may wait, 0 to 9.99 with at most 2 decimals."""
    from gateway_limiter.config.rules import MAX_CACHE

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
    """``URL``: the interfaceUrl, 1 to 128 characters, no control characters, no
    surrounding spaces."""
    from gateway_limiter.config.rules import MAX_URL_LENGTH, control_character

    if not 1 <= len(text) <= MAX_URL_LENGTH:
        raise argparse.ArgumentTypeError(
            f"invalid value {_shown(text)}: must be 1 to {MAX_URL_LENGTH} characters"
        )
    bad = control_character(text)
    if bad is not None:
        # Name the character, since it may not show.
        raise argparse.ArgumentTypeError(
            f"invalid value {_shown(text)}: contains the control character {bad[1]!r} "
            f"(character {bad[0]})"
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


def caller_arg(text: str) -> str:
    """``--caller``: the callerKey a per-caller row names (1 to 64 characters, no control
    characters), checked as the reload checks the column."""
    from gateway_limiter.config.rules import caller_key_problem

    problem = caller_key_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"invalid value {_shown(text)}: {problem}")
    return text


def time_zone_arg(text: str) -> str | None:
    """``--time-zone``: an IANA zone (timeZone), checked as the reload checks it;
    ``none`` clears it to NULL (the ``default_time_zone`` setting)."""
    from gateway_limiter.model.calendar import RenewalError, load_zone

    if text.strip().lower() == NONE_WORD:
        return None
    try:
        load_zone(text)
    except RenewalError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def priority_arg(text: str) -> str | None:
    """``--priority``: the class of the interface's calls (priority), checked as the
    reload checks it; ``none`` clears it to NULL (``default``)."""
    from gateway_limiter.model.priority import PriorityError, parse_priority

    if text.strip().lower() == NONE_WORD:
        return None
    try:
        return parse_priority(text).value
    except PriorityError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def reserve_arg(text: str) -> str | None:
    """``--reserve``: each class's share of the limit to leave for the classes above it
    (reserve), checked as the reload checks it; ``none`` clears it to NULL."""
    from gateway_limiter.model.priority import PriorityError, parse_reserve

    if text.strip().lower() == NONE_WORD:
        return None
    try:
        parse_reserve(text)
    except PriorityError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text.strip() or None


def renews_arg(text: str) -> str | None:
    """``--renews``: quotaRenews as text (its form depends on the period, which
    ``conf set`` checks once it knows it); ``none`` clears it to NULL."""
    return None if text.strip().lower() == NONE_WORD else text.strip()


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


def lease_ms_arg(text: str) -> int | None:
    """``--lease-ms``: the ms of the rate one process takes per round trip (leaseMs, 1 to
    MAX_LEASE_MS); ``0`` or ``none`` clear it to NULL (no lease)."""
    if text.strip().lower() == NONE_WORD:
        return None
    if not re.fullmatch(r"[0-9]+", text.strip()) or int(text) > MAX_LEASE_MS:
        raise argparse.ArgumentTypeError(
            f"invalid value {_shown(text)}: must be a whole number of milliseconds "
            f"(1 to {MAX_LEASE_MS}), or 0 or '{NONE_WORD}' for no lease"
        )
    return int(text) or None


def max_concurrent_arg(text: str) -> int | None:
    """``--max-concurrent``: calls in flight at once, fleet-wide (INT(11)); ``0`` or
    ``none`` clear it to NULL (no concurrency limit)."""
    if text.strip().lower() == NONE_WORD:
        return None
    if not re.fullmatch(r"[0-9]+", text.strip()) or int(text) > MAX_RATE:
        raise argparse.ArgumentTypeError(
            f"invalid value {_shown(text)}: must be a whole number of calls in flight "
            f"(1 to {MAX_RATE}), or 0 or '{NONE_WORD}' for no limit"
        )
    return int(text) or None


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
    from gateway_limiter.config.edits import single_float_problem

    problem = single_float_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(f"invalid value {_shown(text)}: {problem}")
    return value


def period_arg(text: str) -> int:
    """``--period``: the seconds a rate is for, a whole number from 1 to a day."""
    from gateway_limiter.config.rules import MAX_PERIOD

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


# --- what every command accepts ----------------------------------------------------------


def global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """--settings, --database-url, --redis-url, -v: accepted before or after the command;
    only the top level shows them in --help."""

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
        "--actor",
        metavar="NAME",
        default=default,
        help=shown("who the audit table names for a change (default: user@host)"),
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help=shown("also show the library's log messages"),
    )


def command(parser: argparse.ArgumentParser, run: Command) -> argparse.ArgumentParser:
    """Make ``parser`` run ``run``, with the global options after the command too."""
    global_options(parser, top=False)
    parser.set_defaults(run=run)
    return parser


def leaf(group: Any, name: str, run: Command, help_text: str, **kw: Any) -> argparse.ArgumentParser:
    """A command of a group (``db upgrade``, ``conf set``): its parser, running ``run``."""
    sub: argparse.ArgumentParser = group.add_parser(
        name, help=help_text, description=help_text, **kw
    )
    return command(sub, run)
