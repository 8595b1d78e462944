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


def _stamp_hint() -> str:
    return (
        f"record the revision they match with '{PROG} db stamp REVISION' "
        "(head if made from this release's sql/)"
    )


def cmd_db_upgrade(ctx: Context) -> int:
    """Migrate the database to the newest revision; say from which to which."""
    from sqlalchemy.exc import SQLAlchemyError

    from gateway_limiter.config.migrate import current_revision, head_revision, upgrade
    from gateway_limiter.config.reload import describe_db_error

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
    before = current_revision(engine)
    command.stamp(config, ctx.args.revision)
    ctx.out.line(
        f"{ctx.database}: recorded revision {current_revision(engine)} "
        f"(was {before or 'none'}); no table was changed"
    )
    return 0
