"""The ``gateway-limiter`` command line (also ``python -m gateway_limiter``): the limits
table, the global switch, live bucket state, a demo.

Every command runs through ``main(argv) -> int``: 0 on success, 2 on bad usage (argparse,
bad settings, and values checked before anything is written), 1 on any other error. An
expected error (an unreachable database, a missing table) is one line on stderr with
passwords masked; only a bug shows a traceback.

Output goes through rich: tables on a terminal, plain aligned text when piped (no ANSI
codes, no wrapping at 80 columns), so ``gateway-limiter conf list | grep`` works.

Each command lives in a module of its own (``db``, ``conf``, ``switch``, ``status``,
``fleet``, ``metrics``, ``demo``, ``console``, ``rls``) that adds its arguments to the
parser and runs it. A module is imported only when its command is on the command
line, and SQLAlchemy, Alembic, redis and rich only where a command needs them:
``--help`` and ``--version`` load none of them.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, NoReturn

from gateway_limiter.cli.arguments import Command, global_options
from gateway_limiter.cli.context import (
    PROG,
    CliError,
    Context,
    UsageError,
    database_problem,
    error_line,
    usage_error_line,
)
from gateway_limiter.cli.output import Output
from gateway_limiter.observe.redact import mask_secrets

__all__ = ["EXIT_FAILURE", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "build_parser", "main"]

#: Exit status: done.
EXIT_OK = 0
#: Exit status: a failure (the database or Redis unreachable, a missing table...).
EXIT_FAILURE = 1
#: Exit status: bad usage: a bad argument, option or setting; nothing was written.
EXIT_USAGE = 2
#: Exit status: interrupted by Ctrl-C (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130

#: Loggers kept quiet unless --verbose: the CLI reports what matters itself, once.
QUIET_LOGGERS = ("gateway_limiter", "apscheduler")


@dataclass(frozen=True, slots=True)
class CommandEntry:
    """A command as ``--help`` lists it, and the module (in this package) that adds its
    arguments with ``register(parser)`` when it is used."""

    name: str
    module: str
    help: str
    group: bool = False  # a group of commands (``db upgrade``), not a command itself


COMMANDS = (
    CommandEntry("db", "db", "database schema (Alembic)", group=True),
    # The table's name is written out rather than imported from config.table, which
    # loads SQLAlchemy; a test checks that the two agree.
    CommandEntry("conf", "conf", "rows of t_ratelimite_conf", group=True),
    CommandEntry(
        "switch", "switch", "the global switch: on, off, default (follow the settings), or status"
    ),
    CommandEntry("status", "status", "rules in force and live bucket state"),
    CommandEntry("fleet", "fleet", "the live gateway processes sharing the rules"),
    CommandEntry(
        "serve-metrics",
        "metrics",
        "serve Prometheus metrics (rules, switch, reloads, live buckets) over HTTP",
    ),
    CommandEntry(
        "demo", "demo", "live demo on a temporary SQLite file and memory:// (no servers needed)"
    ),
    CommandEntry("audit", "audit", "the latest changes of the limits and the switch, and who"),
    CommandEntry(
        "console", "console", "serve the operator console: rules, switch, fleet, live, audit"
    ),
    CommandEntry("rls", "rls", "serve Envoy's rate limit service (gRPC) from the same table"),
)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors; the usage text is a ``--help`` away."""

    def __init__(self, *args: Any, module: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._module = module

    def load(self) -> None:
        """Let the command's module add its arguments (once; nothing to do for others)."""
        if self._module is not None:
            name, self._module = self._module, None
            importlib.import_module(f"{__name__}.{name}").register(self)

    def error(self, message: str) -> NoReturn:
        """Print one line and exit 2 (the message quotes arguments: passwords masked,
        newlines in them flattened)."""
        flat = " ".join(mask_secrets(message).split())
        self.exit(EXIT_USAGE, f"{self.prog}: error: {flat} (see '{self.prog} --help')\n")


class _Commands(argparse._SubParsersAction):  # type: ignore[type-arg]
    """The command positional: loads the chosen command's module before argparse hands
    it the rest of the command line (the others are never imported)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        chosen = self.choices.get(values[0]) if isinstance(values, list) and values else None
        if isinstance(chosen, _Parser):
            chosen.load()
        super().__call__(parser, namespace, values, option_string)


class _Version(argparse.Action):
    """``--version``: the installed distribution's version, looked up only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(
            option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=help
        )

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        print(f"{PROG} {version()}", file=sys.stdout, flush=True)
        parser.exit(EXIT_OK)


def version() -> str:
    """The version installed (package metadata), else the one the source declares."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("gateway-limiter")
    except PackageNotFoundError:  # run from a checkout that was never installed
        import gateway_limiter

        return gateway_limiter.__version__


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``gateway-limiter``; a command's own arguments are added
    when it is parsed (``register`` in its module)."""
    parser = _Parser(
        prog=PROG,
        description="Manage gateway-limiter: the limits table, the global switch, live state.",
        epilog=f"Start with '{PROG} demo' (no servers needed).",
    )
    parser.add_argument("--version", action=_Version, help="show the version and exit")
    global_options(parser, top=True)
    parser.register("action", "parsers", _Commands)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for entry in COMMANDS:
        # A group's own description is its list of commands; a command repeats its help.
        description = None if entry.group else entry.help
        commands.add_parser(
            entry.name, help=entry.help, description=description, module=entry.module
        )
    return parser


@contextmanager
def _library_logging(verbose: bool) -> Iterator[None]:
    """Quiet the library's logs (the CLI reports what matters), or show them with -v."""
    saved = [(logging.getLogger(n), logging.getLogger(n).level) for n in QUIET_LOGGERS]
    handler: logging.Handler | None = None
    lib = logging.getLogger(QUIET_LOGGERS[0])
    if verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"{PROG}: %(levelname)s: %(message)s"))
        lib.addHandler(handler)
        lib.setLevel(logging.INFO)
    else:
        for logger, _ in saved:
            logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        if handler is not None:
            lib.removeHandler(handler)
        for logger, level in saved:
            logger.setLevel(level)


def _expected_failure(ctx: Context, error: Exception) -> tuple[str, int] | None:
    """The one-line message and exit status for an error the CLI expects ("a bad
    setting", "the database is down"), or None for a bug (shown with its traceback).

    An error can only be SQLAlchemy's, Alembic's or a backend's if that module was
    loaded: the checks import nothing new.
    """
    from gateway_limiter.config.settings import SettingsError

    loaded = sys.modules
    if isinstance(error, SettingsError):
        return str(error), EXIT_USAGE
    if "gateway_limiter.config.table" in loaded:
        from gateway_limiter.config.table import DatabaseUrlError

        if isinstance(error, DatabaseUrlError):  # database_url is a setting too
            return str(error), EXIT_USAGE
    if "gateway_limiter.backends.base" in loaded:
        from gateway_limiter.backends.base import BackendError

        if isinstance(error, BackendError):  # demo --redis-url with a Redis that is down
            return f"redis {mask_secrets(ctx.args.redis_url or '')}: {error}", EXIT_FAILURE
    if "sqlalchemy" in loaded:
        from sqlalchemy.exc import SQLAlchemyError

        from gateway_limiter.config.table import describe_db_error

        if isinstance(error, SQLAlchemyError):
            return database_problem(ctx.database_or_unknown, describe_db_error(error)), EXIT_FAILURE
    if "alembic" in loaded:
        from alembic.util import CommandError

        if isinstance(error, CommandError):  # e.g. a revision it does not know
            return f"database {ctx.database}: {error}", EXIT_FAILURE
    return None


def main(argv: list[str] | None = None) -> int:
    """Run ``gateway-limiter`` with ``argv`` (default: sys.argv[1:]); return the exit code."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version (0) or bad usage (2): argparse has printed it
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    ctx = Context(args=args, out=Output())
    run: Command = args.run
    try:
        with _library_logging(args.verbose):
            return run(ctx)
    except UsageError as e:
        usage_error_line(e.command, str(e))
        return e.code
    except CliError as e:
        error_line(str(e))
        return e.code
    except KeyboardInterrupt:
        error_line("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `gateway-limiter conf list | head`: the reader left. Point stdout at devnull so
        # the interpreter's final flush does not complain a second time.
        with suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE
    except Exception as e:
        expected = _expected_failure(ctx, e)
        if expected is None:
            raise
        message, code = expected
        error_line(message)
        return code
    finally:
        ctx.close()
