"""Add maxConcurrent and callerKey to t_ratelimite_conf, and the audit table.

- ``maxConcurrent`` (INT NULL): at most that many calls in flight to the interface
  across the fleet; NULL means no concurrency limit.
- ``callerKey`` (VARCHAR(64) NULL): a per-caller row that names a caller applies to
  that caller alone, instead of the per-caller row that names none.
- ``t_ratelimite_audit``: one row per change of a limit or of the switch, made through
  the command line or the console, or found by the reload after plain SQL.

Both columns are NULL by default, so existing rows and INSERTs keep their meaning.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    int11 = sa.Integer().with_variant(mysql.INTEGER(display_width=11), "mysql", "mariadb")
    with op.batch_alter_table("t_ratelimite_conf") as batch:
        batch.add_column(sa.Column("maxConcurrent", int11, nullable=True))
        batch.add_column(sa.Column("callerKey", sa.String(64), nullable=True))
    op.create_table(
        "t_ratelimite_audit",
        sa.Column(
            "auditId",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
        ),
        sa.Column(
            "changedAt",
            sa.DateTime(),
            nullable=False,
            server_default=sa.text("CURRENT_TIMESTAMP"),
        ),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("configId", int11, nullable=True),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("beforeRow", sa.Text(), nullable=True),
        sa.Column("afterRow", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("auditId", name="pk_t_ratelimite_audit"),
    )
    op.create_index("ix_t_ratelimite_audit_changedAt", "t_ratelimite_audit", ["changedAt"])


def downgrade() -> None:
    op.drop_index("ix_t_ratelimite_audit_changedAt", table_name="t_ratelimite_audit")
    op.drop_table("t_ratelimite_audit")
    with op.batch_alter_table("t_ratelimite_conf") as batch:
        batch.drop_column("callerKey")
        batch.drop_column("maxConcurrent")
