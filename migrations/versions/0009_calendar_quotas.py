"""Add calendar quotas to t_ratelimite_conf: quotaPeriod, timeZone, quotaRenews, quotaPacing.

- ``quotaPeriod`` (VARCHAR(8) NULL): ``day``, ``week`` or ``month``: ``rateLimit`` is then
  the permits per period of the calendar; NULL: the row counts per ``periodSeconds``.
- ``timeZone`` (VARCHAR(64) NULL): the IANA zone of that calendar; NULL: the
  ``default_time_zone`` setting.
- ``quotaRenews`` (VARCHAR(16) NULL): when the period turns over, in local time
  (``02:00``, ``mon 00:00``, ``15 00:00``); NULL: midnight, Monday, the 1st.
- ``quotaPacing`` (TINYINT(1) NOT NULL DEFAULT 0): 1 spreads what is left over what is
  left of the period.

NULL or 0 by default, so existing rows and INSERTs keep their meaning.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    tinyint1 = sa.SmallInteger().with_variant(mysql.TINYINT(display_width=1), "mysql", "mariadb")
    with op.batch_alter_table("t_ratelimite_conf") as batch:
        batch.add_column(sa.Column("quotaPeriod", sa.String(8), nullable=True))
        batch.add_column(sa.Column("timeZone", sa.String(64), nullable=True))
        batch.add_column(sa.Column("quotaRenews", sa.String(16), nullable=True))
        batch.add_column(sa.Column("quotaPacing", tinyint1, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("t_ratelimite_conf") as batch:
        batch.drop_column("quotaPacing")
        batch.drop_column("quotaRenews")
        batch.drop_column("timeZone")
        batch.drop_column("quotaPeriod")
