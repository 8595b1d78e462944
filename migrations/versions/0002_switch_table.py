"""Add t_ratelimite_switch: the global switch, one row, NULL = the settings default.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    int11 = sa.Integer().with_variant(mysql.INTEGER(display_width=11), "mysql", "mariadb")
    tinyint1 = sa.SmallInteger().with_variant(mysql.TINYINT(display_width=1), "mysql", "mariadb")
    on_update = (
        sa.text("CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP")
        if op.get_bind().dialect.name in ("mysql", "mariadb")
        else sa.text("CURRENT_TIMESTAMP")
    )
    switch = op.create_table(
        "t_ratelimite_switch",
        sa.Column("switchId", int11, nullable=False, autoincrement=False),
        sa.Column("enabled", tinyint1, nullable=True),
        sa.Column("lastModifyTime", sa.DateTime(), nullable=True, server_default=on_update),
        sa.PrimaryKeyConstraint("switchId", name="pk_t_ratelimite_switch"),
    )
    # The one row exists from the start, so operators flip it with a plain UPDATE.
    op.bulk_insert(switch, [{"switchId": 1, "enabled": None}])


def downgrade() -> None:
    op.drop_table("t_ratelimite_switch")
