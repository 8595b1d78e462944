"""Add periodSeconds and perCaller to t_ratelimite_conf (defaults keep behaviour).

``periodSeconds``: rateLimit permits per this many seconds (1: per second, as before).
``perCaller``: 1 gives each caller key its own bucket with the row's limits.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    int11 = sa.Integer().with_variant(mysql.INTEGER(display_width=11), "mysql", "mariadb")
    tinyint1 = sa.SmallInteger().with_variant(mysql.TINYINT(display_width=1), "mysql", "mariadb")
    # NOT NULL with a server default: existing rows read 1 and 0, today's meaning, and
    # an INSERT that names only older columns keeps working.
    with op.batch_alter_table("t_ratelimite_conf") as batch:
        batch.add_column(sa.Column("periodSeconds", int11, nullable=False, server_default="1"))
        batch.add_column(sa.Column("perCaller", tinyint1, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("t_ratelimite_conf") as batch:
        batch.drop_column("perCaller")
        batch.drop_column("periodSeconds")
