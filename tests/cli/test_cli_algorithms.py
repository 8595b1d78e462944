"""``conf set --algorithm/--max-permits/--warmup`` write what the reload applies, or nothing.

Every test runs on MariaDB and on SQLite (``migrated_any_db``) and checks the table with
plain SQL. The CLI judges the row it would write with ``rules.algorithm_problem``, the
check the reload makes, so the two can never disagree: a combination ``conf set``
accepts is a rule in force, and one it refuses exits 2, names the flag to change, and
leaves the table exactly as it was.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from gateway_limiter import GatewayLimiter
from gateway_limiter.config.rules import Rule, Skipped, build_rules, rule_from_row
from gateway_limiter.config.table import ConfRow, read_rows
from tests.support.commandline import Ran, cli, settings_file
from tests.support.limiting import write_row
from tests.support.services import RedisServer

URL = "/ibe/flight/search"
COLUMNS = "configId, interfaceUrl, rateLimit, cache, status, algorithm, maxPermits, warmupPeriod"


#: No settings.toml or GATEWAY_LIMITER_* from the developer's machine leak in.
pytestmark = pytest.mark.usefixtures("no_local_settings")


def conf_set(capsys: pytest.CaptureFixture[str], db: str, *argv: str) -> Ran:
    return cli(capsys, "--database-url", db, "conf", "set", *argv)


def table(engine: Engine) -> list[dict[str, Any]]:
    """Every row as plain SQL reads it (FLOAT columns rounded as they were meant)."""
    with engine.connect() as conn:
        result = conn.execute(text(f"select {COLUMNS} from t_ratelimite_conf order by configId"))
        rows = [dict(r._mapping) for r in result]
    for row in rows:
        for column in ("cache", "warmupPeriod"):
            if row[column] is not None:
                row[column] = round(row[column], 4)
    return rows


def applied_rule(engine: Engine, url: str) -> Rule:
    """The rule the reload makes of ``url``'s rows (failing if it skips one)."""
    ruleset = build_rules(read_rows(engine), 0.5)
    assert ruleset.skipped == (), ruleset.skipped
    return ruleset.rules[url]


def assert_refused(ran: Ran, flag: str, *needles: str) -> None:
    """Exit 2, one line on stderr naming ``flag`` (and each needle), nothing on stdout;
    worded as argparse words the flags it refuses itself (``--cache -1``)."""
    assert ran.code == 2, (ran.out, ran.err)
    assert ran.out == ""
    lines = ran.err.splitlines()
    assert len(lines) == 1, ran.err
    assert "Traceback" not in ran.err
    assert lines[0].startswith("gateway-limiter conf set: error: "), lines[0]
    assert lines[0].endswith(" (see 'gateway-limiter conf set --help')"), lines[0]
    assert f"argument {flag}:" in lines[0], lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_conf_set_writes_each_algorithm_and_the_reload_applies_it(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_any_db
    ran = conf_set(capsys, db, "/sw", "--rate", "50", "--algorithm", "sliding_window", "--enable")
    assert ran.code == 0, ran.err
    assert "algorithm sliding_window" in ran.out
    assert "limited to 50/s (sliding_window: never more in any 1 s)" in ran.out
    ran = conf_set(capsys, db, "/tb", "--rate", "20", "--max-permits", "5", "--enable")
    assert ran.code == 0, ran.err
    assert "limited to 20/s (token_bucket: bursts of up to 5)" in ran.out
    ran = conf_set(
        capsys, db, "/wu", "--rate", "20", "--algorithm", "warm_up", "--warmup", "2.5", "--enable"
    )
    assert ran.code == 0, ran.err
    assert "warmupPeriod 2.5" in ran.out
    ran = conf_set(capsys, db, "/plain", "--rate", "8", "--enable")
    assert ran.code == 0, ran.err

    assert [
        (r["interfaceUrl"], r["algorithm"], r["maxPermits"], r["warmupPeriod"])
        for r in table(engine)
    ] == [
        ("/sw", "sliding_window", None, None),
        ("/tb", "token_bucket", 5, None),  # the column's default: token_bucket
        ("/wu", "warm_up", None, 2.5),
        ("/plain", "token_bucket", None, None),
    ]
    assert (applied_rule(engine, "/sw").algorithm, applied_rule(engine, "/sw").burst) == (
        "sliding_window",
        50,
    )
    assert applied_rule(engine, "/tb").burst == 5
    assert (applied_rule(engine, "/wu").algorithm, applied_rule(engine, "/wu").warmup) == (
        "warm_up",
        2.5,
    )
    assert applied_rule(engine, "/plain").burst == 8  # NULL maxPermits: one second's worth


def test_conf_set_changes_only_the_algorithm_columns_it_is_given(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_any_db
    assert conf_set(capsys, db, URL, "--rate", "20", "--max-permits", "40").code == 0

    ran = conf_set(capsys, db, URL, "--rate", "25", "--cache", "0.3")
    assert ran.code == 0, ran.err
    [row] = table(engine)
    assert (row["rateLimit"], row["algorithm"], row["maxPermits"]) == (25, "token_bucket", 40)
    assert "maxPermits" not in ran.out  # unchanged columns are not reported as changes

    ran = conf_set(capsys, db, URL, "--rate", "25", "--max-permits", "none")
    assert ran.code == 0, ran.err
    assert "maxPermits 40 -> NULL" in ran.out
    assert table(engine)[0]["maxPermits"] is None

    ran = conf_set(capsys, db, URL, "--rate", "25", "--algorithm", "warm_up", "--warmup", "4")
    assert ran.code == 0, ran.err
    assert "algorithm token_bucket -> warm_up" in ran.out
    assert "warmupPeriod NULL -> 4" in ran.out

    # Back to a token bucket: the warm-up period has to go too, and says so when given.
    ran = conf_set(
        capsys, db, URL, "--rate", "25", "--algorithm", "token_bucket", "--warmup", "none"
    )
    assert ran.code == 0, ran.err
    [row] = table(engine)
    assert (row["algorithm"], row["maxPermits"], row["warmupPeriod"]) == (
        "token_bucket",
        None,
        None,
    )
    assert row["cache"] == pytest.approx(0.3)  # given once, kept since


# (row already in the table or None, conf set arguments after URL, flag named, needles)
INVALID: dict[str, tuple[dict[str, Any] | None, list[str], str, list[str]]] = {
    "maxPermits on a new sliding window": (
        None,
        ["--algorithm", "sliding_window", "--max-permits", "10"],
        "--max-permits",
        ["token_bucket only"],
    ),
    "maxPermits on a new warm-up": (
        None,
        ["--algorithm", "warm_up", "--warmup", "2", "--max-permits", "10"],
        "--max-permits",
        ["token_bucket only"],
    ),
    "maxPermits zero": (None, ["--max-permits", "0"], "--max-permits", ["maxPermits 0"]),
    "maxPermits negative": (None, ["--max-permits", "-5"], "--max-permits", ["maxPermits -5"]),
    "maxPermits not a number": (None, ["--max-permits", "x"], "--max-permits", ["'x'"]),
    "maxPermits beyond INT(11)": (
        None,
        ["--max-permits", "2147483648"],
        "--max-permits",
        ["'2147483648'"],
    ),
    "warm-up without a period": (
        None,
        ["--algorithm", "warm_up"],
        "--algorithm",
        ["warm_up needs warmupPeriod", "add --warmup S"],
    ),
    "warm-up period zero": (
        None,
        ["--algorithm", "warm_up", "--warmup", "0"],
        "--warmup",
        ["warm_up needs warmupPeriod"],
    ),
    "warm-up period negative": (
        None,
        ["--algorithm", "warm_up", "--warmup", "-1"],
        "--warmup",
        ["warm_up needs warmupPeriod"],
    ),
    "warm-up period over an hour": (
        None,
        ["--algorithm", "warm_up", "--warmup", "3601"],
        "--warmup",
        ["warm_up needs warmupPeriod"],
    ),
    "warm-up period nan": (None, ["--algorithm", "warm_up", "--warmup", "nan"], "--warmup", []),
    "warm-up period inf": (None, ["--algorithm", "warm_up", "--warmup", "inf"], "--warmup", []),
    "warm-up period cleared on a new warm-up": (
        None,
        ["--algorithm", "warm_up", "--warmup", "none"],
        "--warmup",
        ["warm_up needs warmupPeriod"],
    ),
    "warm-up period on a new token bucket": (
        None,
        ["--warmup", "2"],
        "--warmup",
        ["warm_up only", "add --algorithm warm_up"],
    ),
    "warm-up period on a new sliding window": (
        None,
        ["--algorithm", "sliding_window", "--warmup", "2"],
        "--warmup",
        ["warm_up only"],
    ),
    "unknown algorithm": (None, ["--algorithm", "leaky"], "--algorithm", ["'leaky'"]),
    "sliding window on a row with maxPermits": (
        {"maxPermits": 40},
        ["--algorithm", "sliding_window"],
        "--algorithm",
        ["maxPermits 40", "--max-permits none"],
    ),
    "warm-up on a row with maxPermits": (
        {"maxPermits": 40},
        ["--algorithm", "warm_up", "--warmup", "3"],
        "--algorithm",
        ["maxPermits 40", "--max-permits none"],
    ),
    "token bucket on a warm-up row": (
        {"algorithm": "warm_up", "warmupPeriod": 5.0},
        ["--algorithm", "token_bucket"],
        "--algorithm",
        ["warmupPeriod 5", "--warmup none"],
    ),
    "maxPermits on a warm-up row": (
        {"algorithm": "warm_up", "warmupPeriod": 5.0},
        ["--max-permits", "10"],
        "--max-permits",
        ["the row's algorithm is warm_up", "add --algorithm token_bucket"],
    ),
    "clearing a warm-up row's period": (
        {"algorithm": "warm_up", "warmupPeriod": 5.0},
        ["--warmup", "none"],
        "--warmup",
        ["warm_up needs warmupPeriod"],
    ),
    "warm-up period on a sliding-window row": (
        {"algorithm": "sliding_window"},
        ["--warmup", "2"],
        "--warmup",
        ["the row's algorithm is sliding_window", "add --algorithm warm_up"],
    ),
    "a row with an unknown algorithm written by SQL": (
        {"algorithm": "leaky"},
        [],
        "--algorithm",
        ["'leaky'", "add --algorithm"],
    ),
    "a row with maxPermits and a sliding window written by SQL": (
        {"algorithm": "sliding_window", "maxPermits": 9},
        ["--cache", "0.2"],
        "--max-permits",
        ["maxPermits 9", "--max-permits none"],
    ),
}


@pytest.mark.parametrize("case", list(INVALID), ids=list(INVALID))
def test_an_invalid_combination_exits_2_naming_the_flag_and_writes_nothing(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine], case: str
) -> None:
    db, engine = migrated_any_db
    existing, argv, flag, needles = INVALID[case]
    if existing is not None:
        write_row(engine, URL, rateLimit=20, cache=0.5, **existing)
    before = table(engine)
    ran = conf_set(capsys, db, URL, "--rate", "30", *argv)
    assert_refused(ran, flag, *needles)
    assert table(engine) == before


def _conf_row(row: dict[str, Any] | None, given: dict[str, Any]) -> ConfRow:
    """The row the reload would read if ``given`` were written over ``row``."""
    merged: dict[str, Any] = {"algorithm": "token_bucket", "maxPermits": None, "warmupPeriod": None}
    merged |= row or {}
    merged |= given
    return ConfRow(
        config_id=1,
        channel_type=None,
        interface_no=None,
        interface_url=URL,
        rate_limit=30,
        cache=0.5,
        status=1,
        algorithm=merged["algorithm"],
        max_permits=merged["maxPermits"],
        warmup_period=merged["warmupPeriod"],
    )


STARTS: Sequence[dict[str, Any] | None] = (
    None,
    {"maxPermits": 40},
    {"algorithm": "warm_up", "warmupPeriod": 5.0},
    {"algorithm": "sliding_window"},
)
ALGORITHM_ARGS: Sequence[tuple[list[str], dict[str, Any]]] = (
    ([], {}),
    (["--algorithm", "token_bucket"], {"algorithm": "token_bucket"}),
    (["--algorithm", "warm_up"], {"algorithm": "warm_up"}),
    (["--algorithm", "sliding_window"], {"algorithm": "sliding_window"}),
)
MAX_PERMITS_ARGS: Sequence[tuple[list[str], dict[str, Any]]] = (
    ([], {}),
    (["--max-permits", "none"], {"maxPermits": None}),
    (["--max-permits", "10"], {"maxPermits": 10}),
)
WARMUP_ARGS: Sequence[tuple[list[str], dict[str, Any]]] = (
    ([], {}),
    (["--warmup", "none"], {"warmupPeriod": None}),
    (["--warmup", "2.5"], {"warmupPeriod": 2.5}),
)


FlagMix = tuple[list[str], dict[str, Any], list[str], dict[str, Any], list[str], dict[str, Any]]


def flag_mixes(dialect: str) -> list[FlagMix]:
    """Every mix of the three flags on SQLite, where a command costs little; on MariaDB
    a set that still pairs every value of each flag with every value of each other
    (12 of 36): which mixes are refused is the same check on either store, and what
    MariaDB adds (how its columns store and read back a value) shows in any of them."""
    return [
        (alg_argv, alg, mp_argv, mp, wu_argv, wu)
        for i, (alg_argv, alg) in enumerate(ALGORITHM_ARGS)
        for j, (mp_argv, mp) in enumerate(MAX_PERMITS_ARGS)
        for k, (wu_argv, wu) in enumerate(WARMUP_ARGS)
        if dialect == "sqlite" or k == (i + j) % len(WARMUP_ARGS)
    ]


@pytest.mark.parametrize("start", STARTS, ids=["new", "tb40", "warm_up", "sliding_window"])
def test_conf_set_accepts_exactly_the_combinations_the_reload_applies(
    capsys: pytest.CaptureFixture[str],
    migrated_any_db: tuple[str, Engine],
    start: dict[str, Any] | None,
) -> None:
    """Every mix of the three flags over each kind of row: exit 0 and the reload applies
    the row, or exit 2 and the table is untouched, as the reload's own check predicts."""
    db, engine = migrated_any_db
    outcomes = {0: 0, 2: 0}
    for alg_argv, alg, mp_argv, mp, wu_argv, wu in flag_mixes(engine.dialect.name):
        with engine.begin() as conn:
            conn.execute(text("delete from t_ratelimite_conf"))
        if start is not None:
            write_row(engine, URL, rateLimit=20, cache=0.5, **start)
        before = table(engine)
        argv = [*alg_argv, *mp_argv, *wu_argv]
        ran = conf_set(capsys, db, URL, "--rate", "30", "--cache", "0.5", "--enable", *argv)
        expected = rule_from_row(_conf_row(start, alg | mp | wu), 0.5)
        where = f"start {start}, argv {argv}: {ran.out} {ran.err}"
        if isinstance(expected, Skipped):
            assert ran.code == 2, where
            assert table(engine) == before, where
        else:
            assert ran.code == 0, where
            assert isinstance(expected, Rule)
            rule = applied_rule(engine, URL)
            assert (rule.algorithm, rule.capacity, rule.warmup) == (
                expected.algorithm,
                expected.capacity,
                expected.warmup,
            ), where
        outcomes[ran.code] += 1
    assert outcomes[0] > 0
    assert outcomes[2] > 0


def test_conf_list_shows_the_algorithm_columns_and_what_each_row_does(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_any_db
    write_row(engine, "/tb", rateLimit=20, cache=0.2, maxPermits=40)
    write_row(engine, "/sw", rateLimit=50, cache=0.2, algorithm="sliding_window")
    write_row(engine, "/wu", rateLimit=20, cache=0.5, algorithm="warm_up", warmupPeriod=0.1)
    write_row(engine, "/bad", rateLimit=5, algorithm="sliding_window", maxPermits=9)
    ran = cli(capsys, "--database-url", db, "conf", "list")
    assert ran.code == 0, ran.err
    lines = ran.out.splitlines()
    header = lines[1].split()
    assert header[-7:] == [
        "algorithm",
        "maxPermits",
        "warmupPeriod",
        "periodSeconds",
        "perCaller",
        "callerKey",
        "effect",
    ]

    def cells(url: str) -> list[str]:
        line = next(line for line in lines if f" {url} " in line)
        # configId channelType interfaceNo interfaceUrl rateLimit cache status shadow date
        # time ...
        return line.split()[10:]

    # ... algorithm maxPermits warmupPeriod periodSeconds perCaller callerKey effect
    assert cells("/tb")[:6] == ["token_bucket", "40", "NULL", "1", "0", "NULL"]
    assert " ".join(cells("/tb")[6:]) == "20/s, burst 40, wait <= 0.2 s"
    assert cells("/sw")[:6] == ["sliding_window", "NULL", "NULL", "1", "0", "NULL"]
    assert " ".join(cells("/sw")[6:]) == "50/s in any 1 s, wait <= 0.2 s"
    # FLOAT: 0.1 reads back from MySQL as 0.100000001490116; shown as meant.
    assert cells("/wu")[:6] == ["warm_up", "NULL", "0.1", "1", "0", "NULL"]
    assert " ".join(cells("/wu")[6:]) == "20/s, 0.1 s warm-up, wait <= 0.5 s"
    assert cells("/bad")[:7] == ["sliding_window", "9", "NULL", "1", "0", "NULL", "skipped"]
    assert any("maxPermits 9 is invalid for sliding_window" in line for line in lines)


def test_conf_set_warns_when_a_warm_up_cache_cannot_pay_for_a_cold_call(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_any_db
    ran = conf_set(
        capsys, db, URL, "--rate", "20", "--cache", "0.1", "--algorithm", "warm_up", "--warmup", "3"
    )
    assert ran.code == 0, ran.err
    # A cold permit costs about 3 / 20 = 0.15 s: a 0.1 s budget never gets one.
    assert "warning: on a cold warm_up interface the first call waits 148 ms" in ran.out
    assert "give --cache 0.15 or more" in ran.out
    assert table(engine)[0]["algorithm"] == "warm_up"  # a warning, not a refusal

    ran = conf_set(capsys, db, URL, "--rate", "20", "--cache", "0.15")
    assert ran.code == 0, ran.err
    assert "warning" not in ran.out


def test_status_shows_each_algorithm_with_its_live_state(
    capsys: pytest.CaptureFixture[str],
    migrated_any_db: tuple[str, Engine],
    redis_server: RedisServer,
    key_prefix: str,
    tmp_path: Path,
) -> None:
    db, engine = migrated_any_db
    # 1/s: the 4 permits taken need 4 s to come back, longer than this test on a loaded host
    write_row(engine, "/tb", rateLimit=1, cache=0.5, maxPermits=4)
    write_row(engine, "/sw", rateLimit=5, cache=0.0, algorithm="sliding_window")
    write_row(engine, "/wu", rateLimit=20, cache=0.5, algorithm="warm_up", warmupPeriod=2.0)
    settings = settings_file(tmp_path, db, redis_server.url, key_prefix)
    with GatewayLimiter.from_settings(settings) as limiter:
        assert sum(limiter.try_acquire("/tb", timeout=0) for _ in range(6)) == 4
        assert sum(limiter.try_acquire("/sw") for _ in range(7)) == 5
        assert limiter.try_acquire("/wu")  # cold: waits about 3 / 20 s

    ran = cli(capsys, "--settings", str(settings), "status")
    assert ran.code == 0, ran.err
    header = next(line for line in ran.out.splitlines() if line.startswith("interfaceUrl"))
    assert header.split()[-2:] == ["algorithm", "state"]

    def cells(url: str) -> list[str]:
        return next(line for line in ran.out.splitlines() if line.startswith(url + " ")).split()

    tb = cells("/tb")
    # interfaceUrl configId rate/s cache capacity stored used debt next-free
    # effective-rate hold algorithm state...
    assert (tb[2], tb[4], tb[6], tb[9], tb[10], tb[11]) == ("1", "4", "-", "1", "-", "token_bucket")
    assert 0 <= float(tb[5]) < 4  # 4 - 4, plus what refilled since
    assert 0 <= float(tb[8]) <= 1000  # the next permit: at most one interval (1 s) away
    sw = cells("/sw")
    # a window's count of its limit; its next permit once the first admission leaves
    assert (sw[4], sw[5], sw[6], sw[7]) == ("5", "-", "5/5", "-")
    assert 0 < float(sw[8]) <= 1010
    assert (sw[9], sw[10], sw[11]) == ("5", "-", "sliding_window")  # no pushback: the rate
    assert "spent: next permit in" in " ".join(sw)
    wu = cells("/wu")
    # A warm-up bucket holds rate x warmupPeriod = 40 permits; one used, still cold.
    assert (wu[4], wu[11]) == ("40", "warm_up")
    assert float(wu[8]) > 1000 / 20  # cold: a permit costs more than the stable interval
    assert 38 < float(wu[5]) <= 40
    assert "cold: paced below the rate until warm" in " ".join(wu)


def test_conf_set_help_explains_the_flags_and_how_to_clear_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ran = cli(capsys, "conf", "set", "--help")
    assert ran.code == 0
    flat = re.sub(r"\s+", " ", ran.out)
    assert "--algorithm {token_bucket,warm_up,sliding_window,fixed_window}" in flat
    assert "--max-permits N" in flat
    assert "--warmup S" in flat
    assert "Only the columns given change" in flat
    assert "--max-permits none" in flat


def test_conf_set_words_its_own_refusals_as_argparse_words_a_bad_flag(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    """``--max-permits 0`` (refused by the row check) and ``--cache -1`` (by argparse) read
    alike: ``gateway-limiter conf set: error: argument ...``, exit 2; so do the other
    refusals that name a flag of ``conf set``, and ``--channel`` of ``conf enable``."""
    db, engine = migrated_any_db
    by_argparse = conf_set(capsys, db, URL, "--rate", "10", "--cache", "-1")
    by_row_check = conf_set(capsys, db, URL, "--rate", "10", "--max-permits", "0")
    assert_refused(by_argparse, "--cache")
    assert_refused(by_row_check, "--max-permits", "maxPermits 0")
    assert_refused(conf_set(capsys, db, URL, "--rate", "10", "--caller", "app"), "--caller")
    no_rate = conf_set(capsys, db, URL, "--cache", "0.2")
    assert no_rate.code == 2
    assert no_rate.err.startswith("gateway-limiter conf set: error: "), no_rate.err
    assert "a new row needs --rate" in no_rate.err
    enable = cli(capsys, "--database-url", db, "conf", "enable", URL, "--channel", "web")
    assert enable.code == 2, enable.err
    assert enable.err.startswith("gateway-limiter conf enable: error: argument --channel: "), (
        enable.err
    )
    assert table(engine) == []
