"""The Alembic history creates the tables of docs/design.md ("The table"), on MariaDB and SQLite.

On MariaDB the migrated schema is compared, column by column as information_schema
reports it, with the schema ``sql/t_ratelimite_conf.sql`` creates, and with the contract
written out below (later columns may follow it, with defaults); the model in
``gateway_limiter.table`` is compared by Alembic's autogenerate, so the descriptions of
the table cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pymysql
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, inspect, text

from gateway_limiter.config.migrate import (
    VERSION_TABLE,
    alembic_config,
    current_revision,
    head_revision,
    upgrade,
)
from gateway_limiter.config.table import (
    AUDIT_TABLE,
    CONF_TABLE,
    QUOTA_TABLE,
    SWITCH_TABLE,
    Base,
    make_engine,
)
from tests.support.services import (
    MARIADB_HOST,
    MARIADB_PORT,
    MARIADB_USER,
    fresh_mariadb_database,
    run_ddl_file,
)

#: The contract table (docs/design.md, "The table") as MariaDB reports it: (name,
#: COLUMN_TYPE, IS_NULLABLE, COLUMN_DEFAULT, EXTRA, COLUMN_KEY), in ordinal order.
CONTRACT_COLUMNS = [
    ("configId", "int(11)", "NO", None, "auto_increment", "PRI"),
    ("channelType", "varchar(24)", "YES", "NULL", "", ""),
    ("interfaceNo", "varchar(24)", "YES", "NULL", "", ""),
    ("interfaceUrl", "varchar(128)", "YES", "NULL", "", ""),
    ("rateLimit", "int(11)", "YES", "NULL", "", ""),
    ("cache", "float(3,2)", "YES", "NULL", "", ""),
    ("status", "tinyint(1)", "NO", "0", "", ""),
    (
        "lastModifyTime",
        "datetime",
        "YES",
        "current_timestamp()",
        "on update current_timestamp()",
        "",
    ),
]


@pytest.fixture
def engine(any_db: str) -> Iterator[Engine]:
    """An engine on an empty database (MariaDB, then SQLite)."""
    engine = make_engine(any_db)
    yield engine
    engine.dispose()


@pytest.fixture
def mariadb_engine(mariadb_db: str) -> Iterator[Engine]:
    """An engine on an empty MariaDB database."""
    engine = make_engine(mariadb_db)
    yield engine
    engine.dispose()


def _information_schema_columns(database: str) -> dict[str, list[tuple[Any, ...]]]:
    """Each table's columns, as information_schema.COLUMNS reports them."""
    conn = pymysql.connect(
        host=MARIADB_HOST, port=MARIADB_PORT, user=MARIADB_USER, password="", connect_timeout=3
    )
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT TABLE_NAME, ORDINAL_POSITION, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE,"
                " COLUMN_DEFAULT, EXTRA, COLUMN_KEY, COLLATION_NAME FROM information_schema.COLUMNS"
                " WHERE TABLE_SCHEMA = %s ORDER BY TABLE_NAME, ORDINAL_POSITION",
                (database,),
            )
            rows = cur.fetchall()
    finally:
        conn.close()
    tables: dict[str, list[tuple[Any, ...]]] = {}
    for table, position, *column in rows:
        tables.setdefault(table, []).append((position, *column))
    return tables


def _schema(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's columns as SQLAlchemy reflects them (name, type, nullable, default)."""
    inspector = inspect(engine)
    return {
        table: [
            (c["name"], str(c["type"]), c["nullable"], c.get("default"))
            for c in inspector.get_columns(table)
        ]
        for table in sorted(inspector.get_table_names())
    }


def test_upgrade_from_empty_creates_the_tables_and_records_head_in_own_version_table(
    engine: Engine,
) -> None:
    assert current_revision(engine) is None

    upgrade(engine)

    assert set(inspect(engine).get_table_names()) == {
        CONF_TABLE,
        SWITCH_TABLE,
        AUDIT_TABLE,
        QUOTA_TABLE,
        VERSION_TABLE,
    }
    assert VERSION_TABLE == "gateway_limiter_alembic_version"
    assert current_revision(engine) == head_revision(engine)
    assert head_revision(engine) is not None


def test_switch_table_starts_with_one_row_that_follows_the_settings(engine: Engine) -> None:
    upgrade(engine)

    with engine.connect() as conn:
        rows = conn.execute(text(f"SELECT switchId, enabled FROM {SWITCH_TABLE}")).all()
    assert [tuple(r) for r in rows] == [(1, None)]


def test_upgrading_twice_changes_nothing(engine: Engine) -> None:
    upgrade(engine)
    with engine.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO {CONF_TABLE} (interfaceUrl, rateLimit, cache, status)"
                " VALUES ('/ibe/flight/search', 20, 0.5, 1)"
            )
        )
        conn.execute(text(f"UPDATE {SWITCH_TABLE} SET enabled = 0 WHERE switchId = 1"))
    schema_before = _schema(engine)
    revision_before = current_revision(engine)

    upgrade(engine)

    assert _schema(engine) == schema_before
    assert current_revision(engine) == revision_before
    with engine.connect() as conn:
        limits = conn.execute(text(f"SELECT interfaceUrl, rateLimit FROM {CONF_TABLE}")).all()
        switch = conn.execute(text(f"SELECT switchId, enabled FROM {SWITCH_TABLE}")).all()
    assert [tuple(r) for r in limits] == [("/ibe/flight/search", 20)]
    assert [tuple(r) for r in switch] == [(1, 0)]


def test_downgrade_to_base_removes_every_table(engine: Engine) -> None:
    upgrade(engine)

    command.downgrade(alembic_config(engine), "base")

    assert set(inspect(engine).get_table_names()) <= {VERSION_TABLE}
    assert current_revision(engine) is None


def test_migrated_mariadb_table_starts_with_exactly_the_contract_columns(
    mariadb_db: str,
) -> None:
    engine = make_engine(mariadb_db)
    try:
        upgrade(engine)
    finally:
        engine.dispose()
    database = mariadb_db.rsplit("/", 1)[1]

    columns = _information_schema_columns(database)[CONF_TABLE]

    contract = columns[: len(CONTRACT_COLUMNS)]
    assert [c[1:-1] for c in contract] == CONTRACT_COLUMNS
    # The text that identifies a row compares byte for byte, as the limiter compares it.
    collations = {c[1]: c[-1] for c in columns}
    for name in ("interfaceUrl", "channelType", "callerKey"):
        assert collations[name] == "utf8mb4_nopad_bin", name
    assert collations["interfaceNo"] != "utf8mb4_nopad_bin"
    assert [c[0] for c in contract] == list(range(1, len(CONTRACT_COLUMNS) + 1))
    # Later columns come after the contract's and have a default (NULL counts), so an
    # INSERT written against the first revision of the table keeps working.
    later = {c[1]: c[4] for c in columns[len(CONTRACT_COLUMNS) :]}
    assert None not in later.values(), later


def test_insert_naming_only_contract_columns_works_after_every_migration(
    engine: Engine,
) -> None:
    upgrade(engine)
    names = ", ".join(c[0] for c in CONTRACT_COLUMNS[1:-1])

    with engine.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO {CONF_TABLE} ({names})"
                " VALUES ('IBE+', 'IF01', '/ibe/flight/search', 20, 0.5, 1)"
            )
        )
        row = conn.execute(text(f"SELECT * FROM {CONF_TABLE}")).mappings().one()

    assert row["configId"] == 1
    assert row["interfaceUrl"] == "/ibe/flight/search"
    assert row["cache"] == pytest.approx(0.5)
    assert row["lastModifyTime"] is not None


def test_migrations_and_sql_ddl_create_the_same_columns_on_mariadb(mariadb_db: str) -> None:
    engine = make_engine(mariadb_db)
    try:
        upgrade(engine)
    finally:
        engine.dispose()
    migrated = _information_schema_columns(mariadb_db.rsplit("/", 1)[1])

    with fresh_mariadb_database() as ddl_database:
        run_ddl_file(ddl_database)
        from_ddl = _information_schema_columns(ddl_database)

    assert set(from_ddl) == {CONF_TABLE, SWITCH_TABLE, AUDIT_TABLE, QUOTA_TABLE}
    for table in (CONF_TABLE, SWITCH_TABLE, AUDIT_TABLE, QUOTA_TABLE):
        assert migrated[table] == from_ddl[table], table


def test_sql_ddl_also_creates_the_switch_row(mariadb_db: str) -> None:
    database = mariadb_db.rsplit("/", 1)[1]
    run_ddl_file(database)

    engine = make_engine(mariadb_db)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(f"SELECT switchId, enabled FROM {SWITCH_TABLE}")).all()
    finally:
        engine.dispose()
    assert [tuple(r) for r in rows] == [(1, None)]


def test_model_matches_migrated_schema(engine: Engine) -> None:
    upgrade(engine)

    # Types and server defaults too; autogenerate leaves out the version table itself.

    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn,
            opts={
                "version_table": VERSION_TABLE,
                "compare_type": True,
                "compare_server_default": True,
            },
        )
        differences = compare_metadata(context, Base.metadata)

    assert differences == []


def test_sqlite_columns_have_the_contract_nullability_and_key(sqlite_db: str) -> None:
    engine = make_engine(sqlite_db)
    try:
        upgrade(engine)
        inspector = inspect(engine)
        conf = {c["name"]: c for c in inspector.get_columns(CONF_TABLE)}
        conf_key = inspector.get_pk_constraint(CONF_TABLE)["constrained_columns"]
        switch = {c["name"]: c for c in inspector.get_columns(SWITCH_TABLE)}
    finally:
        engine.dispose()

    assert list(conf)[: len(CONTRACT_COLUMNS)] == [c[0] for c in CONTRACT_COLUMNS]
    assert {name: conf[name]["nullable"] for name, *_ in CONTRACT_COLUMNS} == {
        name: is_nullable == "YES" for name, _, is_nullable, *_ in CONTRACT_COLUMNS
    }
    assert conf_key == ["configId"]
    assert conf["status"]["default"] == "'0'"
    assert list(switch) == ["switchId", "enabled", "lastModifyTime"]
    assert [switch[n]["nullable"] for n in switch] == [False, True, True]


@pytest.mark.parametrize(
    ("table", "key", "change"),
    [
        (CONF_TABLE, "configId", "status = 1"),
        (SWITCH_TABLE, "switchId", "enabled = 0"),
    ],
)
def test_mariadb_stamps_last_modify_time_on_every_update(
    mariadb_engine: Engine, table: str, key: str, change: str
) -> None:
    upgrade(mariadb_engine)
    with mariadb_engine.begin() as conn:
        if table == CONF_TABLE:
            conn.execute(text(f"INSERT INTO {CONF_TABLE} (interfaceUrl) VALUES ('/x')"))
        # Setting the column explicitly suppresses the automatic stamp: an old known value.
        conn.execute(text(f"UPDATE {table} SET lastModifyTime = '2000-01-01 00:00:00'"))
        stamped = conn.execute(text(f"SELECT lastModifyTime FROM {table}")).scalar_one()
        assert stamped.year == 2000

    # A plain SQL UPDATE, as operators run it: only the server can stamp the time.
    with mariadb_engine.begin() as conn:
        conn.execute(text(f"UPDATE {table} SET {change} WHERE {key} = 1"))
        changed, now = conn.execute(text(f"SELECT lastModifyTime, NOW() FROM {table}")).one()

    assert changed.year > 2000
    assert abs((now - changed).total_seconds()) < 60
