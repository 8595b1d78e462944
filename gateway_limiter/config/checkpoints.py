"""Calendar quotas' checkpoints in ``t_ratelimite_quota`` (revision 0011).

One row per counter: its Redis key (and the key's SHA1, the primary key), the start of
the period it counts (epoch µs) and the count. Written by the one process that holds the
counter's lock (``core/quotas.py``), read by every process when it starts. A row is only
ever moved on: a write that would lower the count of its period, or go back to an earlier
period, changes nothing (a lock handed over while the old holder still writes).
"""

from __future__ import annotations

from collections.abc import Iterable
from hashlib import sha1
from typing import NamedTuple

from sqlalchemy import Engine, Table, and_, insert, or_, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from gateway_limiter.config.table import QuotaCheckpoint
from gateway_limiter.observe.logs import Throttle, held_back, log, one_line


class Checkpoint(NamedTuple):
    """A counter's count as one row of ``t_ratelimite_quota``."""

    key: str  # the counter's Redis key
    window_us: float  # the start of its period (epoch µs)
    used: float  # the permits counted in it


def counter_id(key: str) -> str:
    """The row's primary key for a counter's Redis ``key``."""
    return sha1(key.encode("utf-8", "surrogatepass")).hexdigest()


def read_checkpoints(engine: Engine, prefix: str) -> list[Checkpoint]:
    """Every checkpoint of counters under ``prefix`` (the fleet's ``key_prefix``)."""
    table = QuotaCheckpoint.__table__
    query = select(table.c.counterKey, table.c.periodStart, table.c.used).where(
        table.c.counterKey.startswith(f"{prefix}:", autoescape=True)
    )
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    return [Checkpoint(str(k), float(w), float(u)) for k, w, u in rows]


def write_checkpoints(engine: Engine, rows: Iterable[Checkpoint]) -> None:
    """Move each counter's row on to ``rows`` (one transaction), never back."""
    table = QuotaCheckpoint.__table__
    assert isinstance(table, Table)
    with engine.begin() as conn:
        for row in rows:
            ident, window, used = counter_id(row.key), int(row.window_us), int(row.used)
            moved = conn.execute(
                update(table)
                .where(
                    table.c.counterId == ident,
                    or_(
                        table.c.periodStart < window,
                        and_(table.c.periodStart == window, table.c.used < used),
                    ),
                )
                .values(periodStart=window, used=used)
            )
            if moved.rowcount:
                continue
            exists = conn.execute(select(table.c.counterId).where(table.c.counterId == ident))
            if exists.first() is not None:
                continue  # it holds as much already
            try:
                with conn.begin_nested():
                    conn.execute(
                        insert(table).values(
                            counterId=ident, counterKey=row.key, periodStart=window, used=used
                        )
                    )
            except IntegrityError:
                continue  # another process inserted it meanwhile: its count stands


_FAILURES = Throttle(60.0)


def _failed(what: str, error: Exception) -> None:
    held = _FAILURES.ready(what)
    if held is not None:
        log.warning(
            "calendar quota checkpoints not %s (%s): a Redis that comes back without its "
            "counters resumes from what this process saw%s",
            what,
            one_line(str(error)),
            held_back(held),
        )


def checkpoints_read(engine: Engine, prefix: str) -> list[Checkpoint]:
    """``read_checkpoints``, or none when the database cannot answer (logged, at most
    once a minute: no table yet, unreachable)."""
    try:
        return read_checkpoints(engine, prefix)
    except SQLAlchemyError as e:
        _failed("read", e)
        return []


def checkpoints_written(engine: Engine, rows: list[Checkpoint]) -> bool:
    """``write_checkpoints``; False when the database cannot take them (logged, at most
    once a minute)."""
    try:
        write_checkpoints(engine, rows)
    except SQLAlchemyError as e:
        _failed("written", e)
        return False
    return True
