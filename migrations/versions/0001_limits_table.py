"""Create t_ratelimite_conf exactly as docs/design.md#the-table describes it (and sql/).

Revision ID: 0001
Revises:
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _on_update_default() -> sa.TextClause:
    if op.get_bind().dialect.name in ("mysql", "mariadb"):
        return sa.text("CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP")
    return sa.text("CURRENT_TIMESTAMP")


def upgrade() -> None:
    int11 = sa.Integer().with_variant(mysql.INTEGER(display_width=11), "mysql", "mariadb")
    float32 = sa.Float().with_variant(mysql.FLOAT(precision=3, scale=2), "mysql", "mariadb")
    tinyint1 = sa.SmallInteger().with_variant(mysql.TINYINT(display_width=1), "mysql", "mariadb")
    op.create_table(
        "t_ratelimite_conf",
        sa.Column("configId", int11, nullable=False, autoincrement=True),
        sa.Column("channelType", sa.String(24), nullable=True),
        sa.Column("interfaceNo", sa.String(24), nullable=True),
        sa.Column("interfaceUrl", sa.String(128), nullable=True),
        sa.Column("rateLimit", int11, nullable=True),
        sa.Column("cache", float32, nullable=True),
        sa.Column("status", tinyint1, nullable=False, server_default="0"),
        sa.Column(
            "lastModifyTime", sa.DateTime(), nullable=True, server_default=_on_update_default()
        ),
        sa.PrimaryKeyConstraint("configId", name="pk_t_ratelimite_conf"),
    )


def downgrade() -> None:
    op.drop_table("t_ratelimite_conf")
