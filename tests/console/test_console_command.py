"""``gateway-limiter console``: listens on loopback by default, serves the page and the
API until SIGTERM (exit 0), and without console_token refuses a non-loopback address
with one line, exit 2, before listening."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from sqlalchemy import Engine

from tests.support.commandline import cli
from tests.support.services import RedisServer, free_port

pytestmark = pytest.mark.usefixtures("no_local_settings")


def test_without_a_token_it_refuses_a_non_loopback_address(
    capsys: pytest.CaptureFixture[str], migrated_db: tuple[str, Engine]
) -> None:
    db, _ = migrated_db
    ran = cli(capsys, "--database-url", db, "console", "--host", "0.0.0.0", "--port", "1")
    assert ran.code == 2
    assert "'0.0.0.0' is not a loopback address and console_token is not set" in ran.err
    assert len(ran.err.strip().splitlines()) == 1


def test_it_serves_until_sigterm(
    migrated_db: tuple[str, Engine], redis_server: RedisServer, key_prefix: str
) -> None:
    db, _ = migrated_db
    port = free_port()
    env = os.environ | {
        "GATEWAY_LIMITER_DATABASE_URL": db,
        "GATEWAY_LIMITER_REDIS_URL": redis_server.url,
        "GATEWAY_LIMITER_KEY_PREFIX": key_prefix,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway_limiter", "console", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith(f"console on http://127.0.0.1:{port}/ (read only")
        deadline = time.monotonic() + 30
        while True:
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/api/switch", timeout=5)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert answer.json()["effective"] is True
        page = httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
        assert 'data-read-only="true"' in page.text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
