"""Set up and fill the limits tables from Python, as ``gateway-limiter db upgrade``,
``conf set`` and ``switch`` do: for examples, tests and operator scripts.

Each function opens its own connection to ``database_url`` and closes it; a running
limiter sees the change at its next reload, or at once after ``limiter.reload()``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["set_limit", "set_switch", "upgrade"]


def upgrade(database_url: str) -> None:
    """Create the limits tables, or migrate them to the newest revision.

    Safe to run again (nothing to do at the newest revision).

    Args:
        database_url: a SQLAlchemy URL, as the ``database_url`` setting; a
            ``sqlite:///path`` file that does not exist is created.

    Example:
        ```python
        admin.upgrade("mysql+pymysql://gw:secret@db/gateway")
        ```
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

    The row for that URL, period and scope is updated, or inserted; every column named
    here is written. The change is recorded in the audit table (source ``admin``).

    Args:
        database_url: a SQLAlchemy URL; the tables must exist (``upgrade``).
        interface_url: the interface, as callers pass it (``/ibe/flight/search``).
        rate: permits per period (``rateLimit``); 0 closes the interface.
        cache: the most a call may wait for a permit, seconds; None: the
            ``default_cache`` setting.
        period_seconds: the period of ``rate``, 1 to 86,400 seconds.
        per_caller: each caller key its own limit, else all callers together.
        enabled: False stores the row without enforcing it.
        shadow: True counts what the row would refuse and refuses nothing.
        algorithm: ``token_bucket``, ``warm_up``, ``sliding_window`` or
            ``fixed_window``.
        max_permits: a token bucket's capacity; None: one period's worth.
        warmup_period: ``warm_up``'s seconds from cold to the full rate.
        caller_key: with ``per_caller=True``, the row of that caller alone (a named
            caller).
        quota_period: ``day``, ``week`` or ``month``: a calendar quota, a row of its own
            beside the URL's rate.
        time_zone: the quota's IANA zone; None: the ``default_time_zone`` setting.
        quota_renews: when the quota renews, in local time (``02:00``, ``mon 00:00``,
            ``15 00:00``); None: midnight, Monday, the 1st.
        quota_pacing: stored; not applied yet.

    Returns:
        The row's ``configId``.

    Raises:
        ValueError: the reload would skip the row (the message says why); nothing is
            written.

    Example:
        ```python
        url = "sqlite:///limits.db"
        admin.set_limit(url, "/ibe/flight/search", rate=20, cache=0.2)
        admin.set_limit(url, "/ibe/flight/search", rate=50_000, quota_period="day",
                        time_zone="Asia/Shanghai")
        ```
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
    """Set the global switch of every process sharing the table.

    Args:
        database_url: a SQLAlchemy URL; the tables must exist (``upgrade``).
        enabled: True turns every limit on; False off (every call admitted); None lets
            the ``switch`` setting decide again.

    Example:
        ```python
        admin.set_switch("sqlite:///limits.db", False)
        ```
    """
    from gateway_limiter.config.audit import SOURCE_ADMIN, ChangedBy, local_actor
    from gateway_limiter.config.table import make_engine, write_switch

    engine = make_engine(database_url)
    try:
        write_switch(engine, enabled, ChangedBy(local_actor(), SOURCE_ADMIN))
    finally:
        engine.dispose()
