"""Running the console: the checks before listening, the sources over the configured
database and Redis, and uvicorn.

``run_console`` is what ``gateway-limiter console`` runs; ``ConsoleServer`` serves an
app on a background thread (the demo's console, and tests).
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
import threading
import time
from typing import TYPE_CHECKING

import uvicorn

from gateway_limiter.backends.schemes import open_backend
from gateway_limiter.cli.context import CliError, Context, relaxed, sigterm_interrupts
from gateway_limiter.config.audit import local_actor
from gateway_limiter.config.reload import Registry
from gateway_limiter.config.settings import Settings
from gateway_limiter.config.table import make_engine
from gateway_limiter.console.app import make_app
from gateway_limiter.console.sources import InProcessView, RedisView, Sources

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from starlette.types import ASGIApp

    from gateway_limiter.limiter import GatewayLimiter


def is_loopback(host: str) -> bool:
    """True when ``host`` can only be reached from this machine (127.0.0.0/8, ::1,
    localhost); a name is resolved, and counts only if every address is loopback."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, None)
    except OSError:
        return False
    addresses = {info[4][0] for info in found}
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def check_listen(host: str, settings: Settings) -> None:
    """Refuse to listen beyond loopback when the console has no token (read only, but
    the table, the fleet and the audit are still no business of the network's)."""
    if not settings.console_token and not is_loopback(host):
        raise CliError(
            f"--host {host!r} is not a loopback address and console_token is not set: "
            "set console_token (at least 16 characters) in the settings or "
            "GATEWAY_LIMITER_CONSOLE_TOKEN, or listen on 127.0.0.1",
            code=2,
        )


class ConsoleServer:
    """uvicorn serving ``app`` on a daemon thread, until ``stop``."""

    def __init__(self, app: ASGIApp, host: str, port: int) -> None:
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="gwl-console", daemon=True)

    def start(self, timeout_s: float = 10.0) -> ConsoleServer:
        """Start listening; RuntimeError if it has not within ``timeout_s``."""
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the console did not start listening (port in use?)")
            time.sleep(0.02)
        return self

    @property
    def port(self) -> int:
        """The port it listens on (the one chosen, when asked for port 0)."""
        for server in self.server.servers:
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return int(self.server.config.port)

    def stop(self) -> None:
        """Stop serving and wait for the thread."""
        self.server.should_exit = True
        self.thread.join(timeout=10)


def redis_sources(settings: Settings, actor: str) -> tuple[Sources, RedisView]:
    """Sources over the configured database and Redis (the caller closes the view's
    registry and backend)."""
    engine = make_engine(settings.database_url)
    view = RedisView(
        settings, open_backend(settings), Registry(settings, make_engine(settings.database_url))
    )
    sources = Sources(
        settings=settings, engine=engine, status=view.status, fleet=view.fleet, actor=actor
    )
    return sources, view


def run_console(ctx: Context) -> int:
    """``gateway-limiter console``: serve until interrupted."""
    host, port = ctx.args.host, ctx.args.port
    settings = relaxed(ctx.settings)
    check_listen(host, settings)
    ctx.engine()  # a SQLite file that does not exist is an error now, not on first page
    sources, view = redis_sources(settings, getattr(ctx.args, "actor", None) or local_actor())
    shown_host = f"[{host}]" if ":" in host else host
    mode = "read only (console_token not set)" if not settings.console_token else "read-write"
    ctx.out.line(f"console on http://{shown_host}:{port}/ ({mode}); Ctrl-C stops it")
    server = ConsoleServer(make_app(sources, host), host, port)
    try:
        with sigterm_interrupts():
            server.start()
            while server.thread.is_alive():
                server.thread.join(timeout=0.5)
    except KeyboardInterrupt:
        pass
    except RuntimeError as e:
        raise CliError(f"console on {host}:{port}: {e}") from None
    finally:
        server.stop()
        view.registry.close()
        view.backend.close()
        sources.engine.dispose()
    return 0


class DemoConsole:
    """The console over the demo's SQLite file and in-process limiter, on loopback."""

    def __init__(self, server: ConsoleServer, engine: Engine, token: str) -> None:
        self.server = server
        self.engine = engine
        self.banner = f"console on http://127.0.0.1:{server.port}/ (demo token for edits: {token})"

    def stop(self) -> None:
        """Stop serving, release the engine."""
        self.server.stop()
        self.engine.dispose()


def demo_console(limiter: GatewayLimiter, settings: Settings, port: int) -> DemoConsole:
    """Serve the console over the demo's limiter, with a token of its own (printed: the
    demo's table is a temporary file on this machine, and edits are the point)."""
    token = secrets.token_urlsafe(18)
    view = InProcessView(limiter)
    engine = make_engine(settings.database_url)
    sources = Sources(
        settings=settings.replace(console_token=token),
        engine=engine,
        status=view.status,
        fleet=view.fleet,
        actor=local_actor(),
    )
    try:
        server = ConsoleServer(make_app(sources), "127.0.0.1", port).start()
    except RuntimeError as e:
        engine.dispose()
        raise CliError(f"console on 127.0.0.1:{port}: {e}") from None
    return DemoConsole(server, engine, token)
