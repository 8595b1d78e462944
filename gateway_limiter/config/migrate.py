"""Run the Alembic history shipped in the package (works from a wheel, not only a checkout)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from gateway_limiter import migrations  # type: ignore[attr-defined]  # mapped from ./migrations

#: Our own version table, so the limiter can share a database with an application
#: that has its own Alembic history.
VERSION_TABLE = "gateway_limiter_alembic_version"


def alembic_config(engine: Engine) -> Config:
    """An Alembic config pointing at the packaged history and at ``engine``."""
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.attributes["engine"] = engine
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the database behind ``engine`` to ``revision`` (default: the newest)."""
    command.upgrade(alembic_config(engine), revision)


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, or None when it was never migrated."""
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        return ctx.get_current_revision()


def head_revision(engine: Engine) -> str | None:
    """The newest revision the package knows."""
    return ScriptDirectory.from_config(alembic_config(engine)).get_current_head()
