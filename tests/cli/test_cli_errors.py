"""Every expected error: the right exit code, one line on stderr, no traceback, nothing written.

Exit codes: 2 for bad usage (bad values and bad settings are refused before the
database is touched), 1 for anything else. Passwords in URLs never reach the output.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine, inspect, text

from gateway_limiter.config.table import make_engine
from tests.support.commandline import Ran, cli
from tests.support.limiting import write_row

UNREACHABLE = "mysql+pymysql://root:s3cret@127.0.0.1:1/x"


#: No settings.toml or GATEWAY_LIMITER_* from the developer's machine leak in.
pytestmark = pytest.mark.usefixtures("no_local_settings")


def assert_one_line_error(ran: Ran, code: int, *needles: str) -> None:
    assert ran.code == code, (ran.out, ran.err)
    assert "Traceback" not in ran.err
    lines = ran.err.splitlines()
    assert len(lines) == 1, ran.err
    assert "error: " in lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]


def row_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("select count(*) from t_ratelimite_conf")).scalar_one())


BAD_SET_ARGUMENTS = {
    "negative rate": (["/ibe/x", "--rate", "-1"], ["--rate", "'-1'"]),
    "rate not a number": (["/ibe/x", "--rate", "x"], ["--rate", "'x'"]),
    "fractional rate": (["/ibe/x", "--rate", "1.5"], ["--rate", "'1.5'"]),
    "rate beyond INT(11)": (["/ibe/x", "--rate", "2147483648"], ["--rate", "'2147483648'"]),
    "cache too large": (["/ibe/x", "--rate", "5", "--cache", "10"], ["--cache", "'10'"]),
    "negative cache": (["/ibe/x", "--rate", "5", "--cache", "-0.1"], ["--cache", "'-0.1'"]),
    "cache not a number": (["/ibe/x", "--rate", "5", "--cache", "nan"], ["--cache", "'nan'"]),
    "cache finer than FLOAT(3,2)": (
        ["/ibe/x", "--rate", "5", "--cache", "0.125"],
        ["--cache", "'0.125'"],
    ),
    "empty url": (["", "--rate", "5"], ["URL", "''"]),
    "url too long": (["/" + "a" * 128, "--rate", "5"], ["URL", "129 characters"]),
    "url with surrounding space": ([" /ibe/x", "--rate", "5"], ["URL", "whitespace"]),
    "channel too long": (["/ibe/x", "--rate", "5", "--channel", "c" * 25], ["--channel"]),
    "interface-no too long": (
        ["/ibe/x", "--rate", "5", "--interface-no", "n" * 25],
        ["--interface-no"],
    ),
    "rate missing": (["/ibe/x"], ["--rate"]),
    "enable and disable": (["/ibe/x", "--rate", "5", "--enable", "--disable"], ["--disable"]),
}


@pytest.mark.parametrize("case", list(BAD_SET_ARGUMENTS), ids=list(BAD_SET_ARGUMENTS))
def test_conf_set_refuses_bad_values_with_exit_2_and_writes_nothing(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine], case: str
) -> None:
    url, engine = migrated_any_db
    argv, needles = BAD_SET_ARGUMENTS[case]
    ran = cli(capsys, "--database-url", url, "conf", "set", *argv)
    assert_one_line_error(ran, 2, *needles)
    assert row_count(engine) == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["conf", "list"],
        ["conf", "set", "/ibe/x", "--rate", "5"],
        ["conf", "enable", "/ibe/x"],
        ["conf", "disable", "/ibe/x"],
        ["switch", "on"],
        ["switch", "status"],
        ["status"],
        ["db", "upgrade"],
        ["db", "current"],
    ],
    ids=lambda argv: "-".join(argv[:2]),
)
def test_an_unreachable_database_is_one_line_with_the_password_masked(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    ran = cli(capsys, "--database-url", UNREACHABLE, *argv)
    assert_one_line_error(ran, 1, "mysql+pymysql://root:***@127.0.0.1:1/x", "Can't connect")
    assert "s3cret" not in ran.out + ran.err


def test_an_unreachable_database_in_a_real_process_prints_no_traceback(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_LIMITER_")}
    done = subprocess.run(
        [sys.executable, "-m", "gateway_limiter", "--database-url", UNREACHABLE, "conf", "list"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith("gateway-limiter: error: database mysql+pymysql://root:***@")
    assert len(done.stderr.splitlines()) == 1
    assert "s3cret" not in done.stderr


WRITES_AND_READS = [
    ["conf", "list"],
    ["conf", "set", "/ibe/x", "--rate", "5"],
    ["conf", "enable", "/ibe/x"],
    ["switch", "off"],
    ["switch", "status"],
    ["status"],
]


@pytest.mark.parametrize("argv", WRITES_AND_READS, ids=lambda argv: "-".join(argv[:2]))
def test_a_database_without_the_tables_says_to_run_db_upgrade_and_creates_nothing(
    capsys: pytest.CaptureFixture[str], any_db: str, argv: list[str], tmp_path: Path
) -> None:
    if any_db.startswith("sqlite"):
        (tmp_path / "limits.db").touch()  # an existing file with no tables in it
    ran = cli(capsys, "--database-url", any_db, *argv)
    assert_one_line_error(ran, 1, "has no limits tables", "gateway-limiter db upgrade")
    engine = make_engine(any_db)
    try:
        assert inspect(engine).get_table_names() == []
    finally:
        engine.dispose()


@pytest.mark.parametrize("argv", WRITES_AND_READS, ids=lambda argv: "-".join(argv[:2]))
def test_a_missing_sqlite_file_is_not_created_by_a_command_that_needs_the_tables(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str]
) -> None:
    path = tmp_path / "nowhere.db"
    ran = cli(capsys, "--database-url", f"sqlite:///{path}", *argv)
    assert_one_line_error(ran, 1, "does not exist", "gateway-limiter db upgrade")
    assert not path.exists()


def test_enabling_a_url_without_rows_exits_1_and_changes_nothing(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    url, engine = migrated_any_db
    write_row(engine, "/a", rateLimit=5, status=0)
    for action in ("enable", "disable"):
        ran = cli(capsys, "--database-url", url, "conf", action, "/ibe/unknown")
        assert_one_line_error(ran, 1, "no row for URL /ibe/unknown")
    with engine.connect() as conn:
        assert conn.execute(text("select status from t_ratelimite_conf")).scalar_one() == 0


def test_a_url_another_spelling_of_a_row_gets_its_own_row(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    # '/a' and '/A' are two interfaces to the limiter, so to every command, whatever
    # the database's collation says
    url, engine = migrated_any_db
    write_row(engine, "/A", rateLimit=5, status=0)
    ran = cli(capsys, "--database-url", url, "conf", "set", "/a", "--rate", "9", "--enable")
    assert ran.code == 0, ran.err
    expected = [("/A", 5, 0), ("/a", 9, 1)]
    with engine.connect() as conn:
        rows = conn.execute(
            text("select interfaceUrl, rateLimit, status from t_ratelimite_conf order by configId")
        ).all()
    assert [tuple(r) for r in rows] == expected


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ('redis_url = "ftp://x"\n', "setting redis_url=ftp://x"),
        ("reload_interval = -1\n", "setting reload_interval"),
        ("no_such_key = 1\n", "unknown key 'no_such_key'"),
        # a typo gets the nearest key, as a misspelt environment variable does
        ('redis_ulr = "redis://x"\n', "unknown key 'redis_ulr'; did you mean 'redis_url'?"),
        ("reload_intervall = 5\n", "did you mean 'reload_interval'?"),
        ("this is not toml\n", "cannot be read"),
    ],
)
def test_a_bad_settings_file_is_one_line_naming_the_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, needle: str
) -> None:
    settings = tmp_path / "settings.toml"
    settings.write_text(content)
    ran = cli(capsys, "--settings", str(settings), "conf", "list")
    assert_one_line_error(ran, 2, needle)  # bad usage, as the command-line reference says


@pytest.mark.parametrize("scheme", ["mysql", "mariadb"])
def test_a_mysql_url_without_a_driver_suggests_pymysql(
    capsys: pytest.CaptureFixture[str], scheme: str
) -> None:
    ran = cli(capsys, "--database-url", f"{scheme}://root:pw@127.0.0.1/test", "conf", "list")
    assert_one_line_error(ran, 2, f"use {scheme}+pymysql://root:***@127.0.0.1/test")
    assert "pw@" not in ran.err


def test_an_unknown_keyword_setting_names_the_nearest() -> None:
    from gateway_limiter.config.settings import Settings, load_settings

    with pytest.raises(TypeError, match="did you mean 'key_prefix'"):
        load_settings(environ={}, key_prefx="x")
    with pytest.raises(TypeError, match="did you mean 'redis_timeout'"):
        Settings().replace(redis_timout=1.0)


def test_a_missing_settings_file_and_a_bad_database_url_are_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ran = cli(capsys, "--settings", str(tmp_path / "absent.toml"), "conf", "list")
    assert_one_line_error(ran, 2, "does not exist")
    ran = cli(capsys, "--database-url", "nosuchdriver://u:pw@h/db", "conf", "list")
    assert_one_line_error(ran, 2, "nosuchdriver://u:***@h/db")
    assert "pw@" not in ran.err


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["conf"],
        ["frobnicate"],
        ["switch", "maybe"],
        ["demo", "--seconds", "2"],
        ["demo", "--seconds", "x"],
        ["status", "/a", "/b"],
    ],
    ids=lambda argv: " ".join(argv) or "nothing",
)
def test_bad_usage_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    ran = cli(capsys, *argv)
    assert_one_line_error(ran, 2)
    assert ran.err.startswith("gateway-limiter")


def test_help_exits_0_and_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    ran = cli(capsys, "--help")
    assert ran.code == 0
    for command in ("db", "conf", "switch", "status", "demo"):
        assert command in ran.out
    ran = cli(capsys, "conf", "set", "--help")
    assert ran.code == 0
    for option in ("--rate", "--cache", "--channel", "--interface-no", "--enable", "--disable"):
        assert option in ran.out
