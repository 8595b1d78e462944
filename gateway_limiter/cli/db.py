"""``gateway-limiter db upgrade|current|stamp``: the database schema, through Alembic."""

from __future__ import annotations

import argparse

from gateway_limiter.cli.arguments import leaf
from gateway_limiter.cli.context import PROG, CliError, Context


def register(parser: argparse.ArgumentParser) -> None:
    """Add the ``db`` commands to ``parser``."""
    db = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    leaf(db, "upgrade", cmd_db_upgrade, "migrate the database to the newest revision")
    leaf(db, "current", cmd_db_current, "show the database's revision and the newest one")
    stamp = leaf(
        db, "stamp", cmd_db_stamp, "record a revision without migrating (tables made from sql/)"
    )
    stamp.add_argument("revision", metavar="REVISION", help="e.g. head")
    leaf(
        db,
        "check",
        cmd_db_check,
        "report rows told apart only by case, accents or trailing spaces (exit 1 if any)",
    )


def _stamp_hint() -> str:
    return (
        f"record the revision they match with '{PROG} db stamp REVISION' "
        "(head if made from this release's sql/)"
    )


def cmd_db_upgrade(ctx: Context) -> int:
    """Migrate the database to the newest revision; say from which to which."""
    from sqlalchemy.exc import SQLAlchemyError

    from gateway_limiter.config.migrate import current_revision, head_revision, upgrade
    from gateway_limiter.config.table import describe_db_error

    engine = ctx.engine(create=True)
    before = current_revision(engine)
    head = head_revision(engine)
    if before == head:
        ctx.out.line(f"{ctx.database} is already at revision {head} (head); nothing to do")
        return 0
    try:
        upgrade(engine)
    except SQLAlchemyError as e:
        reason = describe_db_error(e)
        if before is None and "already exists" in reason:
            raise CliError(
                f"database {ctx.database}: {reason}; the tables exist but no revision is "
                f"recorded (made from sql/?): {_stamp_hint()}"
            ) from None
        raise
    after = current_revision(engine)
    ctx.out.line(
        f"upgraded {ctx.database} from {before or 'an empty schema (no revision)'} "
        f"to revision {after} (head)"
    )
    return 0


def cmd_db_current(ctx: Context) -> int:
    """Print the database's revision and the newest one this package knows."""
    from sqlalchemy import inspect

    from gateway_limiter.config.migrate import current_revision, head_revision
    from gateway_limiter.config.table import CONF_TABLE

    engine = ctx.engine()
    current = current_revision(engine)
    head = head_revision(engine)
    if current is None and inspect(engine).has_table(CONF_TABLE):
        # Tables made by hand from sql/: 'db upgrade' would fail creating them again.
        ctx.out.line(
            f"{ctx.database}: no revision recorded, but {CONF_TABLE} exists (made from "
            f"sql/?); head is {head}: {_stamp_hint()}"
        )
    elif current is None:
        ctx.out.line(
            f"{ctx.database}: no revision (never migrated); head is {head}: run '{PROG} db upgrade'"
        )
    elif current == head:
        ctx.out.line(f"{ctx.database}: revision {current} (head, up to date)")
    else:
        ctx.out.line(f"{ctx.database}: revision {current}, head is {head}: run '{PROG} db upgrade'")
    return 0


def cmd_db_stamp(ctx: Context) -> int:
    """Record a revision without running migrations (tables made from sql/ by hand)."""
    from alembic import command
    from alembic.script import ScriptDirectory

    from gateway_limiter.config.migrate import alembic_config, current_revision

    engine = ctx.engine()
    config = alembic_config(engine)
    known = [s.revision for s in ScriptDirectory.from_config(config).walk_revisions()]
    if ctx.args.revision not in ("head", "base", *known):
        raise CliError(
            f"db stamp: unknown revision {ctx.args.revision!r} "
            f"(known: head, base, {', '.join(sorted(known))})",
            code=2,
        )
    from sqlalchemy import inspect

    from gateway_limiter.config.table import CONF_TABLE

    if ctx.args.revision != "base" and not inspect(engine).has_table(CONF_TABLE):
        # a revision recorded over no tables: 'db upgrade' would then find nothing to do
        raise CliError(
            f"db stamp: {ctx.database} has no {CONF_TABLE}; nothing recorded. Create the "
            f"tables with '{PROG} db upgrade' (or from sql/, then stamp the revision they "
            "match)"
        )
    before = current_revision(engine)
    command.stamp(config, ctx.args.revision)
    ctx.out.line(
        f"{ctx.database}: recorded revision {current_revision(engine)} "
        f"(was {before or 'none'}); no table was changed"
    )
    return 0


def cmd_db_check(ctx: Context) -> int:
    """Report twins: rows whose identifying text (interfaceUrl, channelType, callerKey)
    differs only in case, accents or trailing spaces, each naming both configIds; and,
    on MySQL/MariaDB, whether those columns compare byte for byte (revision 0008). Exit
    1 when there are twins: the limiter treats each pair as two rows, a query written by
    hand under the default collation as one."""
    from sqlalchemy import inspect

    from gateway_limiter.config.rules import twin_warnings
    from gateway_limiter.config.table import CONF_TABLE, IDENTIFYING_COLUMNS, read_rows

    engine = ctx.engine()
    if not inspect(engine).has_table(CONF_TABLE):
        raise CliError(f"{ctx.database} has no {CONF_TABLE}: run '{PROG} db upgrade'")
    if engine.dialect.name in ("mysql", "mariadb"):
        from sqlalchemy import text

        with engine.connect() as conn:
            found = conn.execute(
                text(
                    "SELECT COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
                    "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = :t"
                ),
                {"t": CONF_TABLE},
            ).all()
        collations = {str(name): str(collation) for name, collation in found}
        folding = [c for c in IDENTIFYING_COLUMNS if not collations.get(c, "").endswith("bin")]
        if folding:
            ctx.out.line(
                f"{', '.join(folding)} compare text ignoring case or accents "
                f"({collations[folding[0]]}): '{PROG} db upgrade' makes them compare byte "
                "for byte, as the limiter does"
            )
    twins = twin_warnings(read_rows(engine))
    for twin in twins:
        ctx.out.line(f"twins: {twin}")
    if not twins:
        ctx.out.line(f"{ctx.database}: no rows told apart only by case, accents or spaces")
        return 0
    return 1
