"""A redis_url the backend refuses (it raises ValueError naming the value) is bad usage
for every command that opens a limiter: exit 2, one ``error:`` line with the password
masked, no traceback, nothing served.

``redis://host/0?foo=bar`` (an unknown query option) belongs here too once the backend
refuses it with a ValueError; until then redis-py fails at the first connect."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.support.commandline import cli

pytestmark = pytest.mark.usefixtures("no_local_settings")

BAD_URLS = {
    "unknown query option": ("redis://h/0?foo=bar", "unknown option foo"),
    "cluster with a query": ("redis+cluster://h:7000/?ssl=true", "options after '?'"),
    "sentinel without a service": (
        "redis+sentinel://u:s3cret@h:26379",
        "name the monitored service",
    ),
}
COMMANDS = {
    "status": ["status"],
    "serve-metrics": ["serve-metrics", "--port", "0"],
    "demo": ["demo", "--seconds", "3"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("case", list(BAD_URLS))
def test_a_redis_url_the_backend_refuses_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str],
    migrated_db: tuple[str, Engine],
    tmp_path: Path,
    command: str,
    case: str,
) -> None:
    url, named = BAD_URLS[case]
    db, _ = migrated_db
    ran = cli(capsys, "--database-url", db, "--redis-url", url, *COMMANDS[command])
    assert ran.code == 2, (ran.out, ran.err)
    assert "Traceback" not in ran.err
    [line] = ran.err.splitlines()
    assert line.startswith("gateway-limiter: error: redis_url ")
    assert named in line
    assert "s3cret" not in ran.out + ran.err
    assert "serving metrics" not in ran.out
