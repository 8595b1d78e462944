"""The audit trail ``t_ratelimite_audit``: who changed which limit, when, from what to what.

How it works: docs/internals.md, section ``gateway_limiter.config.audit``.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import Connection, Engine, func, insert, inspect, select, text

from gateway_limiter.config.table import (
    AUDIT_TABLE,
    SWITCH_ROW_ID,
    AuditEntry,
    ConfRow,
    LimiterSwitch,
    RateLimitConf,
    lock_table,
)
from gateway_limiter.observe.logs import log

#: How a change was made: the ``source`` column.
SOURCE_CLI: Final = "cli"
SOURCE_CONSOLE: Final = "console"
SOURCE_SQL: Final = "sql"
SOURCE_ADMIN: Final = "admin"
#: The switch as a configuration centre changed it (setting ``switch_source``).
SOURCE_ETCD: Final = "etcd"
SOURCE_APOLLO: Final = "apollo"
#: The sources that record the switch of a configuration centre, not the switch row.
CENTRE_SOURCES: Final = (SOURCE_ETCD, SOURCE_APOLLO)

#: The named lock (MySQL/MariaDB ``GET_LOCK``) one reload at a time holds while it
#: records the changes plain SQL made; followed by ``:`` and the SHA-1 of the database's
#: name (a named lock is the server's: two fleets on two databases do not share it).
SQL_AUDIT_LOCK: Final = "gateway_limiter.audit"
#: A reload does not wait for that lock (0 s): one that finds it taken tries again at
#: its next reload, so no reload thread of a large fleet queues behind the others.
SQL_AUDIT_LOCK_SECONDS: Final = 0

#: The columns of a recorded row, model attribute -> column name (no lastModifyTime).
RECORDED_COLUMNS: Final = {
    "config_id": "configId",
    "channel_type": "channelType",
    "interface_no": "interfaceNo",
    "interface_url": "interfaceUrl",
    "rate_limit": "rateLimit",
    "cache": "cache",
    "status": "status",
    "algorithm": "algorithm",
    "max_permits": "maxPermits",
    "warmup_period": "warmupPeriod",
    "period_seconds": "periodSeconds",
    "per_caller": "perCaller",
    "shadow": "shadow",
    "max_concurrent": "maxConcurrent",
    "caller_key": "callerKey",
    "lease_ms": "leaseMs",
    "quota_period": "quotaPeriod",
    "time_zone": "timeZone",
    "quota_renews": "quotaRenews",
    "quota_pacing": "quotaPacing",
    "priority": "priority",
    "reserve": "reserve",
}


@dataclass(frozen=True, slots=True)
class ChangedBy:
    """Who makes a change (``actor``: ``user@host`` or a name given) and through what
    (``source``: ``cli``, ``console``, ``sql``, ``admin``)."""

    actor: str
    source: str


def local_actor() -> str:
    """``user@host`` of this process: the actor of a command line change by default."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}"[:128]


def _value(name: str, value: Any) -> Any:
    # FLOAT columns read back as 0.30000001192...: the audit keeps what was meant.
    if isinstance(value, float):
        return round(value, 2) if name == "cache" else round(value, 6)
    return value


#: Columns recorded only when set: rows recorded before the column existed still compare
#: equal to the same rows read after ``db upgrade`` (no spurious ``sql`` updates).
#: (quotaPacing, NOT NULL, is recorded only when 1.)
_RECORDED_WHEN_SET: Final = frozenset(
    {"lease_ms", "quota_period", "time_zone", "quota_renews", "quota_pacing", "priority", "reserve"}
)


def row_record(row: ConfRow | RateLimitConf) -> dict[str, Any]:
    """A row as the audit records it: column name -> value (no lastModifyTime)."""
    record = {}
    for attr, col in RECORDED_COLUMNS.items():
        value = getattr(row, attr, None)
        unset = value is None or (attr == "quota_pacing" and value == 0)
        if attr not in _RECORDED_WHEN_SET or not unset:
            record[col] = _value(attr, value)
    return record


def _dump(record: Mapping[str, Any] | None) -> str | None:
    return None if record is None else json.dumps(record, sort_keys=True, default=str)


def record_change(
    conn: Connection,
    by: ChangedBy,
    config_id: int | None,
    action: str,
    before: Mapping[str, Any] | None,
    after: Mapping[str, Any] | None,
) -> None:
    """Insert one audit row on ``conn``, in the caller's transaction."""
    conn.execute(
        insert(AuditEntry).values(
            actor=by.actor[:128],
            source=by.source,
            config_id=config_id,
            action=action,
            before_row=_dump(before),
            after_row=_dump(after),
        )
    )


def switch_record(enabled: bool | int | None) -> dict[str, Any]:
    """The switch as the audit records it."""
    return {"enabled": None if enabled is None else bool(enabled)}


# --- what plain SQL changed ----------------------------------------------------------------


def _latest(
    conn: Connection, config_ids: Sequence[int] | None = None
) -> tuple[dict[int, str | None], str | None]:
    """The latest recorded afterRow per configId (of ``config_ids`` when given), and of
    the switch (None: never)."""
    last = select(func.max(AuditEntry.audit_id)).where(AuditEntry.config_id.is_not(None))
    if config_ids is not None:
        last = last.where(AuditEntry.config_id.in_(list(config_ids)))
    last = last.group_by(AuditEntry.config_id)
    found = conn.execute(
        select(AuditEntry.config_id, AuditEntry.after_row).where(
            AuditEntry.audit_id.in_(last.scalar_subquery())
        )
    )
    rows = {int(c): after for c, after in found if c is not None}
    switch_after = conn.execute(
        select(AuditEntry.after_row)
        .where(AuditEntry.config_id.is_(None), AuditEntry.source.not_in(CENTRE_SOURCES))
        .order_by(AuditEntry.audit_id.desc())
        .limit(1)
    ).scalar_one_or_none()
    return rows, switch_after


_Found = tuple[int | None, str, Mapping[str, Any] | None, Mapping[str, Any] | None]


def _row_changes(rows: Sequence[ConfRow], latest: Mapping[int, str | None]) -> list[_Found]:
    """(configId, action, before, after) for each row of ``rows`` that differs from the
    latest afterRow recorded for it (``latest``), every column compared."""
    found: list[_Found] = []
    for row in rows:
        now = row_record(row)
        known = latest.get(row.config_id)
        # Compared as JSON both ways: what was stored against what would be stored now.
        if known is not None and json.loads(known) == json.loads(_dump(now) or "null"):
            continue
        before = None if known is None else json.loads(known)
        found.append((row.config_id, "insert" if before is None else "update", before, now))
    return found


def _insert_found(conn: Connection, by: ChangedBy, found: Sequence[_Found]) -> None:
    # one executemany: a first reload of a 10,000-row table writes 10,000 entries in
    # one batch, not one by one
    conn.execute(
        insert(AuditEntry),
        [
            {  # executemany's parameters are named by column
                "actor": by.actor[:128],
                "source": by.source,
                "configId": config_id,
                "action": action,
                "beforeRow": _dump(before),
                "afterRow": _dump(after),
            }
            for config_id, action, before, after in found
        ],
    )


def record_unrecorded(conn: Connection, rows: Sequence[ConfRow], by: ChangedBy) -> int:
    """Before a change ``by`` makes to ``rows`` (read locked, in the caller's
    transaction): record, with source ``sql``, what plain SQL changed on them since
    their latest audit, so the change's own entry starts from a recorded state. Returns
    how many entries were written (none when the audit table is missing)."""
    if not rows or not inspect(conn).has_table(AUDIT_TABLE):
        return 0
    latest, _ = _latest(conn, [r.config_id for r in rows])
    found = _row_changes(rows, latest)
    if found:
        actor = f"found by {by.source} change of {by.actor}"
        _insert_found(conn, ChangedBy(actor[:128], SOURCE_SQL), found)
    return len(found)


def record_unrecorded_switch(conn: Connection, was: int | None, by: ChangedBy) -> bool:
    """Before a change ``by`` makes to the switch (read locked as ``was``): record, with
    source ``sql``, a change plain SQL made to it since its latest audit. Whether one
    was recorded."""
    if not inspect(conn).has_table(AUDIT_TABLE):
        return False
    _, switch_after = _latest(conn, [])
    known = None if switch_after is None else json.loads(switch_after)
    now = switch_record(was)
    # never recorded and NULL (the settings decide): nothing was changed
    if known == now or (known is None and was is None):
        return False
    actor = f"found by {by.source} change of {by.actor}"
    _insert_found(conn, ChangedBy(actor[:128], SOURCE_SQL), [(None, "switch", known, now)])
    return True


def _sql_changes(conn: Connection, by: ChangedBy) -> int:
    # Locked as every change by the command line or the console locks it: none can
    # commit between this read and the inserts below, so an entry is never stale.
    rows = lock_table(conn)
    latest, switch_after = _latest(conn)
    found = _row_changes(rows, latest)
    seen = {row.config_id for row in rows}
    for config_id, known in latest.items():
        if config_id not in seen and known is not None:
            found.append((config_id, "delete", json.loads(known), None))
    enabled = conn.execute(
        select(LimiterSwitch.enabled)
        .where(LimiterSwitch.switch_id == SWITCH_ROW_ID)
        .with_for_update()
    ).scalar_one_or_none()
    now_switch = switch_record(enabled)
    before_switch = None if switch_after is None else json.loads(switch_after)
    # A switch never recorded and still NULL (the settings decide) is nothing to record.
    if before_switch != now_switch and not (before_switch is None and enabled is None):
        found.append((None, "switch", before_switch, now_switch))
    if found:
        _insert_found(conn, by, found)
    return len(found)


def audit_lock_name(database: str) -> str:
    """The named lock of the recording of plain-SQL changes in ``database``."""
    return f"{SQL_AUDIT_LOCK}:{hashlib.sha1(database.encode()).hexdigest()}"


def record_sql_changes(engine: Engine, actor: str | None = None) -> int | None:
    """Record, with source ``sql``, every difference between the table (and the switch)
    and the latest audit of each row; returns how many audit rows were written, or None
    when another process holds the lock (try again later).

    Safe to call from every process of a fleet at once: see the module's docstring. A
    database without the audit table (a schema before revision 0006) records nothing.
    """
    by = ChangedBy(actor or f"reload on {socket.gethostname()}:{os.getpid()}", SOURCE_SQL)
    mysql = engine.dialect.name in ("mysql", "mariadb")
    with engine.connect() as conn:
        if not inspect(conn).has_table(AUDIT_TABLE):
            return 0
        conn.commit()  # end the inspector's transaction: ours starts under the lock
        if mysql:
            # a named lock is the server's, not the database's: one per database
            lock_name = audit_lock_name(str(conn.execute(text("SELECT DATABASE()")).scalar()))
            got = conn.execute(
                text("SELECT GET_LOCK(:name, :wait)"),
                {"name": lock_name, "wait": SQL_AUDIT_LOCK_SECONDS},
            ).scalar()
            conn.commit()  # the lock belongs to the session, not to this transaction
            if got != 1:
                log.debug("another process records the SQL changes (lock busy)")
                return None
        try:
            with conn.begin():
                written = _sql_changes(conn, by)
        finally:
            if mysql:
                conn.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": lock_name})
                conn.commit()
    return written


def record_source_switch(
    engine: Engine, kind: str, where: str, enabled: bool | None, version: str
) -> bool:
    """Record that the configuration centre ``kind`` (``etcd``, ``apollo``) at ``where``
    (masked) now says ``enabled`` (None: no key, the setting applies), as of
    ``version`` (etcd's mod_revision, Apollo's releaseKey); returns whether it wrote.

    Every process of a fleet sees the change and calls this: under the audit's lock,
    a change already recorded (the same value and version, or the same value as the
    source's latest entry) is not recorded again.
    """
    after = {"enabled": enabled, "version": version}
    mysql = engine.dialect.name in ("mysql", "mariadb")
    with engine.connect() as conn:
        if not inspect(conn).has_table(AUDIT_TABLE):
            return False
        conn.commit()
        if mysql:
            # a named lock is the server's, not the database's: one per database
            lock_name = audit_lock_name(str(conn.execute(text("SELECT DATABASE()")).scalar()))
            got = conn.execute(
                text("SELECT GET_LOCK(:name, :wait)"), {"name": lock_name, "wait": 10}
            ).scalar()
            conn.commit()
            if got != 1:
                raise TimeoutError("the audit's lock stayed busy for 10 s")
        try:
            with conn.begin():
                mine = (AuditEntry.config_id.is_(None), AuditEntry.source == kind)
                latest = conn.execute(
                    select(AuditEntry.after_row)
                    .where(*mine)
                    .order_by(AuditEntry.audit_id.desc())
                    .limit(1)
                ).scalar_one_or_none()
                before = None if latest is None else json.loads(latest)
                same = before is not None and before.get("enabled") == enabled
                seen = (
                    version != ""
                    and conn.execute(
                        select(AuditEntry.audit_id)
                        .where(*mine, AuditEntry.after_row == _dump(after))
                        .limit(1)
                    ).first()
                )
                if same or seen:
                    return False
                record_change(conn, ChangedBy(where, kind), None, "switch", before, after)
        finally:
            if mysql:
                conn.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": lock_name})
                conn.commit()
    return True


# --- reading it ----------------------------------------------------------------------------


def read_audit(
    engine: Engine, *, limit: int = 100, config_id: int | None = None
) -> list[dict[str, Any]]:
    """The latest ``limit`` audit rows, newest first (of one configId if given), each as
    column name -> value with beforeRow/afterRow decoded."""
    t = AuditEntry.__table__
    query = select(t).order_by(t.c.auditId.desc()).limit(limit)
    if config_id is not None:
        query = query.where(t.c.configId == config_id)
    with engine.connect() as conn:
        found = [r._mapping for r in conn.execute(query)]
    return [
        {
            "auditId": e["auditId"],
            "changedAt": None
            if e["changedAt"] is None
            else e["changedAt"].isoformat(sep=" ", timespec="seconds"),
            "actor": e["actor"],
            "source": e["source"],
            "configId": e["configId"],
            "action": e["action"],
            "beforeRow": None if e["beforeRow"] is None else json.loads(e["beforeRow"]),
            "afterRow": None if e["afterRow"] is None else json.loads(e["afterRow"]),
        }
        for e in found
    ]
