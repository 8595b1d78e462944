"""Add shadow to t_ratelimite_conf: 1 = decide and count, never enforce (default 0).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    tinyint1 = sa.SmallInteger().with_variant(mysql.TINYINT(display_width=1), "mysql", "mariadb")
    with op.batch_alter_table("t_ratelimite_conf") as batch:
        # NOT NULL with a default: existing rows and INSERTs that omit it stay enforced.
        batch.add_column(sa.Column("shadow", tinyint1, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("t_ratelimite_conf") as batch:
        batch.drop_column("shadow")
