"""Add priority classes to t_ratelimite_conf: priority and reserve.

- ``priority`` (VARCHAR(16) NULL): the class of calls to the row's interface when the
  call names none (``critical``, ``default``, ``sheddable_plus``, ``sheddable``); NULL:
  ``default``.
- ``reserve`` (VARCHAR(128) NULL), on a rate row or a channel row: the share of the
  limit's capacity each class below ``critical`` must leave for the classes above it,
  written ``default=0.1,sheddable_plus=0.3,sheddable=0.5``; NULL: no reserve.

NULL by default, so existing rows and INSERTs keep their meaning.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("t_ratelimite_conf") as batch:
        batch.add_column(sa.Column("priority", sa.String(16), nullable=True))
        batch.add_column(sa.Column("reserve", sa.String(128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("t_ratelimite_conf") as batch:
        batch.drop_column("reserve")
        batch.drop_column("priority")
