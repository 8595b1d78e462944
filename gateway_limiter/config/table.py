"""The limits table ``t_ratelimite_conf`` and the switch table, and every query on them.

The model mirrors the table of docs/design.md column for column; ``sql/`` holds the same DDL
for MySQL, and ``migrations/`` creates it (a test compares the two). Nothing else in
the package speaks SQL, and no SQL here is built from strings.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import (
    BigInteger,
    Connection,
    DateTime,
    Engine,
    Float,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Text,
    cast,
    create_engine,
    delete,
    event,
    func,
    insert,
    inspect,
    make_url,
    select,
    text,
    type_coerce,
    update,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, NoSuchTableError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import NullType

from gateway_limiter.observe.redact import mask_secrets, url_error

if TYPE_CHECKING:
    from gateway_limiter.config.audit import ChangedBy

CONF_TABLE = "t_ratelimite_conf"
SWITCH_TABLE = "t_ratelimite_switch"
AUDIT_TABLE = "t_ratelimite_audit"
QUOTA_TABLE = "t_ratelimite_quota"
SWITCH_ROW_ID = 1

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# MySQL types exactly as the DDL; plain types elsewhere (SQLite).
_INT11 = Integer().with_variant(mysql.INTEGER(display_width=11), "mysql", "mariadb")
_FLOAT32 = Float().with_variant(mysql.FLOAT(precision=3, scale=2), "mysql", "mariadb")
_BIGINT = BigInteger().with_variant(Integer(), "sqlite")  # SQLite autoincrements INTEGER only
_TINYINT1 = SmallInteger().with_variant(mysql.TINYINT(display_width=1), "mysql", "mariadb")


class StampedNow(FunctionElement[dt.datetime]):
    """Server default of lastModifyTime: now, and on MySQL/MariaDB again on every UPDATE."""

    type = DateTime()
    name = "stamped_now"
    inherit_cache = True


@compiles(StampedNow)
def _stamped_now(element: StampedNow, compiler: SQLCompiler, **kw: Any) -> str:
    return "CURRENT_TIMESTAMP"


@compiles(StampedNow, "mysql")
@compiles(StampedNow, "mariadb")
def _stamped_now_mysql(element: StampedNow, compiler: SQLCompiler, **kw: Any) -> str:
    return "CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP"


class Base(DeclarativeBase):
    """Declarative base carrying the naming convention."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class RateLimitConf(Base):
    """One row of ``t_ratelimite_conf``: a limit on one upstream interface."""

    __tablename__ = CONF_TABLE

    config_id: Mapped[int] = mapped_column("configId", _INT11, primary_key=True, autoincrement=True)
    channel_type: Mapped[str | None] = mapped_column("channelType", String(24))
    interface_no: Mapped[str | None] = mapped_column("interfaceNo", String(24))
    interface_url: Mapped[str | None] = mapped_column("interfaceUrl", String(128))
    rate_limit: Mapped[int | None] = mapped_column("rateLimit", _INT11)
    cache: Mapped[float | None] = mapped_column("cache", _FLOAT32)
    status: Mapped[int] = mapped_column("status", _TINYINT1, nullable=False, server_default="0")
    last_modify_time: Mapped[dt.datetime | None] = mapped_column(
        "lastModifyTime",
        DateTime,
        server_default=StampedNow(),
        onupdate=func.current_timestamp(),
    )
    # Revision 0003
    algorithm: Mapped[str | None] = mapped_column(
        "algorithm", String(16), server_default="token_bucket"
    )
    max_permits: Mapped[int | None] = mapped_column("maxPermits", _INT11)
    warmup_period: Mapped[float | None] = mapped_column("warmupPeriod", Float)
    # Revision 0004
    period_seconds: Mapped[int] = mapped_column(
        "periodSeconds", _INT11, nullable=False, server_default="1"
    )
    per_caller: Mapped[int] = mapped_column(
        "perCaller", _TINYINT1, nullable=False, server_default="0"
    )
    # Revision 0005
    shadow: Mapped[int] = mapped_column("shadow", _TINYINT1, nullable=False, server_default="0")
    # Revision 0006
    max_concurrent: Mapped[int | None] = mapped_column("maxConcurrent", _INT11)
    caller_key: Mapped[str | None] = mapped_column("callerKey", String(64))
    # Revision 0007
    lease_ms: Mapped[int | None] = mapped_column("leaseMs", _INT11)
    # Revision 0009
    quota_period: Mapped[str | None] = mapped_column("quotaPeriod", String(8))
    time_zone: Mapped[str | None] = mapped_column("timeZone", String(64))
    quota_renews: Mapped[str | None] = mapped_column("quotaRenews", String(16))
    quota_pacing: Mapped[int] = mapped_column(
        "quotaPacing", _TINYINT1, nullable=False, server_default="0"
    )
    # Revision 0010
    priority: Mapped[str | None] = mapped_column("priority", String(16))
    reserve: Mapped[str | None] = mapped_column("reserve", String(128))


class LimiterSwitch(Base):
    """The global switch: one row; ``enabled`` NULL means "the settings default"."""

    __tablename__ = SWITCH_TABLE

    switch_id: Mapped[int] = mapped_column(
        "switchId", _INT11, primary_key=True, autoincrement=False
    )
    enabled: Mapped[int | None] = mapped_column("enabled", _TINYINT1)
    last_modify_time: Mapped[dt.datetime | None] = mapped_column(
        "lastModifyTime",
        DateTime,
        server_default=StampedNow(),
        onupdate=func.current_timestamp(),
    )


class AuditEntry(Base):
    """One row of ``t_ratelimite_audit``: a change of a limit or of the switch.

    ``source`` says how it was made (``cli``, ``console``, or ``sql`` when the reload
    found it), ``actor`` who made it, ``action`` what (``insert``, ``update``,
    ``delete``, ``switch``); ``beforeRow``/``afterRow`` hold the row as JSON (NULL for
    an insert's before and a delete's after). ``configId`` is NULL for the switch.
    """

    __tablename__ = AUDIT_TABLE
    __table_args__ = (Index("ix_t_ratelimite_audit_changedAt", "changedAt"),)

    audit_id: Mapped[int] = mapped_column("auditId", _BIGINT, primary_key=True, autoincrement=True)
    changed_at: Mapped[dt.datetime] = mapped_column(
        "changedAt", DateTime, nullable=False, server_default=func.current_timestamp()
    )
    actor: Mapped[str] = mapped_column("actor", String(128), nullable=False)
    source: Mapped[str] = mapped_column("source", String(16), nullable=False)
    config_id: Mapped[int | None] = mapped_column("configId", _INT11)
    action: Mapped[str] = mapped_column("action", String(16), nullable=False)
    before_row: Mapped[str | None] = mapped_column("beforeRow", Text)
    after_row: Mapped[str | None] = mapped_column("afterRow", Text)


class QuotaCheckpoint(Base):
    """One row of ``t_ratelimite_quota`` (revision 0011): a calendar quota counter's count
    as last checkpointed, so that a Redis that comes back without it resumes from here
    (``core/quotas.py``). ``counterId`` is the SHA1 of ``counterKey`` (the Redis key),
    which stays byte-exact whatever the database's collation."""

    __tablename__ = QUOTA_TABLE

    counter_id: Mapped[str] = mapped_column("counterId", String(40), primary_key=True)
    counter_key: Mapped[str] = mapped_column("counterKey", String(512), nullable=False)
    period_start: Mapped[int] = mapped_column("periodStart", BigInteger, nullable=False)
    used: Mapped[int] = mapped_column("used", BigInteger, nullable=False)
    saved_at: Mapped[dt.datetime] = mapped_column(
        "savedAt", DateTime, nullable=False, server_default=func.current_timestamp()
    )


#: The text columns that identify a row (with its period and scope), and their lengths:
#: compared byte for byte from revision 0008 on, as the limiter compares them.
IDENTIFYING_COLUMNS: Final = {"interfaceUrl": 128, "channelType": 24, "callerKey": 64}


def column_charset(conn: Connection, column: str) -> str:
    """The character set of ``column`` of the limits table (MySQL/MariaDB)."""
    found = conn.execute(
        text(
            "SELECT CHARACTER_SET_NAME FROM information_schema.COLUMNS WHERE "
            "TABLE_SCHEMA = DATABASE() AND TABLE_NAME = :t AND COLUMN_NAME = :c"
        ),
        {"t": CONF_TABLE, "c": column},
    ).scalar_one()
    return str(found)


def binary_collation(conn: Connection, charset: str) -> str:
    """The binary collation of ``charset`` that pads no spaces if the server has one
    (MariaDB ``_nopad_bin``, MySQL 8 ``_0900_bin``), else its ``_bin``."""
    for name in (f"{charset}_nopad_bin", f"{charset}_0900_bin", f"{charset}_bin"):
        known = conn.execute(
            text("SELECT COUNT(*) FROM information_schema.COLLATIONS WHERE COLLATION_NAME = :n"),
            {"n": name},
        ).scalar_one()
        if known:
            return name
    raise ValueError(f"character set {charset} has no binary collation")


def collation_collisions(
    conn: Connection, column: str, collation: str
) -> list[tuple[int, str, int, str]]:
    """Pairs of rows (configId, value, configId, value) whose ``column`` differs byte
    for byte yet compares equal under ``collation`` (MySQL/MariaDB)."""
    if not re.fullmatch(r"[A-Za-z0-9_]+", collation) or column not in IDENTIFYING_COLUMNS:
        raise ValueError(f"not a column and collation: {column!r}, {collation!r}")
    t = RateLimitConf.__table__
    one, other = t.alias("a"), t.alias("b")
    found = conn.execute(
        select(one.c.configId, one.c[column], other.c.configId, other.c[column])
        .join_from(one, other, one.c.configId < other.c.configId)
        .where(one.c[column].collate(collation) == other.c[column].collate(collation))
        .where(cast(one.c[column], mysql.BINARY()) != cast(other.c[column], mysql.BINARY()))
        .order_by(one.c.configId, other.c.configId)
    ).all()
    return [(int(a), str(va), int(b), str(vb)) for a, va, b, vb in found]


class DatabaseUrlError(ValueError):
    """The database URL cannot be used (bad form, or no driver for it)."""


def make_engine(url: str, *, timeout: float = 5.0) -> Engine:
    """An engine that never hangs a reload: bounded connect/read timeouts, pre-ping."""
    connect_args: dict[str, Any] = {}
    if url.startswith(("mysql", "mariadb")):
        connect_args = {
            "connect_timeout": max(1, round(timeout)),
            "read_timeout": max(1, round(timeout)),
            "write_timeout": max(1, round(timeout)),
        }
    elif url.startswith("sqlite"):
        connect_args = {"timeout": timeout, "check_same_thread": False}
    try:
        engine = create_engine(
            url, pool_pre_ping=True, pool_recycle=3600, connect_args=connect_args
        )
    except (ArgumentError, NoSuchModuleError, ValueError) as e:
        raise DatabaseUrlError(f"database_url {url_error(url, e)}") from None
    except ImportError as e:  # a dialect SQLAlchemy knows, whose driver is not installed
        raise DatabaseUrlError(
            f"database_url {mask_secrets(url)}: its driver is not installed ({e})"
            + _driver_hint(url)
        ) from None
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_text)
    return engine


def _sqlite_text(dbapi_connection: Any, _: Any) -> None:
    # SQLite keeps text that is not UTF-8 (CAST(X'ff' AS TEXT)); sqlite3 fails the whole
    # query on it. Read it as bytes instead: its row is skipped as "not text", naming it.
    dbapi_connection.text_factory = _text


def _text(value: bytes) -> str | bytes:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value


def _driver_hint(url: str) -> str:
    """For ``mysql://`` or ``mariadb://`` (SQLAlchemy's default driver, MySQLdb, which
    is not installed): the URL with the driver that is, PyMySQL."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme in ("mysql", "mariadb"):
        return f"; use {scheme}+pymysql://{mask_secrets(rest)} (PyMySQL comes with gateway-limiter)"
    return ""


def missing_sqlite_file(url: str | URL) -> Path | None:
    """The file a ``sqlite:///path`` URL names when it does not exist, else None.

    Connecting to such a URL creates an empty file (SQLite's default), so whatever only
    reads the tables asks this first and does not connect. None for other databases,
    an in-memory database and SQLite URI filenames (``file:...?mode=...``), whose
    opening SQLite itself decides.
    """
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except ArgumentError:
        return None  # not a URL at all: make_engine reports it
    path = parsed.database
    if parsed.get_backend_name() != "sqlite" or not path or path == ":memory:":
        return None
    if parsed.query.get("uri") or path.startswith("file:"):
        return None
    return None if Path(path).exists() else Path(path)


@dataclass(frozen=True, slots=True)
class ConfRow:
    """A row as read, before any validation (values as the database holds them)."""

    config_id: int
    channel_type: str | None
    interface_no: str | None
    interface_url: str | None
    rate_limit: int | None
    cache: float | None
    status: int | None
    last_modify_time: dt.datetime | None = None
    algorithm: str | None = None
    max_permits: int | None = None
    warmup_period: float | None = None
    period_seconds: int | None = None
    per_caller: int | None = None
    shadow: int | None = None
    max_concurrent: int | None = None
    caller_key: str | None = None
    lease_ms: int | None = None
    quota_period: str | None = None
    time_zone: str | None = None
    quota_renews: str | None = None
    quota_pacing: int | None = None
    priority: str | None = None
    reserve: str | None = None


_ROW_FIELDS = {
    "configId": "config_id",
    "channelType": "channel_type",
    "interfaceNo": "interface_no",
    "interfaceUrl": "interface_url",
    "rateLimit": "rate_limit",
    "cache": "cache",
    "status": "status",
    "lastModifyTime": "last_modify_time",
    "algorithm": "algorithm",
    "maxPermits": "max_permits",
    "warmupPeriod": "warmup_period",
    "periodSeconds": "period_seconds",
    "perCaller": "per_caller",
    "shadow": "shadow",
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


#: Columns only people read (``conf list``); the reload leaves them out. (channelType is
#: read: a channel row caps the interfaces whose rows name its channel; interfaceNo is
#: read: the audit records it, and the reload is how a change of it made with plain SQL
#: is found.)
_DISPLAY_ONLY = frozenset({"lastModifyTime"})


def read_rows(engine: Engine, *, display: bool = True) -> list[ConfRow]:
    """Every row of the limits table, in configId order.

    Only the columns the table has are read, so a process running newer code than
    the schema (deployed before ``db upgrade``) still reads its limits; missing
    columns read as NULL, which means today's behaviour. ``display=False`` (the
    reload) also leaves out ``lastModifyTime``, which only people read (a datetime is
    the dearest column to convert); ``interfaceNo`` is read, since the reload is how a
    change of it made with plain SQL is found for the audit.
    """
    with engine.connect() as conn:
        return read_rows_on(conn, display=display)


def read_rows_on(
    conn: Connection,
    *,
    display: bool = True,
    lock: bool = False,
    config_ids: Sequence[int] | None = None,
) -> list[ConfRow]:
    """``read_rows`` on an open connection (inside the caller's transaction).

    ``lock``: a locking read (``SELECT ... FOR UPDATE`` on MySQL/MariaDB), which reads
    the newest committed rows and holds them until the transaction ends; see
    ``lock_table``. ``config_ids``: only those rows.
    """
    t = RateLimitConf.__table__
    present = {c["name"] for c in inspect(conn).get_columns(CONF_TABLE)}
    if not display:
        present -= _DISPLAY_ONLY
    columns = [t.c[name] for name in _ROW_FIELDS if name in present]
    # Values come back raw and are converted one by one below: SQLite keeps whatever
    # it is given ('abc' in cache), and a value the column's type cannot convert
    # must cost its row (rules skips it), not the whole reload.
    raw = [type_coerce(c, NullType()).label(c.name) for c in columns]
    query = select(*raw).order_by(t.c.configId)
    if config_ids is not None:
        query = query.where(t.c.configId.in_(list(config_ids)))
    if lock:
        query = query.with_for_update()
    rows = conn.execute(query).all()
    dialect = conn.dialect
    converters = [c.type.dialect_impl(dialect).result_processor(dialect, None) for c in columns]
    names = [_ROW_FIELDS[c.name] for c in columns]
    unread: dict[str, Any] = {f: None for f in ("channel_type", "interface_no") if f not in names}

    def conf_row(values: Sequence[Any]) -> ConfRow:
        fields = dict(unread)
        for name, convert, value in zip(names, converters, values, strict=True):
            fields[name] = value if convert is None else _converted(convert, value)
        return ConfRow(**fields)

    return [conf_row(r) for r in rows]


def _converted(convert: Callable[[Any], Any], value: Any) -> Any:
    """``value`` as its column's type reads it, or as stored when it cannot be."""
    if value is None:
        return value
    try:
        return convert(value)
    except (ValueError, TypeError, ArithmeticError):
        return value


def read_switch(engine: Engine) -> bool | None:
    """The switch as stored: True/False, or None when it follows the settings default."""
    with engine.connect() as conn:
        value = conn.execute(
            select(LimiterSwitch.enabled).where(LimiterSwitch.switch_id == SWITCH_ROW_ID)
        ).scalar_one_or_none()
    return None if value is None else bool(value)


def write_switch(engine: Engine, enabled: bool | None, by: ChangedBy | None = None) -> None:
    """Store the switch (None: back to the settings default), creating its row if needed.

    ``by``: record the change in the audit table, in the same transaction.
    """
    with Session(engine) as session, session.begin():
        # locked as the audit's recording reads it: what was is what the record says
        row = session.get(LimiterSwitch, SWITCH_ROW_ID, with_for_update=True)
        was = None if row is None else row.enabled
        value = None if enabled is None else int(enabled)
        if row is None:
            session.add(LimiterSwitch(switch_id=SWITCH_ROW_ID, enabled=value))
        else:
            row.enabled = value
        if by is not None and was != value:
            from gateway_limiter.config.audit import (
                record_change,
                record_unrecorded_switch,
                switch_record,
            )

            session.flush()
            record_unrecorded_switch(session.connection(), was, by)
            record_change(
                session.connection(), by, None, "switch", switch_record(was), switch_record(value)
            )


def find_rows(engine: Engine, url: str) -> list[RateLimitConf]:
    """The rows for ``url`` (detached, read-only use), in configId order."""
    with Session(engine, expire_on_commit=False) as session:
        rows = session.scalars(
            select(RateLimitConf)
            .where(RateLimitConf.interface_url == url)
            .order_by(RateLimitConf.config_id)
        ).all()
        session.expunge_all()
    # The database's comparison may ignore case, accents or trailing spaces (a table
    # not yet at revision 0008): a row is the URL it holds, exactly.
    return [r for r in rows if r.interface_url == url]


def lock_table(conn: Connection) -> list[ConfRow]:
    """Every row of the limits table, locked until the caller's transaction ends: what
    each change is checked against (``config.edits``) and what the audit compares.

    MySQL/MariaDB: ``SELECT ... FOR UPDATE`` over the whole table (no index narrows it,
    so InnoDB locks every row and the gaps between them: no row can be changed,
    inserted or deleted by another writer that locks, until this transaction ends).
    SQLite: a write that changes nothing first, which takes the database's write lock
    (a second writer waits, up to the connection's timeout). Readers never wait.
    """
    if conn.dialect.name == "sqlite":
        conn.execute(
            update(RateLimitConf)
            .where(RateLimitConf.config_id.is_(None))
            .values(status=RateLimitConf.status)
        )
    return read_rows_on(conn, lock=True)


@dataclass(slots=True)
class LockedTable:
    """A transaction holding the limits table (``lock_table``): ``rows`` as they are
    now, ``conn`` to write on. Leaving the ``with`` commits; an exception rolls back."""

    conn: Connection
    rows: list[ConfRow]

    def row(self, config_id: int) -> ConfRow | None:
        """The row ``config_id`` as it is now in this transaction (None: there is none)."""
        found = read_rows_on(self.conn, lock=True, config_ids=[config_id])
        return found[0] if found else None

    def insert(self, fields: dict[str, Any]) -> ConfRow:
        """Insert a row with ``fields`` (model attributes); the row as stored."""
        result = self.conn.execute(insert(RateLimitConf).values(**fields))
        key = result.inserted_primary_key
        assert key is not None  # an INSERT of one row
        config_id = int(key[0])
        made = self.row(config_id)
        assert made is not None  # just inserted, in this transaction
        self.rows.append(made)
        return made

    def update(self, config_id: int, fields: dict[str, Any]) -> ConfRow | None:
        """Set ``fields`` (model attributes) on row ``config_id``; the row as stored."""
        if fields:
            self.conn.execute(
                update(RateLimitConf).where(RateLimitConf.config_id == config_id).values(**fields)
            )
        now = self.row(config_id)
        self.rows = [now if r.config_id == config_id and now else r for r in self.rows]
        return now

    def delete(self, config_id: int) -> None:
        """Delete row ``config_id``."""
        self.conn.execute(delete(RateLimitConf).where(RateLimitConf.config_id == config_id))
        self.rows = [r for r in self.rows if r.config_id != config_id]


@contextmanager
def locked_table(engine: Engine) -> Iterator[LockedTable]:
    """One transaction over the locked limits table (``lock_table``): check a change
    against ``rows`` and write it, with its audit rows, before anyone else can."""
    with engine.connect() as conn, conn.begin():
        yield LockedTable(conn, lock_table(conn))


def same_scope(row: ConfRow, where: dict[str, Any]) -> bool:
    """Whether ``row`` has every value ``where`` names (model attribute -> value), each
    compared exactly as Python compares it: the row's identity (docs/design.md)."""
    return all(getattr(row, name) == value for name, value in where.items())


def upsert_conf(
    engine: Engine,
    url: str,
    *,
    where: dict[str, Any] | None = None,
    by: ChangedBy | None = None,
    check: Callable[[list[ConfRow], ConfRow | None], None] | None = None,
    **fields: Any,
) -> tuple[ConfRow, bool]:
    """Update the lowest-configId row for ``url`` with ``fields``, or insert one.

    ``where`` (model attribute -> value) narrows the rows to choose from, e.g. to one
    period and scope, and a row inserted gets those values too. Returns the row and
    whether it was created. One transaction over the locked table: all or nothing, the
    audit rows (``by``) included. The row is found by its exact values, never by the
    database's comparison of text. ``check(rows, row)``, called with the rows as they
    are in that transaction and the row found (None: one is made), raises to refuse.
    """
    # config.edits imports this module: imported here, where it is used, not above.
    from gateway_limiter.config.edits import insert_row, update_row

    where = where or {}
    with locked_table(engine) as table:
        old = next((r for r in table.rows if r.interface_url == url and same_scope(r, where)), None)
        if check is not None:
            check(table.rows, old)
        if old is None:
            fields = {"interface_url": url, "status": 0, **where, **fields}
            return insert_row(table, fields, by), True
        return update_row(table, old, fields, by), False


#: Driver error codes that mean "no such table": MySQL/MariaDB's ER_NO_SUCH_TABLE.
_NO_SUCH_TABLE_CODES = frozenset({1146})


def table_missing(error: BaseException) -> bool:
    """True when ``error`` proves a table does not exist (not a lock, a timeout, a lost
    connection or a permission, which say nothing about the table)."""
    if isinstance(error, NoSuchTableError):
        return True
    orig = error.orig if isinstance(error, DBAPIError) else None
    if orig is None:
        return False
    code = orig.args[0] if orig.args else None
    if isinstance(code, int) and code in _NO_SUCH_TABLE_CODES:
        return True
    if getattr(orig, "pgcode", None) == "42P01":  # PostgreSQL: undefined_table
        return True
    return type(orig).__module__.startswith("sqlite3") and "no such table" in str(orig)


def describe_db_error(error: BaseException) -> str:
    """A one-line, password-free account of a database error."""
    if isinstance(error, NoSuchTableError):
        text = f"NoSuchTableError: table {error} does not exist"
    elif isinstance(error, DBAPIError) and error.orig is not None:
        text = f"{type(error.orig).__name__}: {error.orig}"
    else:
        text = f"{type(error).__name__}: {error}"
    return mask_secrets(text.splitlines()[0] if text else type(error).__name__)
