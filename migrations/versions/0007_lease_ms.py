"""Add leaseMs to t_ratelimite_conf.

- ``leaseMs`` (INT NULL): the milliseconds of the rate one process may take in one
  round trip and spend in-process (docs/algorithms.md, "Leases"); NULL or 0: no lease,
  every call decided in Redis as before.

NULL by default, so existing rows and INSERTs keep their meaning.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    int11 = sa.Integer().with_variant(mysql.INTEGER(display_width=11), "mysql", "mariadb")
    with op.batch_alter_table("t_ratelimite_conf") as batch:
        batch.add_column(sa.Column("leaseMs", int11, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("t_ratelimite_conf") as batch:
        batch.drop_column("leaseMs")
