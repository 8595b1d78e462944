"""A new user's first calendar quota, as ``conf set`` and ``conf list`` print it: the
row says ``calendar`` and its period in seconds as ``status --json`` reckons it (a day
86400, not the ``periodSeconds`` 1 the column keeps), and the footer on a NULL ``cache``
says what the value counts as without promising a wait the interface's other row cuts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.cli import main
from tests.support.commandline import Command, settings_file
from tests.support.commandline import db_cli as cli
from tests.support.limiting import write_row
from tests.support.services import RedisServer

URL = "/ibe/flight/search"

pytestmark = pytest.mark.usefixtures("no_local_settings")


def row_line(out: str, rate: str) -> str:
    """``conf list``'s line for the row of ``rate``."""
    return next(line for line in out.splitlines() if f" {rate} " in line)


def cell(out: str, rate: str, column: str) -> str:
    """A right-aligned (numeric) cell of ``conf list``: the word that ends where its
    column's header ends."""
    header = next(line for line in out.splitlines() if "configId" in line)
    end = header.index(column) + len(column)
    return row_line(out, rate)[:end].split()[-1]


def test_conf_set_says_a_quota_row_is_a_calendar_quota_of_its_period(
    command: Command, migrated_any_db: tuple[str, Engine]
) -> None:
    assert command("conf", "set", URL, "--rate", "20", "--enable").code == 0
    ran = command(*("conf", "set", URL, "--rate", "50000", "--quota-period", "week"))
    assert ran.code == 0, ran.err
    created = next(line for line in ran.out.splitlines() if line.startswith("created"))
    assert "algorithm calendar," in created and "token_bucket" not in created
    assert "periodSeconds 604800," in created
    # the column itself still holds what the table's defaults wrote
    listed = json.loads(command("conf", "list", "--json").out)["rows"]
    assert [(r["algorithm"], r["periodSeconds"]) for r in listed] == [
        ("token_bucket", 1),
        ("token_bucket", 1),
    ]


def test_conf_list_gives_a_quota_row_the_period_status_gives_it(
    capsys: pytest.CaptureFixture[str],
    migrated_db: tuple[str, Engine],
    redis_server: RedisServer,
    key_prefix: str,
    tmp_path: Path,
) -> None:
    db, _ = migrated_db
    assert cli(capsys, db, "conf", "set", URL, "--rate", "20", "--enable").code == 0
    daily = ("--rate", "50000", "--quota-period", "day", "--time-zone", "Asia/Shanghai")
    assert cli(capsys, db, "conf", "set", URL, *daily, "--enable").code == 0
    settings = settings_file(tmp_path, db, redis_server.url, key_prefix)
    with GatewayLimiter.from_settings(settings):
        pass
    capsys.readouterr()
    assert main(["--settings", str(settings), "status", URL, "--json"]) == 0
    seconds = [s["periodSeconds"] for s in json.loads(capsys.readouterr().out)["limits"]]
    assert seconds == [1, 86400]
    listed = cli(capsys, db, "conf", "list")
    assert cell(listed.out, "20", "periodSeconds") == "1"
    assert cell(listed.out, "50000", "periodSeconds") == "86400"


def test_the_cache_footer_says_what_null_counts_as_and_that_the_smallest_binds(
    command: Command, migrated_any_db: tuple[str, Engine]
) -> None:
    assert command("conf", "set", "/alone", "--rate", "5", "--enable").code == 0
    alone = command("conf", "list").out.splitlines()[-1]
    assert alone == "cache NULL: the row counts as default_cache = 0.5 s"
    # a daily quota with no cache beside a per-second row of 0.2 s: its callers wait
    # 0.2 s, not the 0.5 s a footer of "callers wait up to 0.5 s" under it would promise
    assert command("conf", "set", URL, "--rate", "20", "--cache", "0.2", "--enable").code == 0
    daily = ("--rate", "50000", "--quota-period", "day", "--enable")
    assert command("conf", "set", URL, *daily).code == 0
    listed = command("conf", "list").out
    assert "wait <= 0.2 s" in row_line(listed, "50000")
    assert listed.splitlines()[-1] == (
        "cache NULL: the row counts as default_cache = 0.5 s; an interface with several "
        "rows waits up to the smallest cache of its rows"
    )
    assert "callers wait up to default_cache" not in listed


def test_a_paced_quotas_burst_below_1_is_refused_as_its_burst(
    command: Command, migrated_any_db: tuple[str, Engine]
) -> None:
    """``maxPermits`` on a paced quota is its burst, not a token bucket's capacity."""
    argv = ("conf", "set", URL, "--rate", "5", "--quota-period", "day", "--pacing")
    ran = command(*argv, "--max-permits", "0")
    assert ran.code == 2
    assert "argument --max-permits: 0: a paced quota's burst must be at least 1" in ran.err
    assert "token_bucket" not in ran.err
    assert json.loads(command("conf", "list", "--json").out)["rows"] == []
    ran = command(*argv, "--max-permits", "3", "--enable")
    assert ran.code == 0, ran.err
    assert "paced, burst 3" in ran.out
    listed = command("conf", "list")
    assert "5 per day, calendar, paced, burst 3, wait <= " in row_line(listed.out, "5")
    assert "burst" in command("conf", "set", "--help").out.split("--max-permits", 2)[-1]


def test_a_renewal_is_stored_as_every_view_shows_it(
    command: Command, migrated_any_db: tuple[str, Engine]
) -> None:
    ran = command(
        *("conf", "set", URL, "--rate", "700", "--quota-period", "week", "--renews", "Mon 0:00")
    )
    assert ran.code == 0, ran.err
    (stored,) = json.loads(command("conf", "list", "--json").out)["rows"]
    assert stored["quotaRenews"] == "mon 00:00"
    assert "from mon 00:00" in command("conf", "list").out


def test_enabling_a_row_the_reload_would_skip_names_its_column_once(
    command: Command, migrated_any_db: tuple[str, Engine]
) -> None:
    _, engine = migrated_any_db
    write_row(engine, URL, rateLimit=3, quotaPeriod="day", timeZone="Asia/Beijing", status=0)
    ran = command("conf", "enable", URL, "--quota-period", "day")
    assert ran.code == 2
    assert "timeZone 'Asia/Beijing' is not" in ran.err
    assert "timeZone: timeZone" not in ran.err
