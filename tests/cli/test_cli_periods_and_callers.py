"""``conf set --period S --per-caller``: a URL gets a row for each period and scope, the
reload applies all of them, ``conf list`` and ``status`` show them, ``conf enable`` /
``disable`` can pick one, and combinations the reload would skip are refused before
anything is written. On MariaDB and on SQLite, checked with plain SQL."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.cli import main
from gateway_limiter.config.rules import MAX_PERIOD, Rule, build_rules
from gateway_limiter.config.table import read_rows
from tests.support.commandline import conf_columns, settings_file
from tests.support.commandline import db_cli as cli
from tests.support.services import RedisServer

URL = "/ibe/flight/search"


#: No settings.toml or GATEWAY_LIMITER_* from the developer's machine leak in.
pytestmark = pytest.mark.usefixtures("no_local_settings")


def table(engine: Engine) -> list[tuple[Any, ...]]:
    columns = ("interfaceUrl", "rateLimit", "status", "algorithm", "periodSeconds", "perCaller")
    return conf_columns(engine, *columns)


def applied(engine: Engine, url: str = URL) -> Rule:
    ruleset = build_rules(read_rows(engine), 0.5)
    assert ruleset.skipped == (), ruleset.skipped
    return ruleset.rules[url]


def test_conf_set_keeps_a_row_for_each_period_and_scope_and_the_reload_applies_all(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_any_db
    assert cli(capsys, db, "conf", "set", URL, "--rate", "5", "--enable").code == 0
    ran = cli(capsys, db, "conf", "set", URL, "--rate", "200", "--period", "60", "--enable")
    assert ran.code == 0, ran.err
    assert "periodSeconds 60, perCaller 0" in ran.out
    assert "limited to 5/s (token_bucket: bursts of up to 5) and 200 per 60 s" in ran.out
    ran = cli(capsys, db, "conf", "set", URL, "--rate", "2", "--per-caller", "--enable")
    assert ran.code == 0, ran.err
    assert "2/s for each caller" in ran.out
    # the same period and scope again: that row is updated, no new one
    ran = cli(capsys, db, "conf", "set", URL, "--rate", "180", "--period", "60")
    assert ran.code == 0, ran.err
    assert "rateLimit 200 -> 180" in ran.out

    rows = table(engine)
    assert [r[1:] for r in rows] == [
        (URL, 5, 1, "token_bucket", 1, 0),
        (URL, 180, 1, "token_bucket", 60, 0),
        (URL, 2, 1, "token_bucket", 1, 1),
    ]
    rule = applied(engine)
    assert [(r.rate, r.period, r.per_caller) for r in rule.limits] == [
        (5, 1, False),
        (2, 1, True),
        (180, 60, False),
    ]


def test_conf_set_writes_a_fixed_window_the_reload_applies(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_any_db
    argv = ["--rate", "3", "--period", "2", "--algorithm", "fixed_window", "--enable"]
    ran = cli(capsys, db, "conf", "set", URL, *argv)
    assert ran.code == 0, ran.err
    assert "3 per 2 s (fixed_window: at most 3 in each aligned 2 s window)" in ran.out
    rule = applied(engine)
    assert (rule.algorithm, rule.rate, rule.period) == ("fixed_window", 3, 2)


@pytest.mark.parametrize("bad", ["0", "-5", str(MAX_PERIOD + 1), "1.5", "a minute"])
def test_a_bad_period_exits_2_naming_the_flag_and_writes_nothing(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine], bad: str
) -> None:
    db, engine = migrated_any_db
    ran = cli(capsys, db, "conf", "set", URL, "--rate", "5", f"--period={bad}")
    assert ran.code == 2
    assert "argument --period: invalid value" in ran.err
    assert f"from 1 to {MAX_PERIOD}" in ran.err
    assert table(engine) == []


@pytest.mark.parametrize(
    ("scope", "flag", "reason"),
    [
        (["--period", "60"], "--period", "warm_up paces per second"),
        (["--per-caller"], "--per-caller", "warm_up warms the supplier as a whole"),
    ],
)
def test_warm_up_for_another_period_or_per_caller_is_refused(
    capsys: pytest.CaptureFixture[str],
    migrated_any_db: tuple[str, Engine],
    scope: list[str],
    flag: str,
    reason: str,
) -> None:
    db, engine = migrated_any_db
    argv = ["--rate", "5", "--algorithm", "warm_up", "--warmup", "2", *scope]
    ran = cli(capsys, db, "conf", "set", URL, *argv)
    assert ran.code == 2
    assert f"argument {flag}: {reason}" in ran.err
    assert len(ran.err.splitlines()) == 1
    assert table(engine) == []


def test_warm_up_beside_another_limit_is_refused_either_way_round(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_any_db
    assert (
        cli(capsys, db, "conf", "set", URL, "--rate", "200", "--period", "60", "--enable").code == 0
    )
    before = table(engine)
    warm = ["--rate", "5", "--algorithm", "warm_up", "--warmup", "2", "--cache", "0.5"]
    ran = cli(capsys, db, "conf", "set", URL, *warm, "--enable")
    assert ran.code == 2
    assert "the reload would skip configId 2: warm_up cannot be combined" in ran.err
    assert table(engine) == before
    # written disabled, it harms nothing; the other way round is refused too
    assert cli(capsys, db, "conf", "set", URL, *warm).code == 0
    assert cli(capsys, db, "conf", "disable", URL, "--period", "60").code == 0
    assert cli(capsys, db, "conf", "enable", URL, "--period", "1").code == 0
    before = table(engine)
    ran = cli(capsys, db, "conf", "set", URL, "--rate", "200", "--period", "60", "--enable")
    assert ran.code == 2
    assert "would skip configId 2: warm_up cannot be combined" in ran.err
    assert table(engine) == before


def test_conf_enable_and_disable_pick_rows_by_period_and_scope(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_any_db
    for argv in ([], ["--period", "60"], ["--per-caller"]):
        assert cli(capsys, db, "conf", "set", URL, "--rate", "9", *argv).code == 0

    def status() -> list[int]:
        return [row[3] for row in table(engine)]

    assert status() == [0, 0, 0]
    ran = cli(capsys, db, "conf", "enable", URL, "--period", "60")
    assert ran.code == 0, ran.err
    assert "enabled 1 row" in ran.out
    assert status() == [0, 1, 0]
    assert cli(capsys, db, "conf", "enable", URL, "--per-caller").code == 0
    assert status() == [0, 1, 1]
    assert cli(capsys, db, "conf", "disable", URL, "--shared").code == 0
    assert status() == [0, 0, 1]
    assert cli(capsys, db, "conf", "enable", URL).code == 0  # no filter: every row
    assert status() == [1, 1, 1]
    ran = cli(capsys, db, "conf", "disable", URL, "--period", "7")
    assert ran.code == 1
    assert f"no row for URL {URL} per 7 s" in ran.err
    ran = cli(capsys, db, "conf", "enable", URL, "--per-caller", "--shared")
    assert ran.code == 2


def test_conf_list_shows_period_and_scope_and_what_each_row_adds(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, _ = migrated_any_db
    cli(capsys, db, "conf", "set", URL, "--rate", "5", "--cache", "0.3", "--enable")
    cli(capsys, db, "conf", "set", URL, "--rate", "200", "--period", "60", "--enable")
    cli(capsys, db, "conf", "set", URL, "--rate", "2", "--per-caller", "--enable")
    ran = cli(capsys, db, "conf", "list")
    assert ran.code == 0, ran.err
    lines = ran.out.splitlines()
    assert lines[1].split()[-4:] == ["periodSeconds", "perCaller", "callerKey", "effect"]
    cells = [line.split()[10:] for line in lines[2:5]]  # after ... status shadow
    # algorithm maxPermits warmupPeriod periodSeconds perCaller callerKey effect...
    assert [c[3:6] for c in cells] == [["1", "0", "NULL"], ["60", "0", "NULL"], ["1", "1", "NULL"]]
    effects = [" ".join(c[6:]) for c in cells]
    assert effects == [
        "5/s, burst 5, wait <= 0.3 s",
        "200 per 60 s, burst 200, wait <= 0.3 s",  # the interface's budget: the least
        "2/s, burst 2, per caller, wait <= 0.3 s",
    ]


def test_status_shows_every_limit_of_an_interface(
    capsys: pytest.CaptureFixture[str],
    migrated_any_db: tuple[str, Engine],
    redis_server: RedisServer,
    key_prefix: str,
    tmp_path: Path,
) -> None:
    db, _ = migrated_any_db
    cli(capsys, db, "conf", "set", URL, "--rate", "5", "--cache", "0", "--enable")
    cli(capsys, db, "conf", "set", URL, "--rate", "200", "--period", "60", "--enable")
    cli(capsys, db, "conf", "set", URL, "--rate", "2", "--per-caller", "--enable")
    fixed = ["--rate", "3", "--period", "2", "--algorithm", "fixed_window", "--enable"]
    cli(capsys, db, "conf", "set", "/fixed", *fixed)
    settings = settings_file(tmp_path, db, redis_server.url, key_prefix)
    with GatewayLimiter.from_settings(settings) as limiter:
        taken_at = time.monotonic()
        assert sum(limiter.try_acquire(URL, key="a") for _ in range(3)) == 2

    capsys.readouterr()
    assert main(["--settings", str(settings), "status"]) == 0
    since = time.monotonic() - taken_at  # a loaded host may take a second or more
    out = capsys.readouterr().out
    mine = [line.split() for line in out.splitlines() if line.startswith(URL + " ")]
    # interfaceUrl configId rate cache capacity stored debt algorithm state...
    assert [cells[2] for cells in mine] == ["5", "2", "200/60s"]
    # the shared 5/s: 2 taken, refilling since (at most to the full 5)
    assert 2.9 <= float(mine[0][5]) <= min(5, 3 + 5 * since) + 0.01
    assert "per caller: each key has its own bucket" in " ".join(mine[1])
    # 2 taken of 200, refilling at 3.3/s since
    assert 197.9 <= float(mine[2][5]) <= min(200, 198 + 200 / 60 * since) + 0.01
    fixed_line = next(line for line in out.splitlines() if line.startswith("/fixed "))
    assert re.search(r"at most 3 in each aligned 2 s", fixed_line)


def test_a_new_row_beside_others_says_exactly_how_to_enable_it(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_any_db
    ran = cli(capsys, db, "conf", "set", URL, "--rate", "5")
    assert f"enable it with: gateway-limiter conf enable {URL}\n" in ran.out  # the only row
    ran = cli(capsys, db, "conf", "set", URL, "--rate", "200", "--period", "60")
    hint = f"enable it with: gateway-limiter conf enable {URL} --period 60 --shared"
    assert hint in ran.out
    assert cli(capsys, db, *hint.split()[4:]).code == 0  # conf enable URL --period ...
    assert [row[3] for row in table(engine)] == [0, 1]  # that row only
