"""``conf set '*' --channel C`` and ``conf set URL --per-caller --caller KEY`` write the
rows of capacity shares; ``conf list`` and ``status`` show them as channel caps and named
callers; bad caller keys are refused naming the value, before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from gateway_limiter import GatewayLimiter
from gateway_limiter.cli import main
from tests.support.commandline import Ran
from tests.support.commandline import cli as run
from tests.support.services import RedisServer

pytestmark = pytest.mark.usefixtures("no_local_settings")


def cli(capsys: pytest.CaptureFixture[str], db: str, *argv: str) -> Ran:
    return run(capsys, "--database-url", db, *argv)


def rows(engine: Engine) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        query = text(
            "select interfaceUrl, channelType, rateLimit, perCaller, callerKey, status "
            "from t_ratelimite_conf order by configId"
        )
        return [tuple(r) for r in conn.execute(query)]


def test_channel_caps_and_named_callers_are_written_listed_and_shown(
    capsys: pytest.CaptureFixture[str],
    migrated_any_db: tuple[str, Engine],
    redis_server: RedisServer,
    key_prefix: str,
    tmp_path: Path,
) -> None:
    db, engine = migrated_any_db
    for url in ("/ibe/search", "/ibe/book"):
        ran = cli(capsys, db, "conf", "set", url, "--rate", "25", "--channel", "IBE+", "--enable")
        assert ran.code == 0, ran.err
    ran = cli(capsys, db, "conf", "set", "*", "--rate", "30", "--channel", "IBE+", "--enable")
    assert ran.code == 0, ran.err
    assert (
        cli(capsys, db, "conf", "set", "/p", "--rate", "10", "--per-caller", "--enable").code == 0
    )
    named = ["--rate", "50", "--per-caller", "--caller", "partner-a", "--enable"]
    ran = cli(capsys, db, "conf", "set", "/p", *named)
    assert ran.code == 0, ran.err
    assert "callerKey partner-a" in ran.out
    # what the row just written does, not only the unnamed per-caller row
    assert "caller 'partner-a': " in ran.out and "50/s" in ran.out
    assert rows(engine) == [
        ("/ibe/search", "IBE+", 25, 0, None, 1),
        ("/ibe/book", "IBE+", 25, 0, None, 1),
        ("*", "IBE+", 30, 0, None, 1),
        ("/p", None, 10, 1, None, 1),  # the default row was not touched by --caller
        ("/p", None, 50, 1, "partner-a", 1),
    ]
    listed = cli(capsys, db, "conf", "list").out
    cap_line = next(line for line in listed.splitlines() if " * " in line)
    assert "channel cap of 'IBE+' over /ibe/book, /ibe/search: 30/s" in cap_line
    partner = next(line for line in listed.splitlines() if "partner-a" in line)
    assert "for caller 'partner-a' only" in partner and "50/s" in partner

    settings = tmp_path / "settings.toml"
    settings.write_text(
        f'database_url = "{db}"\nredis_url = "{redis_server.url}"\nkey_prefix = "{key_prefix}"\n'
    )
    with GatewayLimiter.from_settings(settings) as limiter:
        assert limiter.try_acquire("/ibe/search", timeout=0)
    capsys.readouterr()
    assert main(["--settings", str(settings), "status"]) == 0
    out = capsys.readouterr().out
    channel = [line for line in out.splitlines() if line.startswith("* (channel IBE+)")]
    assert len(channel) == 1  # the channel once, not once per interface
    # the channel's own bucket was read: one taken (refilled since at 30/s), not idle
    assert 28.9 <= float(channel[0].split()[7]) <= 30 and "idle" not in channel[0]
    assert any("for caller 'partner-a' alone" in line for line in out.splitlines())


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("x" * 65, "longer than 64"),
        ("tab\there", "control character '\\t'"),
        ("", "empty"),
    ],
)
def test_a_bad_caller_key_is_refused_naming_it(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine], value: str, says: str
) -> None:
    db, engine = migrated_any_db
    ran = cli(capsys, db, "conf", "set", "/p", "--rate", "5", "--per-caller", "--caller", value)
    assert ran.code == 2
    assert says in ran.err and "--caller" in ran.err
    assert rows(engine) == []


def test_caller_needs_per_caller_and_a_channel_row_needs_its_channel(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_any_db
    ran = cli(capsys, db, "conf", "set", "/p", "--rate", "5", "--caller", "partner-a")
    assert ran.code == 2 and "'partner-a'" in ran.err and "--per-caller" in ran.err
    ran = cli(capsys, db, "conf", "set", "*", "--rate", "30", "--enable")
    assert ran.code == 2 and "needs the channelType" in ran.err
    assert rows(engine) == []


def test_conf_set_says_what_a_named_caller_and_a_channel_cap_do(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, _ = migrated_any_db
    named = ["--rate", "5", "--per-caller", "--caller", "A", "--enable"]
    ran = cli(capsys, db, "conf", "set", "/only", *named)
    assert ran.code == 0, ran.err
    assert "/only is limited only for the callers its rows name ('A')" in ran.out
    cli(capsys, db, "conf", "set", "/a", "--rate", "25", "--channel", "C", "--enable")
    ran = cli(capsys, db, "conf", "set", "*", "--rate", "30", "--channel", "C", "--enable")
    assert ran.code == 0, ran.err
    assert "'*' rows are channel caps: configId 3: channel cap of 'C' over /a: 30/s" in ran.out
    listed = cli(capsys, db, "conf", "list").out
    assert "channel cap of 'C' over /a: 30/s" in listed


def test_each_channel_keeps_its_own_cap_row(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    """``conf set '*' --channel C`` picks (or makes) C's row alone: setting a second
    channel's cap leaves the first one's as it was, and enable/disable/delete take
    ``--channel`` to pick one cap."""
    db, engine = migrated_any_db
    for channel, rate in (("IBE+", "30"), ("GDS", "8"), ("IBE+", "31")):
        ran = cli(capsys, db, "conf", "set", "*", "--rate", rate, "--channel", channel, "--enable")
        assert ran.code == 0, ran.err
    assert rows(engine) == [("*", "IBE+", 31, 0, None, 1), ("*", "GDS", 8, 0, None, 1)]
    ran = cli(capsys, db, "conf", "disable", "*", "--channel", "GDS")
    assert ran.code == 0, ran.err
    assert rows(engine) == [("*", "IBE+", 31, 0, None, 1), ("*", "GDS", 8, 0, None, 0)]
    ran = cli(capsys, db, "conf", "delete", "*", "--channel", "GDS")
    assert ran.code == 0, ran.err
    assert rows(engine) == [("*", "IBE+", 31, 0, None, 1)]
    ran = cli(capsys, db, "conf", "disable", "/ibe/search", "--channel", "IBE+")
    assert ran.code == 2 and "--channel" in ran.err and "/ibe/search" in ran.err
    assert rows(engine) == [("*", "IBE+", 31, 0, None, 1)]
