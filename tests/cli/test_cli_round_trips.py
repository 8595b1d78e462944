"""The command line changes the real tables as it says: each change is checked with SQL.

Every test runs on MariaDB and on SQLite (``any_db``); the CLI runs in-process through
``main(argv)``, and as a real process where the process boundary is the point.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, text

from gateway_limiter import GatewayLimiter
from gateway_limiter.backends.state import bucket_key
from gateway_limiter.config.migrate import VERSION_TABLE, head_revision
from gateway_limiter.config.rules import build_rules
from gateway_limiter.config.table import make_engine, read_rows
from tests.support.commandline import cli, settings_file
from tests.support.limiting import write_row
from tests.support.services import RedisServer

ANSI = "\x1b"


#: No settings.toml or GATEWAY_LIMITER_* from the developer's machine leak in.
pytestmark = pytest.mark.usefixtures("no_local_settings")


def conf_rows(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        result = conn.execute(
            text(
                "select configId, channelType, interfaceNo, interfaceUrl, rateLimit, cache, "
                "status from t_ratelimite_conf order by configId"
            )
        )
        return [dict(r._mapping) for r in result]


def switch_value(engine: Engine) -> object:
    with engine.connect() as conn:
        return conn.execute(
            text("select enabled from t_ratelimite_switch where switchId = 1")
        ).scalar_one()


def test_db_upgrade_creates_the_tables_and_says_from_which_revision(
    capsys: pytest.CaptureFixture[str], any_db: str
) -> None:
    engine = make_engine(any_db)
    head = head_revision(engine)
    try:
        ran = cli(capsys, "--database-url", any_db, "db", "upgrade")
        assert ran.code == 0, ran.err
        assert "from an empty schema" in ran.out
        assert f"to revision {head}" in ran.out
        with engine.connect() as conn:
            assert conn.execute(text("select count(*) from t_ratelimite_conf")).scalar_one() == 0
            version = conn.execute(text(f"select version_num from {VERSION_TABLE}")).scalar_one()
        assert version == head
        assert switch_value(engine) is None  # the one switch row, following the settings

        again = cli(capsys, "--database-url", any_db, "db", "upgrade")
        assert again.code == 0
        assert "already at revision" in again.out
        current = cli(capsys, "db", "current", "--database-url", any_db)  # options after too
        assert current.code == 0
        assert f"revision {head} (head, up to date)" in current.out
    finally:
        engine.dispose()


def test_conf_set_creates_a_disabled_row_then_updates_only_what_it_is_given(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    url, engine = migrated_any_db
    url_args = ("--database-url", url)
    ran = cli(
        capsys,
        *url_args,
        "conf",
        "set",
        "/ibe/flight/search",
        "--rate",
        "20",
        "--cache",
        "0.2",
        "--channel",
        "IBE+",
        "--interface-no",
        "S01",
    )
    assert ran.code == 0, ran.err
    [row] = conf_rows(engine)
    assert row["interfaceUrl"] == "/ibe/flight/search"
    assert (row["rateLimit"], row["status"]) == (20, 0)  # new rows start disabled
    assert row["cache"] == pytest.approx(0.2)
    assert (row["channelType"], row["interfaceNo"]) == ("IBE+", "S01")
    assert f"created configId {row['configId']}" in ran.out
    assert "conf enable /ibe/flight/search" in ran.out

    ran = cli(capsys, *url_args, "conf", "set", "/ibe/flight/search", "--rate", "10", "--enable")
    assert ran.code == 0, ran.err
    [updated] = conf_rows(engine)
    assert updated["configId"] == row["configId"]
    assert (updated["rateLimit"], updated["status"]) == (10, 1)
    assert updated["cache"] == pytest.approx(0.2)  # not given: unchanged
    assert (updated["channelType"], updated["interfaceNo"]) == ("IBE+", "S01")
    assert "rateLimit 20 -> 10" in ran.out
    assert "status 0 -> 1" in ran.out
    assert "limited to 10/s" in ran.out

    ran = cli(
        capsys, *url_args, "conf", "set", "/ibe/flight/search", "--rate", "10", "--channel", ""
    )
    assert ran.code == 0, ran.err
    [cleared] = conf_rows(engine)
    assert cleared["channelType"] is None
    assert cleared["status"] == 1  # neither --enable nor --disable: unchanged


def test_conf_set_of_rate_zero_closes_the_interface(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    url, engine = migrated_any_db
    argv = ["--database-url", url, "conf", "set", "/ibe/fare/quote", "--rate", "0", "--enable"]
    ran = cli(capsys, *argv)
    assert ran.code == 0, ran.err
    [row] = conf_rows(engine)
    assert (row["rateLimit"], row["status"], row["cache"]) == (0, 1, None)
    assert "closed" in ran.out


def test_conf_enable_and_disable_flip_every_row_of_that_url_only(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    url, engine = migrated_any_db
    first = write_row(engine, "/ibe/booking/create", rateLimit=5, status=0)
    second = write_row(engine, "/ibe/booking/create", add=True, rateLimit=3, status=0)
    other = write_row(engine, "/ibe/other", rateLimit=7, status=0)

    ran = cli(capsys, "--database-url", url, "conf", "enable", "/ibe/booking/create")
    assert ran.code == 0, ran.err
    status = {r["configId"]: r["status"] for r in conf_rows(engine)}
    assert status == {first: 1, second: 1, other: 0}
    assert "enabled 2 rows" in ran.out
    assert f"configId {second}" in ran.out  # the stricter row applies, and it says so

    ran = cli(capsys, "--database-url", url, "conf", "disable", "/ibe/booking/create")
    assert ran.code == 0, ran.err
    status = {r["configId"]: r["status"] for r in conf_rows(engine)}
    assert status == {first: 0, second: 0, other: 0}
    assert "not limited" in ran.out


def test_conf_list_shows_every_row_and_the_same_skips_as_the_reload(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    url, engine = migrated_any_db
    good = write_row(
        engine, "/ibe/flight/search", rateLimit=20, status=1, cache=0.2, channelType="IBE+"
    )
    write_row(engine, "/ibe/no/rate", rateLimit=None, status=1)
    write_row(engine, "/ibe/bad/cache", rateLimit=5, status=1, cache=-0.5)
    write_row(engine, "/ibe/disabled", rateLimit=5, status=0)
    write_row(engine, "/ibe/dup", rateLimit=9, status=1)
    write_row(engine, "/ibe/dup", add=True, rateLimit=4, status=1)

    ran = cli(capsys, "--database-url", url, "conf", "list")
    assert ran.code == 0, ran.err
    assert ANSI not in ran.out  # piped output: plain text
    lines = ran.out.splitlines()
    assert lines[0] == "switch: on (settings default)"
    header = lines[1].split()
    assert header[:9] == [
        "configId",
        "channelType",
        "interfaceNo",
        "interfaceUrl",
        "rateLimit",
        "cache",
        "status",
        "shadow",
        "lastModifyTime",
    ]
    good_line = next(line for line in lines if "/ibe/flight/search" in line)
    expected = [str(good), "IBE+", "NULL", "/ibe/flight/search", "20", "0.2", "1"]
    assert good_line.split()[:7] == expected
    assert "20/s" in good_line
    for path in ("/ibe/no/rate", "/ibe/bad/cache", "/ibe/disabled", "/ibe/dup"):
        assert path in ran.out
    # The CLI and the reload agree: every row build_rules skips is listed with its reason.
    skipped = build_rules(read_rows(engine), 0.5).skipped
    assert len(skipped) == 3  # NULL rate, negative cache, the laxer duplicate
    for s in skipped:
        assert f"skipped by the reload: {s}" in lines


def test_switch_on_off_default_round_trip_and_status_says_where_it_comes_from(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    url, engine = migrated_any_db
    db = ("--database-url", url)

    ran = cli(capsys, *db, "switch", "status")
    assert ran.code == 0, ran.err
    assert "switch on (settings default" in ran.out

    ran = cli(capsys, *db, "switch", "off")
    assert ran.code == 0, ran.err
    assert switch_value(engine) == 0
    assert "switch off (database row)" in ran.out
    assert "switch off (database row)" in cli(capsys, *db, "switch", "status").out

    ran = cli(capsys, *db, "switch", "on")
    assert ran.code == 0, ran.err
    assert switch_value(engine) == 1
    assert "switch on (database row)" in cli(capsys, *db, "switch", "status").out

    ran = cli(capsys, *db, "switch", "default")
    assert ran.code == 0, ran.err
    assert switch_value(engine) is None
    assert "switch on (settings default" in cli(capsys, *db, "switch", "status").out


def test_switch_status_follows_the_switch_setting_when_the_row_is_null(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine], tmp_path: Path
) -> None:
    url, _ = migrated_any_db
    settings = tmp_path / "off.toml"
    settings.write_text("switch = false\n")
    ran = cli(capsys, "--settings", str(settings), "--database-url", url, "switch", "status")
    assert ran.code == 0, ran.err
    assert "switch off (settings default: switch = false" in ran.out


def _stored_permits(out: str, url: str) -> float:
    line = next(line for line in out.splitlines() if line.startswith(url + " "))
    # interfaceUrl configId rate/s cache s capacity stored permits debt ms state...
    return float(line.split()[5])


def test_status_shows_live_bucket_state_from_redis_after_acquisitions(
    capsys: pytest.CaptureFixture[str],
    migrated_any_db: tuple[str, Engine],
    redis_server: RedisServer,
    key_prefix: str,
    tmp_path: Path,
) -> None:
    url, engine = migrated_any_db
    write_row(engine, "/ibe/flight/search", rateLimit=10, status=1, cache=0.5)
    write_row(engine, "/ibe/fare/quote", rateLimit=0, status=1)
    settings = settings_file(tmp_path, url, redis_server.url, key_prefix)
    with GatewayLimiter.from_settings(settings) as limiter:
        taken_at = time.monotonic()
        admitted = sum(limiter.try_acquire("/ibe/flight/search", timeout=0) for _ in range(6))
    assert admitted == 6
    client: redis.Redis = redis_server.client()
    assert client.exists(bucket_key(key_prefix, "/ibe/flight/search")) == 1

    ran = cli(capsys, "--settings", str(settings), "status")
    since = time.monotonic() - taken_at  # a loaded host may take a second or more
    assert ran.code == 0, ran.err
    assert ANSI not in ran.out
    assert f"key prefix {key_prefix}" in ran.out
    stored = _stored_permits(ran.out, "/ibe/flight/search")
    assert 3.5 <= stored <= min(10, 4 + 10 * since) + 0.01  # 10 - 6, plus what refilled since
    assert re.search(r"^/ibe/fare/quote .*closed", ran.out, re.MULTILINE)

    only = cli(capsys, "--settings", str(settings), "status", "/ibe/flight/search")
    assert only.code == 0, only.err
    assert "/ibe/flight/search" in only.out
    assert "/ibe/fare/quote" not in only.out
    client.close()


def test_status_of_a_url_without_a_rule_says_why_it_is_not_limited(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    url, engine = migrated_any_db
    write_row(engine, "/ibe/disabled", rateLimit=5, status=0)
    ran = cli(capsys, "--database-url", url, "status", "/ibe/disabled")
    assert ran.code == 0, ran.err
    assert "/ibe/disabled is not limited: its row is disabled" in ran.out
    ran = cli(capsys, "--database-url", url, "status", "/ibe/unknown")
    assert "/ibe/unknown is not limited: no row" in ran.out


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_LIMITER_")}


def test_python_dash_m_and_the_console_script_run_as_real_processes(
    migrated_any_db: tuple[str, Engine], tmp_path: Path
) -> None:
    url, engine = migrated_any_db
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway_limiter",
            "--database-url",
            url,
            "conf",
            "set",
            "/ibe/flight/search",
            "--rate",
            "12",
            "--enable",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_environment(),
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert [(r["rateLimit"], r["status"]) for r in conf_rows(engine)] == [(12, 1)]

    script = Path(sys.executable).with_name("gateway-limiter")
    assert script.exists(), "pip install -e . installs the console script"
    listed = subprocess.run(
        [str(script), "--database-url", url, "conf", "list"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_environment(),
        timeout=60,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    assert "/ibe/flight/search" in listed.stdout
    assert ANSI not in listed.stdout
    assert listed.stderr == ""
