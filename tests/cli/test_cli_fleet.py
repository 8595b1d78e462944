"""``gateway-limiter fleet`` lists the live processes; ``status`` counts them."""

from __future__ import annotations

import os

import pytest
from sqlalchemy import Engine

from tests.support.commandline import cli
from tests.support.limiting import limiter, write_row
from tests.support.services import RedisServer

pytestmark = pytest.mark.usefixtures("no_local_settings")


def test_fleet_lists_each_live_process_and_status_counts_them(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    migrated_db: tuple[str, Engine],
    private_redis: RedisServer,
    key_prefix: str,
) -> None:
    monkeypatch.setenv("GATEWAY_LIMITER_KEY_PREFIX", key_prefix)
    url, engine = migrated_db
    write_row(engine, "/f", rateLimit=5, cache=0.0)
    lims = [limiter(url, private_redis.url, key_prefix) for _ in range(2)]
    try:
        common = ("--redis-url", private_redis.url)
        ran = cli(capsys, *common, "fleet")
        assert ran.code == 0, ran.err
        lines = ran.out.splitlines()
        assert lines[0] == f"fleet: 2 live processes in {key_prefix}:fleet on {private_redis.url}"
        assert lines[1].split() == ["host", "pid", "since", "version", "last", "seen", "s", "ago"]
        rows = [line.split() for line in lines[2:]]
        assert len(rows) == 2
        assert all(r[1] == str(os.getpid()) for r in rows)
        assert all(float(r[-1]) < 3.0 for r in rows)  # beaten within the last heartbeats
        status = cli(capsys, *common, "--database-url", url, "status")
        assert status.code == 0, status.err
        assert "fleet: 2 live processes" in status.out
    finally:
        for lim in lims:
            lim.close()
    ran = cli(capsys, "--redis-url", private_redis.url, "fleet")
    assert ran.out.startswith("fleet: 0 live processes")  # both left when they closed
    private_redis.kill()
    ran = cli(capsys, "--redis-url", private_redis.url, "fleet")
    assert ran.code == 1
    assert "cannot read the fleet from" in ran.err


def test_fleet_on_memory_says_there_is_nothing_shared(capsys: pytest.CaptureFixture[str]) -> None:
    ran = cli(capsys, "--redis-url", "memory://", "fleet")
    assert ran.code == 0
    assert "fleet of one" in ran.out
