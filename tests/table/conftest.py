"""A MariaDB database whose text columns compare as MariaDB's default collation does
(case, accents and trailing spaces ignored: the schema before revision 0008), or at the
newest revision: whichever it is, every command finds the row that holds the text."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from gateway_limiter.config.migrate import upgrade
from gateway_limiter.config.table import make_engine

#: The revision before the identifying columns compare in binary.
BEFORE_BINARY = "0007"


@pytest.fixture(params=[BEFORE_BINARY, "head"])
def collated_db(request: pytest.FixtureRequest, mariadb_db: str) -> Iterator[tuple[str, Engine]]:
    """MariaDB at head, with the identifying columns in the folding collation they had
    before revision 0008, or as head makes them."""
    engine = make_engine(mariadb_db)
    upgrade(engine)
    if request.param == BEFORE_BINARY:
        # The identifying columns as they were before revision 0008 (the server's
        # folding collation), on a table that has every later column the code writes.
        with engine.begin() as conn:
            conn.execute(
                text(
                    "alter table t_ratelimite_conf"
                    " modify interfaceUrl VARCHAR(128) CHARACTER SET utf8mb4"
                    " COLLATE utf8mb4_general_ci NULL,"
                    " modify channelType VARCHAR(24) CHARACTER SET utf8mb4"
                    " COLLATE utf8mb4_general_ci NULL,"
                    " modify callerKey VARCHAR(64) CHARACTER SET utf8mb4"
                    " COLLATE utf8mb4_general_ci NULL"
                )
            )
    with engine.connect() as conn:
        collation = conn.execute(
            text(
                "select COLLATION_NAME from information_schema.COLUMNS where "
                "TABLE_SCHEMA = database() and TABLE_NAME = 't_ratelimite_conf' "
                "and COLUMN_NAME = 'interfaceUrl'"
            )
        ).scalar_one()
    assert collation.endswith("_ci") == (request.param == BEFORE_BINARY), collation
    yield mariadb_db, engine
    engine.dispose()


def wait_for_lock_wait(engine: Engine, database: str, done: threading.Event) -> bool:
    """Wait until a session of ``database`` waits for a row lock (True), or ``done`` is
    set first (False): what a writer that checks on a locked read does while another
    transaction holds the row. Polls information_schema, which is all it can tell."""
    query = text(
        "select count(*) from information_schema.INNODB_TRX t join "
        "information_schema.PROCESSLIST p on p.ID = t.trx_mysql_thread_id "
        "where t.trx_state = 'LOCK WAIT' and p.DB = :db"
    )
    deadline = time.monotonic() + 30
    with engine.connect() as conn:
        while time.monotonic() < deadline:
            if conn.execute(query, {"db": database}).scalar_one():
                return True
            conn.commit()
            # InnoDB refreshes what INNODB_TRX shows only once it has not been read for
            # 0.1 s: asking more often would keep showing the first answer
            if done.wait(0.25):
                return False
    raise AssertionError("nobody waited for the lock within 30 s")
