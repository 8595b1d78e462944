"""``conf set URL --quota-period day --time-zone Asia/Shanghai [--renews] [--pacing]``
writes a calendar quota's row beside the URL's per-second row; bad values are refused
naming the field before anything is written; rows written by plain SQL with bad values
are skipped by the reload with a warning naming the configId. On MariaDB and SQLite."""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import Engine, text

from gateway_limiter import GatewayLimiter
from gateway_limiter.cli import main
from gateway_limiter.config.rules import build_rules
from gateway_limiter.config.table import read_rows
from gateway_limiter.model.calendar import Calendar, QuotaPeriod
from tests.support.commandline import Command, Refuses, conf_columns, settings_file
from tests.support.commandline import db_cli as cli
from tests.support.limiting import write_row
from tests.support.services import RedisServer

URL = "/ibe/flight/search"

pytestmark = pytest.mark.usefixtures("no_local_settings")


CALENDAR_COLUMNS = ("rateLimit", "periodSeconds", "quotaPeriod", "timeZone", "quotaRenews")


def calendar_columns(engine: Engine) -> list[tuple[Any, ...]]:
    return conf_columns(engine, *CALENDAR_COLUMNS, "quotaPacing")


def test_conf_set_writes_a_daily_quota_beside_the_per_second_row(
    command: Command, migrated_any_db: tuple[str, Engine]
) -> None:
    engine = migrated_any_db[1]
    assert command("conf", "set", URL, "--rate", "20", "--enable").code == 0
    ran = command(
        *("conf", "set", URL, "--rate", "50000", "--quota-period", "day"),
        *("--time-zone", "Asia/Shanghai", "--enable"),
    )
    assert ran.code == 0, ran.err
    assert "quotaPeriod day, timeZone Asia/Shanghai, quotaRenews NULL, quotaPacing 0" in ran.out
    assert "50,000 per day" in ran.out and "renews 00:00 Asia/Shanghai" in ran.out
    # the same command again changes that row, not the per-second one
    ran = command(
        *("conf", "set", URL, "--rate", "40000", "--quota-period", "day", "--renews", "02:00"),
    )
    assert ran.code == 0, ran.err
    assert "rateLimit 50000 -> 40000, quotaRenews NULL -> 02:00" in ran.out
    assert calendar_columns(engine) == [
        (1, 20, 1, None, None, None, 0),
        (2, 40_000, 1, "day", "Asia/Shanghai", "02:00", 0),
    ]
    ruleset = build_rules(read_rows(engine), 0.5)
    assert ruleset.skipped == ()
    rule = ruleset.rules[URL]
    assert [(r.rate, r.quota_period) for r in rule.limits] == [
        (20, None),
        (40_000, QuotaPeriod.DAY),
    ]
    listed = command("conf", "list")
    assert "40,000 per day" in listed.out
    # a month from the 15th in New York, and back to the default zone
    ran = command(
        *("conf", "set", URL, "--rate", "1000000", "--quota-period", "month"),
        *("--renews", "15 00:00", "--time-zone", "America/New_York", "--enable"),
    )
    assert ran.code == 0, ran.err
    assert "renews on day 15 at 00:00 America/New_York" in ran.out
    ran = command("conf", "set", URL, "--quota-period", "month", "--time-zone", "none")
    assert "timeZone America/New_York -> NULL" in ran.out
    # conf disable picks the calendar row by its period
    ran = command("conf", "disable", URL, "--quota-period", "day")
    assert ran.code == 0, ran.err
    assert [r[0] for r in calendar_columns(engine)] == [1, 2, 3]
    with engine.connect() as conn:
        statuses = conn.execute(
            text("select configId, status from t_ratelimite_conf order by configId")
        ).all()
    assert [tuple(s) for s in statuses] == [(1, 1), (2, 0), (3, 1)]


def test_conf_list_shows_a_quota_rows_period_and_zone_and_its_json_has_the_columns(
    command: Command, migrated_any_db: tuple[str, Engine]
) -> None:
    """A daily row must not read as a per-second one: the table names its period and
    zone, and ``--json`` carries every calendar column."""
    assert command("conf", "set", URL, "--rate", "20", "--enable").code == 0
    ran = command(
        *("conf", "set", URL, "--rate", "50000", "--quota-period", "day"),
        *("--time-zone", "Asia/Shanghai", "--renews", "02:00", "--enable"),
    )
    assert ran.code == 0, ran.err
    listed = command("conf", "list")
    assert "quota" in listed.out and "day Asia/Shanghai from 02:00" in listed.out
    listed = command("conf", "list", "--json")
    rows = json.loads(listed.out)["rows"]
    assert [
        (r["rateLimit"], r["quotaPeriod"], r["timeZone"], r["quotaRenews"], r["quotaPacing"])
        for r in rows
    ] == [(20, None, None, None, 0), (50000, "day", "Asia/Shanghai", "02:00", 0)]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("--quota-period", "day", "--time-zone", "Mars/Olympus"), "timeZone 'Mars/Olympus'"),
        (("--quota-period", "month", "--renews", "31 00:00"), "names the 31st"),
        (("--quota-period", "day", "--renews", "25:00"), "quotaRenews '25:00'"),
        (("--quota-period", "week", "--renews", "15 00:00"), "quotaRenews '15 00:00'"),
        (("--time-zone", "Asia/Shanghai"), "argument --time-zone: is for a calendar quota"),
        (("--renews", "02:00"), "argument --renews: is for a calendar quota"),
        (("--pacing",), "argument --pacing: is for a calendar quota"),
        (("--quota-period", "day", "--period", "60"), "argument --period: 60 cannot go"),
        (("--quota-period", "year"), "invalid choice: 'year'"),
    ],
)
def test_conf_set_refuses_bad_calendar_values_naming_the_field(
    refuses: Refuses, argv: tuple[str, ...], says: str
) -> None:
    refuses(("conf", "set", URL, "--rate", "100", *argv), says)


def test_conf_set_refuses_a_calendar_row_with_an_algorithm_it_cannot_count(
    refuses: Refuses,
) -> None:
    argv = ("conf", "set", URL, "--rate", "100", "--quota-period", "day")
    refuses((*argv, "--algorithm", "sliding_window"), "algorithm 'sliding_window' cannot count")


def test_the_reload_skips_bad_calendar_rows_naming_their_config_id(
    lim: GatewayLimiter, migrated_db: tuple[str, Engine], caplog: pytest.LogCaptureFixture
) -> None:
    engine = migrated_db[1]
    good = write_row(engine, "/good", rateLimit=3, quotaPeriod="day", timeZone="Asia/Shanghai")
    zone = write_row(engine, "/zone", rateLimit=3, quotaPeriod="day", timeZone="Beijing")
    renews = write_row(engine, "/renews", rateLimit=3, quotaPeriod="month", quotaRenews="31 00:00")
    caplog.set_level(logging.WARNING, logger="gateway_limiter")
    summary = lim.reload()
    assert summary.ok
    assert "/good" in lim.registry.snapshot.rules
    assert {s.config_id for s in summary.skipped} == {zone, renews}
    said = [r.getMessage() for r in caplog.records]
    assert any(f"configId {zone}: timeZone 'Beijing'" in m for m in said), said
    assert any(f"configId {renews}: quotaRenews '31 00:00' names the 31st" in m for m in said)
    assert good not in {s.config_id for s in summary.skipped}


def test_status_shows_what_a_quota_used_and_when_it_renews(
    capsys: pytest.CaptureFixture[str],
    migrated_db: tuple[str, Engine],
    redis_server: RedisServer,
    key_prefix: str,
    tmp_path: Path,
) -> None:
    db, _ = migrated_db
    cli(capsys, db, "conf", "set", URL, "--rate", "20", "--cache", "0", "--enable")
    quota = ("--quota-period", "day", "--time-zone", "Asia/Shanghai", "--enable")
    cli(capsys, db, "conf", "set", URL, "--rate", "50000", *quota)
    settings = settings_file(tmp_path, db, redis_server.url, key_prefix)
    with GatewayLimiter.from_settings(settings) as limiter:
        assert sum(limiter.try_acquire(URL, timeout=0) for _ in range(3)) == 3
        (_, daily) = limiter.status(URL)
    midnight = Calendar.of("day", "Asia/Shanghai").period_at(time.time())[1]
    assert (daily.quota_used, daily.renews_at) == (3, midnight)
    capsys.readouterr()
    assert main(["--settings", str(settings), "status", URL]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "50,000/day" in line)
    shown = dt.datetime.fromtimestamp(midnight, ZoneInfo("Asia/Shanghai"))
    assert f"used 3 of 50,000; renews {shown:%Y-%m-%d} 00:00 CST (Asia/Shanghai)" in line


def test_a_used_up_quota_is_spent_in_status_its_filter_and_its_json(
    capsys: pytest.CaptureFixture[str],
    migrated_db: tuple[str, Engine],
    redis_server: RedisServer,
    key_prefix: str,
    tmp_path: Path,
) -> None:
    """All 5 of a 5/day quota used: ``spent`` as a spent window is, in the text, for
    ``--status spent`` and in ``--json``, whose top-level ``used`` is the quota's; some
    used is ``ok``, never ``idle``."""
    db, _ = migrated_db
    cli(capsys, db, "conf", "set", URL, "--rate", "100", "--cache", "0", "--enable")
    quota = ("--quota-period", "day", "--time-zone", "Asia/Shanghai", "--enable")
    cli(capsys, db, "conf", "set", URL, "--rate", "5", *quota)
    settings = settings_file(tmp_path, db, redis_server.url, key_prefix)
    argv = ["--settings", str(settings), "status", URL]

    def daily_json() -> dict[str, Any]:
        capsys.readouterr()
        assert main([*argv, "--json"]) == 0
        limits: list[dict[str, Any]] = json.loads(capsys.readouterr().out)["limits"]
        return limits[1]

    with GatewayLimiter.from_settings(settings) as limiter:
        assert sum(limiter.try_acquire(URL, timeout=0) for _ in range(2)) == 2
        some = daily_json()
        assert (some["condition"], some["used"], some["quota"]["used"]) == ("ok", 2, 2)
        assert sum(limiter.try_acquire(URL, timeout=0) for _ in range(4)) == 3
    daily = daily_json()
    assert (daily["condition"], daily["used"], daily["quota"]["used"]) == ("spent", 5, 5)
    assert daily["rateLimit"] == daily["quota"]["limit"] == 5
    renews_ms = (daily["quota"]["resetsAt"] - time.time()) * 1000.0
    assert renews_ms - 60_000 <= daily["nextFreeMs"] <= renews_ms + 60_000
    assert main(argv) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if "5/day" in line)
    assert "spent: used 5 of 5; renews " in line
    assert main([*argv, "--status", "spent"]) == 0
    assert "spent: used 5 of 5" in capsys.readouterr().out
    assert main([*argv, "--status", "idle"]) == 0
    assert "5/day" not in capsys.readouterr().out


def test_status_says_a_quota_is_paced_its_burst_and_when_its_next_permit_comes(
    capsys: pytest.CaptureFixture[str],
    migrated_db: tuple[str, Engine],
    redis_server: RedisServer,
    key_prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A paced quota of 100 a day with a burst of 2, both taken: refused until the pace
    gives the next permit (the 98 left spread over what is left of the day), which
    ``status`` says, as it says the pacing and the burst."""
    db, _ = migrated_db
    cli(capsys, db, "conf", "set", URL, "--rate", "100", "--cache", "0", "--enable")
    quota = ("--quota-period", "day", "--time-zone", "UTC", "--enable")
    cli(capsys, db, "conf", "set", URL, "--rate", "100", *quota, "--pacing", "--max-permits", "2")
    settings = settings_file(tmp_path, db, redis_server.url, key_prefix)
    argv = ["--settings", str(settings), "status", URL]
    monkeypatch.setenv("COLUMNS", "100")
    capsys.readouterr()
    assert main(argv) == 0
    line = " ".join(capsys.readouterr().out.split())
    assert "idle: used 0 of 100; paced, burst 2; renews " in line
    with GatewayLimiter.from_settings(settings) as limiter:
        assert sum(limiter.try_acquire(URL, timeout=0) for _ in range(3)) == 2
    _, day_ends = Calendar.of("day", "UTC").period_at(time.time())
    pace_s = (day_ends - time.time()) / 98
    assert main([*argv, "--json"]) == 0
    daily = json.loads(capsys.readouterr().out)["limits"][1]
    assert daily["condition"] == "spent" and daily["used"] == 2
    assert (daily["quota"]["pacing"], daily["quota"]["pacingBurst"]) == (True, 2)
    assert pace_s * 1000 - 60_000 <= daily["nextFreeMs"] <= pace_s * 1000 + 1000
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 100
    shown = " ".join(out.split())  # the state may fold onto more lines
    assert "spent: used 2 of 100; paced, burst 2, next permit in " in shown


def test_conf_set_paces_a_daily_quota_with_max_permits_as_its_burst(
    command: Command, migrated_any_db: tuple[str, Engine]
) -> None:
    engine = migrated_any_db[1]
    ran = command(
        *("conf", "set", URL, "--rate", "50000", "--quota-period", "day"),
        *("--time-zone", "Asia/Shanghai", "--pacing", "--max-permits", "30", "--enable"),
    )
    assert ran.code == 0, ran.err
    assert "not applied" not in ran.out + ran.err
    rule = build_rules(read_rows(engine), 0.5).rules[URL]
    assert rule.pacing and rule.pace_burst == 30
    # without pacing the burst means nothing: refused naming the field, nothing written
    ran = command("conf", "set", URL, "--quota-period", "day", "--no-pacing")
    assert ran.code != 0 and "maxPermits 30 is not used by a calendar quota without pacing" in (
        ran.err
    )
    # and the error names the flag that clears it, as conf set --help promises
    assert "argument --no-pacing:" in ran.err and "add '--max-permits none'" in ran.err
    assert build_rules(read_rows(engine), 0.5).rules[URL].pacing


def test_status_json_has_each_quotas_figures_and_every_view_names_it_calendar(
    capsys: pytest.CaptureFixture[str],
    migrated_db: tuple[str, Engine],
    redis_server: RedisServer,
    key_prefix: str,
    tmp_path: Path,
) -> None:
    """``status --json`` gives a calendar row a ``quota`` object (null for the per-second
    row); ``conf list``, its effect, ``status`` and the row's rule text all call the
    quota row's algorithm ``calendar``, whatever its algorithm column holds."""
    db, _ = migrated_db
    cli(capsys, db, "conf", "set", URL, "--rate", "20", "--cache", "0", "--enable")
    quota = ("--quota-period", "day", "--time-zone", "Asia/Shanghai", "--renews", "02:00")
    ran = cli(
        capsys,
        db,
        "conf",
        "set",
        URL,
        "--rate",
        "500",
        *quota,
        "--pacing",
        "--max-permits",
        "7",
        "--enable",
    )
    assert ran.code == 0, ran.err
    assert "500 per day (calendar: renews 02:00 Asia/Shanghai, paced, burst 7)" in ran.out
    settings = settings_file(tmp_path, db, redis_server.url, key_prefix)
    with GatewayLimiter.from_settings(settings) as limiter:
        assert sum(limiter.try_acquire(URL, timeout=0) for _ in range(2)) == 2
    renews = Calendar.of("day", "Asia/Shanghai", "02:00").period_at(time.time())[1]
    capsys.readouterr()
    assert main(["--settings", str(settings), "status", URL, "--json"]) == 0
    rate, daily = json.loads(capsys.readouterr().out)["limits"]
    assert rate["algorithm"] == "token_bucket" and rate["quota"] is None
    assert daily["algorithm"] == "calendar"
    assert daily["quota"] == {
        "used": 2.0,
        "limit": 500,
        "resetsAt": renews,
        "period": "day",
        "zone": "Asia/Shanghai",
        "renews": "02:00",
        "pacing": True,
        "pacingBurst": 7,
    }
    assert main(["--settings", str(settings), "status", URL]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if "500/day" in line)
    assert " calendar " in line and "fixed_window" not in line
    listed = cli(capsys, db, "conf", "list")
    line = next(line for line in listed.out.splitlines() if " 500 " in line)
    assert " calendar " in line and "500 per day, calendar, paced, burst 7, wait <= 0 s" in line
    assert "token_bucket" not in line and "aligned windows" not in line
