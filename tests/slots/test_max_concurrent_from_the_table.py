"""``maxConcurrent`` from the table to the limiter: the reload's checks, ``conf set``,
``conf list``, ``status`` and the ``slot_lease`` setting."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.config.rules import build_rules
from gateway_limiter.config.settings import SettingsError, load_settings
from gateway_limiter.config.table import find_rows, read_rows
from tests.support.commandline import cli, settings_file
from tests.support.limiting import write_row
from tests.support.services import RedisServer

pytestmark = pytest.mark.usefixtures("no_local_settings")


def test_the_reload_reads_max_concurrent_and_skips_a_negative_one_naming_its_row(
    migrated_any_db: tuple[str, Engine],
) -> None:
    _db, engine = migrated_any_db
    write_row(engine, "/capped", rateLimit=10, cache=0.1, maxConcurrent=3)
    write_row(engine, "/zero", rateLimit=10, cache=0.1, maxConcurrent=0)
    bad = write_row(engine, "/negative", rateLimit=10, cache=0.1, maxConcurrent=-1)
    write_row(engine, "/two-rows", rateLimit=10, cache=0.1, maxConcurrent=5)
    write_row(engine, "/two-rows", add=True, rateLimit=100, periodSeconds=60, maxConcurrent=2)
    ruleset = build_rules(read_rows(engine), 0.5)
    assert ruleset.rules["/capped"].max_concurrent == 3
    assert ruleset.rules["/zero"].max_concurrent is None  # 0: no concurrency limit, as NULL
    assert ruleset.rules["/two-rows"].max_concurrent == 2  # the stricter row's cap
    assert "/negative" not in ruleset.rules
    assert [str(s) for s in ruleset.skipped] == [
        f"configId {bad}: maxConcurrent -1 is negative (interfaceUrl '/negative')"
    ]


def test_conf_set_writes_and_clears_max_concurrent_and_conf_list_shows_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'limits.db'}"
    assert cli(capsys, "--database-url", db, "db", "upgrade").code == 0
    ran = cli(capsys, "--database-url", db, "conf", "set", "/x", "--rate", "5", "--enable")
    assert ran.code == 0, ran.err
    listed = cli(capsys, "--database-url", db, "conf", "list")
    assert "maxConcurrent" not in listed.out  # no row has one: the column is left out
    ran = cli(capsys, "--database-url", db, "conf", "set", "/x", "--max-concurrent", "4")
    assert ran.code == 0, ran.err
    assert "maxConcurrent NULL -> 4" in ran.out
    listed = cli(capsys, "--database-url", db, "conf", "list")
    header = listed.out.splitlines()[1].split()
    assert header[-2:] == ["maxConcurrent", "effect"]
    row = next(line for line in listed.out.splitlines() if " /x " in line).split()
    assert row[header.index("maxConcurrent") + 1] == "4"  # the date takes two words
    for cleared in ("0", "none"):
        cli(capsys, "--database-url", db, "conf", "set", "/x", "--max-concurrent", "3")
        ran = cli(capsys, "--database-url", db, "conf", "set", "/x", "--max-concurrent", cleared)
        assert ran.code == 0, ran.err
        assert "maxConcurrent 3 -> NULL" in ran.out
    ran = cli(capsys, "--database-url", db, "conf", "set", "/x", "--max-concurrent", "-2")
    assert ran.code == 2
    assert "'-2'" in ran.err and "--max-concurrent" in ran.err
    from gateway_limiter.config.table import make_engine

    engine = make_engine(db)
    try:
        assert [r.max_concurrent for r in find_rows(engine, "/x")] == [None]
    finally:
        engine.dispose()


def test_status_shows_the_calls_in_flight(
    capsys: pytest.CaptureFixture[str],
    migrated_any_db: tuple[str, Engine],
    redis_server: RedisServer,
    key_prefix: str,
    tmp_path: Path,
) -> None:
    db, engine = migrated_any_db
    write_row(engine, "/capped", rateLimit=100, cache=0.1, maxConcurrent=3)
    write_row(engine, "/plain", rateLimit=100, cache=0.1)
    settings = settings_file(tmp_path, db, redis_server.url, key_prefix)
    with GatewayLimiter.from_settings(settings) as limiter, limiter.slot("/capped"):
        assert [s.in_flight for s in limiter.status()] == [1, None]
        ran = cli(capsys, "--settings", str(settings), "status")
    assert ran.code == 0, ran.err
    header = next(line for line in ran.out.splitlines() if line.startswith("interfaceUrl"))
    assert "in flight" in header
    assert "1/3" in next(line for line in ran.out.splitlines() if line.startswith("/capped "))


def test_slot_lease_is_a_setting_with_an_environment_override(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings(None).slot_lease == 10.0
    monkeypatch.setenv("GATEWAY_LIMITER_SLOT_LEASE", "2.5")
    assert load_settings(None).slot_lease == 2.5
    monkeypatch.setenv("GATEWAY_LIMITER_SLOT_LEASE", "0")
    with pytest.raises(SettingsError, match="slot_lease=0"):
        load_settings(None)
