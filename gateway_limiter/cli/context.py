"""What a command runs in: its arguments, its output, the settings and the database,
made on first use; and the expected errors, reported as one line.

SQLAlchemy and the limiter are imported where a command first asks for them, so a
command that needs neither (``--help``, ``--version``) never loads them.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from gateway_limiter.cli.output import Output
from gateway_limiter.observe.redact import mask_secrets

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from gateway_limiter.config.audit import ChangedBy
    from gateway_limiter.config.settings import Settings
    from gateway_limiter.limiter import GatewayLimiter

PROG = "gateway-limiter"
#: The command line is not the hot path: give Redis this long before calling it down.
CLI_REDIS_TIMEOUT = 2.0


class CliError(Exception):
    """An expected failure: reported as one line on stderr, exit code ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class UsageError(CliError):
    """Arguments that parse but do not go together, or not with the row they change: a
    command's check after argparse's, so reported as argparse reports a bad argument,
    under the command's name (``gateway-limiter conf set: error: ...``), exit 2."""

    def __init__(self, message: str, command: str) -> None:
        super().__init__(message, code=2)
        self.command = command


def usage_error_line(command: str, message: str) -> None:
    """Report a usage error of ``command`` ("conf set") as one line on stderr, in the
    words argparse's errors use (``_Parser.error``), passwords masked."""
    flat = " ".join(mask_secrets(message).split())
    prog = f"{PROG} {command}"
    print(f"{prog}: error: {flat} (see '{prog} --help')", file=sys.stderr, flush=True)


def error_line(message: str) -> None:
    """Report an error as one line on stderr, passwords masked."""
    flat = " ".join(mask_secrets(message).split())
    print(f"{PROG}: error: {flat}", file=sys.stderr, flush=True)


def warning_line(message: str) -> None:
    """Report a warning as one line on stderr, passwords masked."""
    flat = " ".join(mask_secrets(message).split())
    print(f"{PROG}: warning: {flat}", file=sys.stderr, flush=True)


@dataclass
class Context:
    """Parsed arguments, output, and the settings and engine, made on first use."""

    args: argparse.Namespace
    out: Output
    _settings: Settings | None = None
    _engine: Engine | None = field(default=None, repr=False)

    @property
    def settings(self) -> Settings:
        """Settings: file < environment < --database-url/--redis-url."""
        if self._settings is None:
            from gateway_limiter.config.settings import (
                load_settings,
                unknown_env_message,
                unknown_env_names,
            )

            self._settings = load_settings(
                self.args.settings,
                database_url=self.args.database_url,
                redis_url=self.args.redis_url,
            )
            if not getattr(self.args, "verbose", False):  # --verbose: the library says it
                for name in unknown_env_names(os.environ):
                    warning_line(unknown_env_message(name))
        return self._settings

    @property
    def database(self) -> str:
        """The database URL, masked, for messages."""
        return mask_secrets(self.settings.database_url)

    def engine(self, *, create: bool = False) -> Engine:
        """An engine on the configured database.

        ``create=False`` refuses a SQLite file that does not exist: connecting would
        create an empty one, a side effect of a command that then fails anyway.
        """
        if self._engine is None:
            from gateway_limiter.config.table import make_engine

            url = self.settings.database_url
            if not create:
                require_sqlite_file(url)
            self._engine = make_engine(url)
        return self._engine

    @property
    def database_or_unknown(self) -> str:
        """The masked database URL if settings were loaded (for error messages)."""
        return "?" if self._settings is None else self.database

    def reload_note(self) -> str:
        """When a change written now reaches the gateways."""
        return (
            "gateway processes apply it at their next reload "
            f"(reload_interval = {self.settings.reload_interval:g} s in these settings)"
        )

    def changed_by(self) -> ChangedBy:
        """Who the audit table names for a change this command makes: ``--actor``, else
        ``user@host``; source ``cli``."""
        from gateway_limiter.config.audit import SOURCE_CLI, ChangedBy, local_actor

        return ChangedBy(getattr(self.args, "actor", None) or local_actor(), SOURCE_CLI)

    def close(self) -> None:
        """Release the engine's connections."""
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None


def require_sqlite_file(url: str) -> None:
    """Refuse a SQLite URL whose file does not exist (connecting would create it)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return  # make_engine has accepted it; nothing more to check here
    path = parsed.database
    if parsed.get_backend_name() != "sqlite" or not path or path == ":memory:":
        return
    if parsed.query.get("uri") or path.startswith("file:"):
        return  # SQLite URI filenames: let SQLite decide
    if not Path(path).exists():
        raise CliError(f"database file {path} does not exist; create it with '{PROG} db upgrade'")


# How SQLite, MySQL/MariaDB (1146), PostgreSQL and SQLAlchemy's inspector say a table
# is missing (kept narrow: "database x does not exist" needs another fix than upgrade).
_MISSING_TABLE = re.compile(
    r"no such table|\(1146,|NoSuchTableError|relation \S+ does not exist", re.IGNORECASE
)
# ... and a missing column (a schema older than the code: 1054 on MySQL).
_MISSING_COLUMN = re.compile(r"no such column|\(1054,|unknown column", re.IGNORECASE)


def database_problem(database: str, reason: str) -> str:
    """The one-line message for a database error, with the fix when the schema is behind."""
    if _MISSING_TABLE.search(reason):
        return (
            f"database {database} has no limits tables ({reason}); "
            f"create them with '{PROG} db upgrade'"
        )
    if _MISSING_COLUMN.search(reason):
        return (
            f"database {database} has an older schema than this gateway-limiter ({reason}); "
            f"run '{PROG} db upgrade'"
        )
    return f"database {database}: {reason}"


# --- a limiter for the commands that read live state -------------------------------------


def relaxed(settings: Settings) -> Settings:
    """The settings with Redis timeouts fit for a command line, not for the hot path."""
    return settings.replace(
        redis_timeout=max(settings.redis_timeout, CLI_REDIS_TIMEOUT),
        redis_connect_timeout=max(settings.redis_connect_timeout, CLI_REDIS_TIMEOUT),
    )


def open_limiter(settings: Settings) -> GatewayLimiter:
    """A limiter on ``settings`` (not started), for ``status``, ``serve-metrics`` and the
    demo; a redis_url the backend refuses is bad usage (exit 2), like a bad setting."""
    from gateway_limiter.config.settings import SettingsError
    from gateway_limiter.config.table import DatabaseUrlError
    from gateway_limiter.limiter import GatewayLimiter

    require_sqlite_file(settings.database_url)
    try:
        return GatewayLimiter(settings)
    except (SettingsError, DatabaseUrlError):
        raise
    except ValueError as e:  # a redis_url the backend cannot use (it names the value)
        raise CliError(str(e), code=2) from None


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM stops a long-running command the way Ctrl-C does (cleanly, exit 0)."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only; nothing to install
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
