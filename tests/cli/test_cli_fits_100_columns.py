"""``conf list`` and ``status`` fit 100 columns, pick rows by URL glob, channel, status and
algorithm, and print JSON for scripts.

Rows with long URLs and nearly every column populated, on a real MariaDB and Redis. On a
terminal (rich, as a 100-column one draws it) and piped with ``COLUMNS=100``, every line
fits: the columns ``effect`` or ``state`` already say are left out first (a line names
them), then the URL and the effect fold onto more lines, so nothing shown is lost.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from tests.support.commandline import cli, settings_file
from tests.support.limiting import write_row
from tests.support.services import RedisServer

WIDTH = 100
CSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
LONG = "/ibe/flight/search/availability/with/a/very/long/path/that/suppliers/love/v2/{i}"
DAILY = "/sup/daily/quota/of/a/supplier/that/counts/per/calendar/day/and/never/more"
PACED = "/sup/paced/calendar/quota"


@pytest.fixture
def settings(
    migrated_db: tuple[str, Engine],
    redis_server: RedisServer,
    key_prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Path:
    for key in list(os.environ):
        if key.startswith("GATEWAY_LIMITER_") or key in ("COLUMNS", "FORCE_COLOR"):
            monkeypatch.delenv(key)
    db, engine = migrated_db
    for i in range(3):
        write_row(
            engine,
            LONG.format(i=i),
            rateLimit=1000 + i,
            cache=0.25,
            channelType="IBE+",
            interfaceNo=f"IBE-{i:04d}-AVAIL",
            maxPermits=5000,
            maxConcurrent=40,
            leaseMs=20,
        )
    write_row(
        engine,
        "/ibe/fare/quote/per/caller/limit/for/one/named/partner",
        rateLimit=7,
        perCaller=1,
        callerKey="partner-with-a-long-key-0001",
        algorithm="sliding_window",
        periodSeconds=60,
        channelType="IBE+",
    )
    write_row(engine, "/ibe/booking/create", rateLimit=5, algorithm="warm_up", warmupPeriod=10.0)
    write_row(engine, DAILY, rateLimit=3, periodSeconds=86_400, algorithm="fixed_window")
    write_row(engine, "/sup/hourly", rateLimit=10, periodSeconds=3600, algorithm="sliding_window")
    write_row(engine, "/ibe/seat/map", rateLimit=50, status=0, channelType="OTHER")
    # a paced calendar quota between permits: its state says the pacing, the burst, the
    # next permit and the renewal
    write_row(
        engine,
        PACED,
        rateLimit=100,
        maxPermits=2,
        quotaPeriod="day",
        timeZone="Asia/Shanghai",
        quotaPacing=1,
    )
    path = settings_file(tmp_path, db, redis_server.url, key_prefix)
    with GatewayLimiter.from_settings(path) as gateway:
        assert [gateway.try_acquire(DAILY, timeout=0) for _ in range(4)] == [True] * 3 + [False]
        assert gateway.try_acquire("/sup/hourly", timeout=0)
        assert [gateway.try_acquire(PACED, timeout=0) for _ in range(3)] == [True] * 2 + [False]
    return path


def lines_of(out: str) -> list[str]:
    return [CSI.sub("", line).rstrip() for line in out.replace("\r", "\n").split("\n")]


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "piped"])
@pytest.mark.parametrize("command", [["conf", "list"], ["status"]], ids=["conf-list", "status"])
def test_every_line_fits_100_columns(
    capsys: pytest.CaptureFixture[str],
    settings: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: list[str],
    terminal: bool,
) -> None:
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    if terminal:
        monkeypatch.setenv("FORCE_COLOR", "1")
    ran = cli(capsys, "--settings", str(settings), *command)
    assert ran.code == 0, ran.err
    lines = lines_of(ran.out)
    assert [line for line in lines if len(line) > WIDTH] == [], ran.out
    text = "\n".join(lines)
    assert re.search(r"left out to fit 100 columns: \S", text), text
    # the long URLs and the effects fold onto more lines: nothing is cut
    assert "…" not in text
    for url in (LONG.format(i=0)[:20], DAILY[:20], "/sup/hourly", "/ibe/booking/create"):
        assert url in text, text
    if command == ["status"]:
        words = " ".join(text.split())
        assert "spent: used 2 of 100; paced, burst 2, next permit in " in words, text


def test_conf_list_filters_by_url_channel_status_and_algorithm(
    capsys: pytest.CaptureFixture[str], settings: Path
) -> None:
    def listed(*filters: str) -> list[str]:
        ran = cli(capsys, "--settings", str(settings), "conf", "list", "--json", *filters)
        assert ran.code == 0, ran.err
        return [row["interfaceUrl"] for row in json.loads(ran.out)["rows"]]

    assert listed("--url", "/ibe/flight/*") == [LONG.format(i=i) for i in range(3)]
    assert listed("--channel", "OTHER") == ["/ibe/seat/map"]
    assert listed("--status", "0") == ["/ibe/seat/map"]
    assert listed("--algorithm", "sliding_window", "--channel", "IBE+") == [
        "/ibe/fare/quote/per/caller/limit/for/one/named/partner"
    ]
    assert listed("--url", "/nothing/*") == []
    ran = cli(capsys, "--settings", str(settings), "conf", "list", "--url", "/nothing/*")
    assert ran.code == 0 and "no row of 9 matches the filters" in ran.out


def test_conf_list_json_holds_every_column_and_the_effect(
    capsys: pytest.CaptureFixture[str], settings: Path
) -> None:
    ran = cli(capsys, "--settings", str(settings), "conf", "list", "--json", "--url", DAILY)
    assert ran.code == 0, ran.err
    [row] = json.loads(ran.out)["rows"]
    assert row["rateLimit"] == 3 and row["periodSeconds"] == 86_400
    assert row["algorithm"] == "fixed_window" and row["status"] == 1
    assert "3 per 86400 s" in row["effect"] or "3/86400" in row["effect"], row["effect"]
    assert row["skipped"] is None and isinstance(row["lastModifyTime"], str)


def test_status_json_shows_used_of_limit_and_time_to_reset_for_windows(
    capsys: pytest.CaptureFixture[str], settings: Path
) -> None:
    ran = cli(capsys, "--settings", str(settings), "status", "--json")
    assert ran.code == 0, ran.err
    shown = {s["interfaceUrl"]: s for s in json.loads(ran.out)["limits"]}
    daily = shown[DAILY]
    assert (daily["used"], daily["rateLimit"], daily["condition"]) == (3, 3, "spent")
    assert 0 < daily["resetMs"] <= 86_400_000 and daily["nextFreeMs"] == daily["resetMs"]
    assert daily["effectiveRate"] == 3  # no pushback: the limit itself
    hourly = shown["/sup/hourly"]
    assert (hourly["used"], hourly["condition"], hourly["nextFreeMs"]) == (1, "ok", 0)
    assert 3_500_000 < hourly["resetMs"] <= 3_600_010
    ran = cli(capsys, "--settings", str(settings), "status", "--json", "--status", "spent")
    # the paced quota between permits is spent too
    assert [s["interfaceUrl"] for s in json.loads(ran.out)["limits"]] == [DAILY, PACED]
    ran = cli(capsys, "--settings", str(settings), "status", "--json", "--url", "/sup/*")
    assert sorted(s["interfaceUrl"] for s in json.loads(ran.out)["limits"]) == sorted(
        [DAILY, "/sup/hourly", PACED]
    )


def test_status_shows_a_spent_daily_window_as_spent_with_its_reset(
    capsys: pytest.CaptureFixture[str], settings: Path
) -> None:
    ran = cli(capsys, "--settings", str(settings), "status", "--url", "/sup/*")
    assert ran.code == 0, ran.err
    text = " ".join(ran.out.split())
    assert "3/3" in text and "spent: refused until it resets in" in text
    assert "window state not shown" not in text and "pushback" not in text
    assert "1/10" in text and "all back in 59 min" in text
