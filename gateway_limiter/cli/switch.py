"""``gateway-limiter switch on|off|default|status``: the global switch row."""

from __future__ import annotations

import argparse

from gateway_limiter.cli.arguments import command
from gateway_limiter.cli.context import Context
from gateway_limiter.cli.describe import on_off


def register(parser: argparse.ArgumentParser) -> None:
    """Make ``parser`` the ``switch`` command."""
    command(parser, cmd_switch)
    parser.add_argument(
        "state",
        choices=("on", "off", "default", "status"),
        metavar="STATE",
        help="on | off | default | status",
    )


def cmd_switch(ctx: Context) -> int:
    """``switch on|off|default`` writes the switch row; ``switch status`` reads it."""
    from gateway_limiter.config.table import read_switch, write_switch

    state = ctx.args.state
    engine = ctx.engine()
    if state != "status":
        write_switch(engine, {"on": True, "off": False, "default": None}[state], ctx.changed_by())
    stored = read_switch(engine)
    effective = ctx.settings.switch if stored is None else stored
    if stored is None:
        source = (
            f"settings default: switch = {str(ctx.settings.switch).lower()}; "
            "the database row is NULL"
        )
    else:
        source = "database row"
    ctx.out.line(f"switch {on_off(effective)} ({source})")
    if state != "status":
        ctx.out.line(ctx.reload_note())
    if not effective:
        ctx.out.line("while the switch is off nothing is limited: every call is admitted at once")
    return 0
