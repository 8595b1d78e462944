"""A change to a row of the limits table, checked before anything is written: the checks
``conf set`` and the console share.

Three kinds of check, each naming the column at fault:

- the form of each value (``check_values``): types and ranges the columns hold;
- the row after the change as the reload judges it (``rules.rule_from_row``), so the
  reload never skips a row written here for its own values; where the algorithm
  columns disagree, ``algorithm_culprit`` says which one the message is about;
- the row beside the other rows of its URL (``combination_problem``): warm_up with
  other limits of the same URL, which the reload skips.

A change the reload applies but not wholly (a ``leaseMs`` it ignores) is written; what
the reload will warn about the rows written is said at once (``written_warnings``).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Final

from gateway_limiter.config.audit import ChangedBy, record_change, record_unrecorded, row_record
from gateway_limiter.config.rules import (
    ALGORITHMS,
    CHANNEL_URL,
    MAX_CACHE,
    MAX_LEASE_MS,
    MAX_PERIOD,
    MAX_URL_LENGTH,
    RowWarning,
    Skipped,
    algorithm_problem,
    build_rules,
    control_character,
    rule_from_row,
)
from gateway_limiter.config.table import ConfRow, LockedTable
from gateway_limiter.model.calendar import MAX_RENEWS, QUOTA_PERIODS, RenewalError, load_zone
from gateway_limiter.model.priority import PriorityError, parse_priority, parse_reserve

#: INT(11) is a signed 32-bit column.
MAX_INT11: Final = 2**31 - 1
#: channelType and interfaceNo are VARCHAR(24); callerKey VARCHAR(64).
MAX_LABEL_LENGTH: Final = 24
MAX_CALLER_KEY_LENGTH: Final = 64

#: The columns a change may set: column name -> model attribute (configId and
#: lastModifyTime are the database's).
EDITABLE: Final = {
    "interfaceUrl": "interface_url",
    "channelType": "channel_type",
    "interfaceNo": "interface_no",
    "rateLimit": "rate_limit",
    "cache": "cache",
    "status": "status",
    "shadow": "shadow",
    "algorithm": "algorithm",
    "maxPermits": "max_permits",
    "warmupPeriod": "warmup_period",
    "periodSeconds": "period_seconds",
    "perCaller": "per_caller",
    "maxConcurrent": "max_concurrent",
    "callerKey": "caller_key",
    "leaseMs": "lease_ms",
    "quotaPeriod": "quota_period",
    "timeZone": "time_zone",
    "quotaRenews": "quota_renews",
    "quotaPacing": "quota_pacing",
    "priority": "priority",
    "reserve": "reserve",
}
#: Model attribute -> column name.
COLUMN_OF: Final = {attr: col for col, attr in EDITABLE.items()}


class FieldError(ValueError):
    """A value that cannot be written; ``field`` is the column it is for."""

    def __init__(self, field: str, message: str) -> None:
        # "timeZone 'X' is not ...": the message names its column already
        named = message.startswith(f"{field} ")
        super().__init__(message if named else f"{field}: {message}")
        self.field = field


def _shown(value: object) -> str:
    text = repr(value)
    if len(text) <= 40:
        return text
    size = len(value) if isinstance(value, str) else len(text)  # the value's, not its repr's
    return f"{text[:37]}... ({size} characters)"


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check(column: str, value: Any) -> Any:
    """``value`` for ``column`` as it will be stored; FieldError naming both if bad."""

    def bad(why: str) -> FieldError:
        return FieldError(column, f"invalid value {_shown(value)}: {why}")

    if column == "interfaceUrl":
        if not isinstance(value, str) or not 1 <= len(value) <= MAX_URL_LENGTH:
            raise bad(f"must be 1 to {MAX_URL_LENGTH} characters")
        found = control_character(value)
        if found is not None:
            raise bad(f"contains the control character {found[1]!r} (character {found[0]})")
        if value != value.strip():
            raise bad("must not start or end with whitespace")
        return value
    if column in ("channelType", "interfaceNo", "callerKey"):
        longest = MAX_CALLER_KEY_LENGTH if column == "callerKey" else MAX_LABEL_LENGTH
        if value is None or value == "":
            return None
        if not isinstance(value, str) or len(value) > longest:
            raise bad(f"must be text of at most {longest} characters, or null")
        return value
    if column == "rateLimit":
        if not _whole(value) or not 0 <= value <= MAX_INT11:
            raise bad(f"must be a whole number from 0 to {MAX_INT11}")
        return value
    if column == "cache":
        if value is None:
            return None
        if not _number(value) or not (math.isfinite(value) and 0 <= value <= MAX_CACHE):
            raise bad(f"must be a number of seconds from 0 to {MAX_CACHE}, or null")
        if round(value, 2) != value:  # FLOAT(3,2) would round it silently
            raise bad("at most 2 decimals (the column is FLOAT(3,2))")
        return float(value)
    if column == "quotaPeriod":
        if value is None:
            return None
        if value not in QUOTA_PERIODS:
            raise bad(f"must be one of {', '.join(QUOTA_PERIODS)}, or null")
        return value
    if column == "timeZone":
        if value is None or value == "":
            return None
        try:
            load_zone(value)
        except RenewalError:
            raise bad("must be an IANA time zone such as Asia/Shanghai, or null") from None
        return value
    if column == "quotaRenews":
        if value is None or value == "":
            return None
        if not isinstance(value, str) or len(value) > MAX_RENEWS:
            raise bad(f"must be text of at most {MAX_RENEWS} characters, or null")
        return value.strip()  # its form for the row's period: row_problem says
    if column == "priority":
        if value is None or value == "":
            return None
        try:
            return parse_priority(value).value
        except PriorityError as e:
            raise bad(str(e)) from None
    if column == "reserve":
        if value is None or value == "":
            return None
        try:
            parse_reserve(value)
        except PriorityError as e:
            raise bad(str(e)) from None
        return value.strip() or None
    if column in ("status", "shadow", "perCaller", "quotaPacing"):
        if value not in (0, 1) or not isinstance(value, (int, bool)):
            raise bad("must be 0 or 1")
        return int(value)
    if column == "algorithm":
        if value not in ALGORITHMS:
            raise bad(f"must be one of {', '.join(ALGORITHMS)}")
        return value
    if column in ("maxPermits", "maxConcurrent"):
        if value is None:
            return None
        if column == "maxConcurrent" and value == 0 and _whole(value):
            return None  # 0 clears the cap, as `conf set --max-concurrent 0` does
        if not _whole(value) or not 1 <= value <= MAX_INT11:
            raise bad(f"must be a whole number from 1 to {MAX_INT11}, or null")
        return value
    if column == "leaseMs":
        if value is None or (value == 0 and _whole(value)):
            return None  # 0 clears it, as `conf set --lease-ms 0` does
        if not _whole(value) or not 1 <= value <= MAX_LEASE_MS:
            raise bad(f"must be a whole number of milliseconds from 1 to {MAX_LEASE_MS}, or null")
        return value
    if column == "warmupPeriod":
        if value is None:
            return None
        if not _number(value) or not math.isfinite(value):
            raise bad("must be a number of seconds, or null")
        problem = single_float_problem(float(value))
        if problem:
            raise bad(problem)
        return float(value)
    if column == "periodSeconds":
        if not _whole(value) or not 1 <= value <= MAX_PERIOD:
            raise bad(f"must be a whole number of seconds from 1 to {MAX_PERIOD}")
        return value
    raise FieldError(column, f"unknown column; the columns are {', '.join(EDITABLE)}")


def single_float_problem(value: float) -> str:
    """Why ``value`` cannot go into a single-precision ``FLOAT`` column (warmupPeriod on
    MySQL/MariaDB) as what it means ("" if it can): too large for it, or so small that
    it would be stored as 0."""
    try:
        stored = struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        stored = math.inf
    if not math.isfinite(stored):
        return "too large for the column (a single-precision FLOAT)"
    if stored == 0 and value != 0:
        return "so small that the column (a single-precision FLOAT) would store 0"
    return ""


def check_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """Values by column name -> values by model attribute, each checked for its form."""
    return {EDITABLE.get(col, col): _check(col, value) for col, value in values.items()}


def algorithm_culprit(algorithm: str, max_permits: int | None, warmup: float | None) -> str:
    """The algorithm column (model attribute) ``rules.algorithm_problem`` complains
    about for these values: it checks algorithm, then maxPermits, then warmupPeriod,
    so the first whose removal changes the answer is the one at fault."""
    problem = algorithm_problem(algorithm, max_permits, warmup)
    if algorithm not in ALGORITHMS:
        return "algorithm"
    if max_permits is not None and algorithm_problem(algorithm, None, warmup) != problem:
        return "max_permits"
    return "warmup_period"


def row_problem(after: ConfRow) -> FieldError | None:
    """Why the reload would skip ``after`` once enabled (None if it would not): judged
    enabled whatever its status, since it may be enabled later."""
    judged = rule_from_row(replace(after, status=1), default_cache=0.0)
    if not isinstance(judged, Skipped):
        return None
    reason = judged.reason
    first_word = reason.split(" ", 1)[0]
    if first_word in EDITABLE:  # the reload's reasons start with the column at fault
        return FieldError(first_word, reason)
    algorithm = after.algorithm or "token_bucket"
    if algorithm_problem(algorithm, after.max_permits, after.warmup_period):
        attr = algorithm_culprit(algorithm, after.max_permits, after.warmup_period)
        return FieldError(COLUMN_OF[attr], reason)
    # The algorithm columns are fine alone: the row's period or scope does not suit them.
    return FieldError("periodSeconds" if (after.period_seconds or 1) != 1 else "perCaller", reason)


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


# --- writing a checked change, with its audit row, in one transaction ----------------------
#: Every writer of the limits table's rows writes through these: ``conf set``, ``conf
#: enable/disable/delete``, the console's add, edit and delete, and ``upsert_conf``.


def written_warnings(
    rows: Sequence[ConfRow], config_ids: Sequence[int], default_cache: float
) -> list[str]:
    """What the reload warns about the rows ``config_ids`` (just written) and the other
    rows of their URLs (a row added beside a leased one makes its lease ignored), among
    ``rows``, the table after the write. A channel row written concerns the rows of
    every interface of its channel too (its cap makes their leases ignored) and the
    other rows of that channel, not those of other channels. A disabled row written is
    judged as if enabled: a warning it would cause only then begins "once enabled"."""
    written = [r for r in rows if r.config_id in config_ids]
    channels = {
        r.channel_type for r in written if r.interface_url == CHANNEL_URL and r.channel_type
    }
    urls = {r.interface_url for r in written if r.interface_url != CHANNEL_URL}
    # the interfaces a channel row caps: every URL with a row naming its channel
    urls |= {r.interface_url for r in rows if r.channel_type in channels}
    urls.discard(CHANNEL_URL)
    concerned = {
        r.config_id
        for r in rows
        if r.interface_url in urls
        or (r.interface_url == CHANNEL_URL and r.channel_type in channels)
    }
    now = set(build_rules(rows, default_cache).warnings)
    enabled = [
        replace(r, status=1) if r.config_id in config_ids and r.status != 1 else r for r in rows
    ]
    return [
        warning if warning in now else f"once enabled, {warning}"
        for warning in build_rules(enabled, default_cache).warnings
        if isinstance(warning, RowWarning) and concerned & set(warning.config_ids)
    ]


def insert_row(table: LockedTable, fields: Mapping[str, Any], by: ChangedBy | None) -> ConfRow:
    """Insert a row with ``fields`` (model attributes) and its audit row (none when ``by``
    is None), in ``table``'s transaction; the row inserted."""
    row = table.insert(dict(fields))
    if by is not None:
        record_change(table.conn, by, row.config_id, "insert", None, row_record(row))
    return row


def update_row(
    table: LockedTable, current: ConfRow, fields: Mapping[str, Any], by: ChangedBy | None
) -> ConfRow:
    """Set ``fields`` (model attributes) on ``current`` (a row of ``table``, as locked)
    and record it (``by``; None: no audit), after what plain SQL changed on it since its
    latest audit (nothing is recorded when no value changes); the row after."""
    if by is not None:
        record_unrecorded(table.conn, [current], by)
    row = table.update(current.config_id, dict(fields))
    assert row is not None  # locked: nobody deleted it
    before, after = row_record(current), row_record(row)
    if by is not None and after != before:
        record_change(table.conn, by, current.config_id, "update", before, after)
    return row


class WouldSkip(ValueError):
    """A row the reload would skip beside the other rows of its URL, once written: the
    message says which and why (``combination_problem``)."""


def write_planned(
    table: LockedTable,
    old: ConfRow | None,
    after: ConfRow,
    fields: Mapping[str, Any],
    by: ChangedBy | None,
    default_cache: float,
) -> ConfRow:
    """Write ``after`` (``old`` with ``fields`` set, or, ``old`` None, a new row of
    ``fields``) in ``table``'s transaction, if the reload would limit it as meant: a
    ``FieldError`` when its own values would not (``row_problem``), ``WouldSkip`` when
    the rows of its URL would not go together (``combination_problem``), nothing written
    either way. The row written (``conf set`` and the console's writes)."""
    problem = row_problem(after)
    if problem is not None:
        raise problem
    clash = combination_problem(table.rows, after.interface_url or "", after, default_cache)
    if clash:
        raise WouldSkip(clash)
    return insert_row(table, fields, by) if old is None else update_row(table, old, fields, by)


def new_row(rows: Sequence[ConfRow], **columns: Any) -> ConfRow:
    """A row not in the table yet: the next configId after ``rows``', disabled, with
    ``columns`` (model attributes) and NULL elsewhere."""
    blank: dict[str, Any] = {
        "channel_type": None,
        "interface_no": None,
        "interface_url": None,
        "rate_limit": None,
        "cache": None,
        "status": 0,
    }
    return ConfRow(config_id=max([0, *(r.config_id for r in rows)]) + 1, **(blank | columns))


def delete_row(table: LockedTable, current: ConfRow, by: ChangedBy | None) -> None:
    """Delete ``current`` (a row of ``table``, as locked) and record it (``by``; None: no
    audit), after what plain SQL changed on it since its latest audit."""
    if by is not None:
        record_unrecorded(table.conn, [current], by)
    table.delete(current.config_id)
    if by is not None:
        record_change(table.conn, by, current.config_id, "delete", row_record(current), None)
