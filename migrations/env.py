"""Alembic environment: online only, with the engine handed in by gateway_limiter.migrate."""

from __future__ import annotations

from alembic import context

from gateway_limiter.config.migrate import VERSION_TABLE
from gateway_limiter.config.table import Base

config = context.config
engine = config.attributes["engine"]

with engine.begin() as connection:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()
