"""Add algorithm, maxPermits, warmupPeriod to t_ratelimite_conf (defaults keep behaviour).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    int11 = sa.Integer().with_variant(mysql.INTEGER(display_width=11), "mysql", "mariadb")
    with op.batch_alter_table("t_ratelimite_conf") as batch:
        batch.add_column(
            sa.Column("algorithm", sa.String(16), nullable=True, server_default="token_bucket")
        )
        batch.add_column(sa.Column("maxPermits", int11, nullable=True))
        batch.add_column(sa.Column("warmupPeriod", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("t_ratelimite_conf") as batch:
        batch.drop_column("warmupPeriod")
        batch.drop_column("maxPermits")
        batch.drop_column("algorithm")
