"""``gateway-limiter switch on|off|default|status``: the global switch row, or where the
switch is kept instead (setting ``switch_source``: etcd, Apollo), which it reads and
names, and never writes."""

from __future__ import annotations

import argparse

from gateway_limiter.cli.arguments import command
from gateway_limiter.cli.context import CliError, Context
from gateway_limiter.cli.describe import on_off
from gateway_limiter.config.switch_source import SwitchSource, parse_switch_source


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
    kept = parse_switch_source(ctx.settings.switch_source)
    if kept.external:
        return _centre(ctx, kept, state)
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


def _centre(ctx: Context, source: SwitchSource, state: str) -> int:
    """The switch of a configuration centre: shown as it reads now; never written."""
    import asyncio

    from gateway_limiter.config.switch_source import (
        BadSwitchValue,
        SourceUnreachable,
        SwitchSourceError,
        need_httpx,
        read_once,
        switch_value,
    )

    where = f"{source.kind} {source.shown} (setting switch_source)"
    if state != "status":
        raise CliError(
            f"the switch is kept in {where}, not in the table: {source.where_to_change()}",
            code=2,
        )
    try:
        need_httpx(source)
        reading = asyncio.run(read_once(source))
    except SwitchSourceError as e:
        raise CliError(str(e), code=2) from None
    except SourceUnreachable as e:
        raise CliError(
            f"cannot read the switch from {where}: {e}; each process keeps its last good "
            "state (one that never reached it: the switch setting)"
        ) from None
    if reading.text is None:
        effective = ctx.settings.switch
        said = f"settings default: switch = {str(effective).lower()}; no key {source.key!r}"
    else:
        try:
            effective = switch_value(reading.text)
        except BadSwitchValue:
            raise CliError(
                f"the switch at {where} is {reading.text!r}, not on/off: processes keep "
                f"their last good state; {source.where_to_change()}"
            ) from None
        said = f"{where}: {reading.text!r}"
    ctx.out.line(f"switch {on_off(effective)} ({said})")
    ctx.out.line(f"to change it, {source.where_to_change()}")
    if not effective:
        ctx.out.line("while the switch is off nothing is limited: every call is admitted at once")
    return 0
