"""A MariaDB database whose text columns compare as MariaDB's default collation does
(case, accents and trailing spaces ignored: the schema before revision 0008), or at the
newest revision: whichever it is, every command finds the row that holds the text."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from gateway_limiter.config.migrate import upgrade
from gateway_limiter.config.table import make_engine

#: The revision before the identifying columns compare in binary.
BEFORE_BINARY = "0007"


@pytest.fixture(params=[BEFORE_BINARY, "head"])
def collated_db(request: pytest.FixtureRequest, mariadb_db: str) -> Iterator[tuple[str, Engine]]:
    """MariaDB at revision 0007 with the server's default collation, or at head."""
    engine = make_engine(mariadb_db)
    upgrade(engine, request.param)
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
