"""Set up and fill the limits tables from Python: what examples, tests and operator
scripts need, without the command line.

>>> from gateway_limiter import admin
>>> url = "sqlite:///limits.db"
>>> admin.upgrade(url)  # doctest: +SKIP
>>> admin.set_limit(url, "/ibe/flight/search", rate=10, cache=1.0)  # doctest: +SKIP
1
>>> admin.set_switch(url, True)  # doctest: +SKIP

Each function takes the database URL (a SQLAlchemy URL, as ``database_url``), opens
its own connection and closes it before returning: a running limiter sees the change
at its next reload (``reload_interval``), or at once after ``limiter.reload()``. They do
what ``gateway-limiter db upgrade``, ``conf set`` and ``switch on/off/default`` do.
SQLAlchemy and Alembic are imported only when a function is called.
"""

from __future__ import annotations

from typing import Any

__all__ = ["set_limit", "set_switch", "upgrade"]


def upgrade(database_url: str) -> None:
    """Create the limits tables, or migrate them to the newest revision.

    Safe to run again (nothing to do at the newest revision). A ``sqlite:///path`` file
    that does not exist is created.
    """
    from gateway_limiter.config.migrate import upgrade as migrate_upgrade
    from gateway_limiter.config.table import make_engine

    engine = make_engine(database_url)
    try:
        migrate_upgrade(engine)
    finally:
        engine.dispose()


def set_limit(
    database_url: str,
    interface_url: str,
    rate: int,
    *,
    cache: float | None = None,
    period_seconds: int = 1,
    per_caller: bool = False,
    enabled: bool = True,
    shadow: bool = False,
    algorithm: str = "token_bucket",
    max_permits: int | None = None,
    warmup_period: float | None = None,
    caller_key: str | None = None,
    quota_period: str | None = None,
    time_zone: str | None = None,
    quota_renews: str | None = None,
    quota_pacing: bool = False,
) -> int:
    """Store one limit: ``rate`` calls per ``period_seconds`` on ``interface_url``.

    The row for that URL, period and scope (``per_caller``: each caller its own
    bucket, else all callers together) is updated, or inserted; every column named
    here is written. ``cache`` is the most a call may wait for a permit (seconds;
    None: the ``default_cache`` setting). ``enabled=False`` stores the row but does not
    enforce it; ``shadow=True`` counts what it would refuse and refuses nothing.
    ``algorithm`` is ``token_bucket``, ``sliding_window`` or ``warm_up`` (with
    ``max_permits`` and ``warmup_period``: docs/algorithms.md). ``caller_key`` (with
    ``per_caller=True``): the row for that caller alone (a named caller); the row that
    names none is another row. ``quota_period`` (``day``, ``week``, ``month``): a
    calendar quota, ``rate`` per period of the calendar in ``time_zone`` (None: the
    ``default_time_zone`` setting), renewing at ``quota_renews`` (local time; None:
    midnight, Monday, the 1st); a URL's calendar quota is a row of its own, beside its
    rate's.

    Returns the row's configId. Raises ValueError, and writes nothing, when the
    reload would skip the row (it names why); the tables must exist (``upgrade``).
    The change is recorded in the audit table (source ``admin``, actor ``user@host``).
    """
    from dataclasses import replace

    from gateway_limiter.config.audit import SOURCE_ADMIN, ChangedBy, local_actor
    from gateway_limiter.config.edits import combination_problem, single_float_problem
    from gateway_limiter.config.rules import Skipped, rule_from_row
    from gateway_limiter.config.table import ConfRow, make_engine, upsert_conf

    scope = {
        "period_seconds": period_seconds,
        "per_caller": int(per_caller),
        "caller_key": caller_key,
        "quota_period": quota_period,
    }
    fields: dict[str, Any] = {
        "rate_limit": rate,
        "cache": cache,
        "status": int(enabled),
        "shadow": int(shadow),
        "algorithm": algorithm,
        "max_permits": max_permits,
        "warmup_period": warmup_period,
        "time_zone": time_zone,
        "quota_renews": quota_renews,
        "quota_pacing": int(quota_pacing),
    }
    # Checked as the reload reads it (enabled, even if stored disabled: it may be
    # enabled later), so a limit set here is never skipped there.
    planned = ConfRow(
        config_id=0,
        channel_type=None,
        interface_no=None,
        interface_url=interface_url,
        rate_limit=rate,
        cache=cache,
        status=1,
        algorithm=algorithm,
        max_permits=max_permits,
        warmup_period=warmup_period,
        period_seconds=period_seconds,
        per_caller=int(per_caller),
        shadow=int(shadow),
        caller_key=caller_key,
        quota_period=quota_period,
        time_zone=time_zone,
        quota_renews=quota_renews,
        quota_pacing=int(quota_pacing),
    )
    checked = rule_from_row(planned, default_cache=0.0)
    if isinstance(checked, Skipped):
        raise ValueError(f"limit on {interface_url!r} refused: {checked.reason}")
    if warmup_period is not None and single_float_problem(warmup_period):
        problem = single_float_problem(warmup_period)
        raise ValueError(f"limit on {interface_url!r} refused: warmupPeriod {problem}")

    def beside_the_others(rows: list[ConfRow], old: ConfRow | None) -> None:
        # on the rows as they are in the transaction that writes: a warm_up row beside
        # other limits of its URL (or one beside it) would be skipped
        after = replace(planned, config_id=old.config_id if old else -1, status=int(enabled))
        clash = combination_problem(rows, interface_url, after, 0.0)
        if clash:
            raise ValueError(f"limit on {interface_url!r} refused: the reload would skip {clash}")

    engine = make_engine(database_url)
    try:
        by = ChangedBy(local_actor(), SOURCE_ADMIN)
        row, _ = upsert_conf(
            engine, interface_url, where=scope, by=by, check=beside_the_others, **fields
        )
    finally:
        engine.dispose()
    return row.config_id


def set_switch(database_url: str, enabled: bool | None) -> None:
    """Turn every limit on (True) or off (False: every call admitted), or let the
    ``switch`` setting decide again (None)."""
    from gateway_limiter.config.audit import SOURCE_ADMIN, ChangedBy, local_actor
    from gateway_limiter.config.table import make_engine, write_switch

    engine = make_engine(database_url)
    try:
        write_switch(engine, enabled, ChangedBy(local_actor(), SOURCE_ADMIN))
    finally:
        engine.dispose()
