"""``gateway-limiter console [--host 127.0.0.1] [--port 8088]``: the operator console.

Only the arguments live here; the console itself is ``gateway_limiter.console`` (the
``console`` extra: Starlette, uvicorn, Jinja2), a floor above the command line, loaded
by name when the command runs so that the rest of the command line never needs it.
"""

from __future__ import annotations

import argparse
import importlib

from gateway_limiter.cli.arguments import command, port_arg
from gateway_limiter.cli.context import CliError, Context

#: Where the console listens unless told otherwise: this host only.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8088
EXTRA_HINT = "pip install 'gateway-limiter[console]'"


def register(parser: argparse.ArgumentParser) -> None:
    """Make ``parser`` the ``console`` command."""
    command(parser, cmd_console)
    parser.add_argument(
        "--host",
        default=DEFAULT_HOST,
        metavar="ADDRESS",
        help=f"address to listen on (default {DEFAULT_HOST}; another address needs "
        "console_token set)",
    )
    parser.add_argument(
        "--port",
        type=port_arg,
        default=DEFAULT_PORT,
        metavar="PORT",
        help=f"TCP port (default {DEFAULT_PORT})",
    )


def load_console_serve() -> object:
    """``gateway_limiter.console.serve``, or a CliError saying which extra to install."""
    try:
        return importlib.import_module("gateway_limiter.console.serve")
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] in ("starlette", "uvicorn", "jinja2"):
            raise CliError(f"the console needs {e.name}: {EXTRA_HINT}", code=2) from None
        raise


def cmd_console(ctx: Context) -> int:
    """Serve the console until Ctrl-C or SIGTERM."""
    serve = load_console_serve()
    code: int = serve.run_console(ctx)  # type: ignore[attr-defined]
    return code
