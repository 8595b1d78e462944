"""What a new user sees at INFO: short lines from the library (no object dumps from a
client library's exception), and none of APScheduler's own chatter."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway_limiter.config.reload import SCHEDULER_LOGGER, Registry
from gateway_limiter.config.settings import Settings
from gateway_limiter.observe.logs import LINE_LIMIT, one_line
from tests.support.services import free_port

REDIS_REPR = (
    "No master found for 'gwl' : <redis.asyncio.client.Redis(<redis.asyncio.connection."
    "ConnectionPool(<redis.asyncio.connection.Connection(db=0,socket_timeout=0.05,"
    + "x=1," * 300
    + ")>)>)>"
)


def test_an_object_repr_in_a_message_is_cut() -> None:
    assert one_line(f"MasterNotFoundError: {REDIS_REPR}") == (
        "MasterNotFoundError: No master found for 'gwl' ..."
    )
    assert one_line("ValueError: bad <foo.Bar object at 0x7f00> there") == "ValueError: bad ..."


def test_a_long_message_is_cut_to_the_limit() -> None:
    line = one_line("ConnectionError: " + "no route " * 100)
    assert len(line) <= LINE_LIMIT
    assert line.startswith("ConnectionError: no route") and line.endswith(" ...")
    assert one_line("short <not a repr> and a <b> tag") == "short <not a repr> and a <b> tag"


def test_a_password_cut_in_the_middle_is_still_masked() -> None:
    url = "redis://gateway:" + "s" * 400 + "@cache:6379/0"
    line = one_line(f"ConnectionError: {url} refused")
    assert "sss" not in line
    assert "redis://gateway:***@cache:6379/0" in line


SCRIPT = """
import asyncio, logging, sys
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
from gateway_limiter.aio import AsyncGatewayLimiter

async def main():
    async with AsyncGatewayLimiter(
        database_url="sqlite://", redis_url=sys.argv[1], reload_interval=60
    ) as limiter:
        print(await limiter.try_acquire("/x"))

asyncio.run(main())
"""


def test_an_unreachable_sentinel_is_one_short_line_and_the_scheduler_is_quiet(
    tmp_path: Path,
) -> None:
    url = f"redis+sentinel://127.0.0.1:{free_port()}/gwl"  # nothing listens there
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, url],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    (unreachable,) = [line for line in lines if "Redis unreachable" in line]
    assert unreachable.startswith("ERROR gateway_limiter: Redis unreachable (")
    assert "Error" in unreachable  # the exception's type is kept
    assert len(unreachable) < 400, unreachable
    assert "ConnectionPool" not in unreachable
    assert not [line for line in lines if "apscheduler" in line], done.stderr


@pytest.fixture
def scheduler_logger() -> Iterator[logging.Logger]:
    logger = logging.getLogger(SCHEDULER_LOGGER)
    saved = logger.level  # the suite's conftest sets WARNING for every test
    yield logger
    logger.setLevel(saved)


@pytest.mark.parametrize(
    ("configured", "after"),
    [(logging.NOTSET, logging.WARNING), (logging.DEBUG, logging.DEBUG)],
)
def test_the_scheduler_logger_is_quieted_unless_configured(
    scheduler_logger: logging.Logger, configured: int, after: int
) -> None:
    scheduler_logger.setLevel(configured)
    registry = Registry(Settings(database_url="sqlite://", reload_interval=60))
    registry.start()
    registry.close()
    assert scheduler_logger.level == after
