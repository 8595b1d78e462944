"""Add t_ratelimite_quota: calendar quotas' counters, checkpointed.

One row per calendar quota counter (``quotaPeriod`` rows; per caller where the row is
per caller), written at most every ``quota_checkpoint_s`` by the one process holding the
counter's lock, so that a Redis that comes back without the counter (a restart, a
failover that lost writes, an eviction) resumes from it:

- ``counterId`` (VARCHAR(40), primary key): the SHA1 of ``counterKey``, exact whatever
  the collation;
- ``counterKey`` (VARCHAR(512)): the counter's Redis key;
- ``periodStart`` (BIGINT): the start of the period it counts, epoch microseconds;
- ``used`` (BIGINT): the permits counted in that period;
- ``savedAt`` (datetime): when the row was written.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "t_ratelimite_quota",
        sa.Column("counterId", sa.String(40), nullable=False),
        sa.Column("counterKey", sa.String(512), nullable=False),
        sa.Column("periodStart", sa.BigInteger(), nullable=False),
        sa.Column("used", sa.BigInteger(), nullable=False),
        sa.Column(
            "savedAt", sa.DateTime(), nullable=False, server_default=sa.func.current_timestamp()
        ),
        sa.PrimaryKeyConstraint("counterId"),
    )


def downgrade() -> None:
    op.drop_table("t_ratelimite_quota")
