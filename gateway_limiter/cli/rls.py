"""``gateway-limiter rls [--listen 127.0.0.1:8081] [--metrics-port N]``: Envoy's rate
limit service over the limits table.

Only the arguments live here; the service is ``gateway_limiter.rls`` (the ``rls``
extra: grpcio, grpcio-health-checking, xds-protos), a floor beside the command line,
loaded by name when the command runs so that the rest of the command line never needs
it.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import re
from typing import Any

from gateway_limiter.cli.arguments import command, port_arg
from gateway_limiter.cli.context import CliError, Context, require_sqlite_file

DEFAULT_LISTEN = "127.0.0.1:8081"
EXTRA_HINT = "pip install 'gateway-limiter[rls]'"


def listen_arg(text: str) -> str:
    """``--listen``: ``host:port`` (an IPv6 host in brackets)."""
    found = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})", text.strip())
    if found is None or int(found.group(2)) > 65535:
        raise argparse.ArgumentTypeError(
            f"invalid value {text!r}: must be host:port, such as 127.0.0.1:8081 or [::1]:8081"
        )
    return text.strip()


def register(parser: argparse.ArgumentParser) -> None:
    """Make ``parser`` the ``rls`` command."""
    command(parser, cmd_rls)
    parser.add_argument(
        "--listen",
        type=listen_arg,
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"address to serve gRPC on (default {DEFAULT_LISTEN})",
    )
    parser.add_argument(
        "--metrics-port",
        type=port_arg,
        default=None,
        metavar="PORT",
        help="also serve Prometheus metrics on this port, on the --listen host",
    )


def load_rls_server() -> Any:
    """``gateway_limiter.rls.server``, or a CliError saying which extra to install."""
    try:
        return importlib.import_module("gateway_limiter.rls.server")
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] in ("grpc", "grpc_health", "envoy", "google"):
            raise CliError(f"the rls service needs {e.name}: {EXTRA_HINT}", code=2) from None
        raise


def cmd_rls(ctx: Context) -> int:
    """Serve Envoy's rate limit service until SIGTERM or Ctrl-C (graceful: the calls in
    flight finish)."""
    server = load_rls_server()
    settings = ctx.settings
    require_sqlite_file(settings.database_url)
    listen = ctx.args.listen

    def ready(running: Any) -> None:
        ctx.out.line(
            f"rls on {listen.rsplit(':', 1)[0]}:{running.port} "
            f"(envoy.service.ratelimit.v3.RateLimitService and grpc.health.v1.Health); "
            "SIGTERM or Ctrl-C stops it"
        )

    try:
        asyncio.run(server.serve_until_signalled(settings, listen, ready, ctx.args.metrics_port))
    except OSError as e:
        raise CliError(f"rls on {listen}: {e}") from None
    except KeyboardInterrupt:
        pass
    return 0
