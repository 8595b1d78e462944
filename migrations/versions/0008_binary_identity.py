"""Compare the text that identifies a row byte for byte: interfaceUrl, channelType and
callerKey get the binary collation of their character set (MySQL/MariaDB).

The limiter matches a call to a row by its exact ``interfaceUrl`` (and a channel cap by
its exact ``channelType``, a named caller by its exact ``callerKey``); MySQL's and
MariaDB's default collations compare text ignoring case, accents and trailing spaces,
so a ``WHERE interfaceUrl = '/api/x'`` written by hand also found ``/API/x``. After this
revision the database tells rows apart as the limiter does. The collation chosen pads
no spaces where the server has one (MariaDB ``<charset>_nopad_bin``, MySQL 8
``utf8mb4_0900_bin``), else ``<charset>_bin``.

Refused, changing nothing, while two rows hold values that differ yet would still
compare equal under the collation chosen (only a padding ``_bin`` collation, and only
for values that differ in trailing spaces); the error lists them by configId. SQLite
already compares text as stored: nothing to do there.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op
from sqlalchemy.dialects import mysql

from gateway_limiter.config.table import (
    IDENTIFYING_COLUMNS,
    binary_collation,
    collation_collisions,
    column_charset,
)

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

TABLE = "t_ratelimite_conf"


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name not in ("mysql", "mariadb"):
        return
    plan = []
    for column, length in IDENTIFYING_COLUMNS.items():
        charset = column_charset(conn, column)
        collation = binary_collation(conn, charset)
        collisions = collation_collisions(conn, column, collation)
        if collisions:
            listed = "; ".join(
                f"configId {a} {va!r} and configId {b} {vb!r}" for a, va, b, vb in collisions
            )
            raise RuntimeError(
                f"{TABLE}.{column} cannot compare byte for byte ({collation}): these rows "
                f"would still be equal to it, yet differ: {listed}. Change or delete one of "
                "each pair, then run the upgrade again"
            )
        plan.append((column, length, charset, collation))
    for column, length, charset, collation in plan:
        op.alter_column(
            TABLE,
            column,
            type_=mysql.VARCHAR(length, charset=charset, collation=collation),
            existing_nullable=True,
        )


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name not in ("mysql", "mariadb"):
        return
    for column, length in IDENTIFYING_COLUMNS.items():
        # the character set's default collation, as before this revision
        op.alter_column(
            TABLE,
            column,
            type_=mysql.VARCHAR(length, charset=column_charset(conn, column)),
            existing_nullable=True,
        )
