"""``status`` (text and ``--json``) shows each limit's priority class (the row's
``priority``) and its reserve (the console's ``/api/status``: tests/console)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.support.commandline import cli, settings_file
from tests.support.limiting import write_row
from tests.support.services import RedisServer

RESERVE = "default=0.1,sheddable_plus=0.3,sheddable=0.5"

pytestmark = pytest.mark.usefixtures("no_local_settings")


def write_class_rows(engine: Engine) -> None:
    write_row(engine, "*", channelType="CL", rateLimit=100, reserve=RESERVE)
    write_row(engine, "/cl/search", channelType="CL", rateLimit=1000, priority="sheddable")
    write_row(engine, "/cl/plain", rateLimit=10)


def test_status_says_each_limits_class_and_reserve(
    capsys: pytest.CaptureFixture[str],
    migrated_db: tuple[str, Engine],
    redis_server: RedisServer,
    key_prefix: str,
    tmp_path: Path,
) -> None:
    db, engine = migrated_db
    write_class_rows(engine)
    settings = settings_file(tmp_path, db, redis_server.url, key_prefix)
    code, out, err = cli(capsys, "--settings", str(settings), "status")
    assert code == 0, err
    lines = out.splitlines()
    search = next(line for line in lines if line.startswith("/cl/search "))
    assert "calls sheddable unless they say" in search
    assert "reserve" not in search  # the reserve is the channel row's
    channel = next(line for line in lines if line.startswith("* (channel CL)"))
    assert f"reserve {RESERVE}" in channel
    plain = next(line for line in lines if line.startswith("/cl/plain "))
    assert "unless they say" not in plain and "reserve" not in plain

    code, out, err = cli(capsys, "--settings", str(settings), "status", "--json")
    assert code == 0, err
    limits = json.loads(out)["limits"]
    got = {(d["interfaceUrl"], d["channelType"]): (d["priority"], d["reserve"]) for d in limits}
    assert got[("/cl/search", "CL")] == ("sheddable", None)
    assert got[("*", "CL")] == (None, RESERVE)
    assert got[("/cl/plain", None)] == (None, None)
