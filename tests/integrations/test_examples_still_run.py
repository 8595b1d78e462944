"""The integration examples in examples/ (shown in the integrations guide) run as documented, on a
real MariaDB table and a private Redis, against the loopback suppliers they start, and
print what their docstrings promise: so they cannot rot."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.services import RedisServer, fresh_mariadb_database, mariadb_url

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def services() -> Iterator[list[str]]:
    """The example's options for a fresh MariaDB database and a private redis-server."""
    server = RedisServer().start()
    try:
        with fresh_mariadb_database() as name:
            yield ["--database-url", mariadb_url(name), "--redis-url", server.url]
    finally:
        server.stop()


#: The examples print what each decision was; on a loaded host the default 50 ms read
#: deadline could turn one into a fallback, which is not what they show.
PATIENT = {"GATEWAY_LIMITER_REDIS_TIMEOUT": "2", "GATEWAY_LIMITER_REDIS_TIMEOUT_CEILING": "2"}


def run(script: str, options: list[str]) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *options],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, **PATIENT},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_http_client_example_refuses_before_the_supplier_and_obeys_retry_after(
    services: list[str],
) -> None:
    out = run("http_client_integrations.py", services).splitlines()
    assert out[0] == "httpx    /ibe/flight/search: 200, 200, 200, refused (limited)"
    assert out[1] == "requests /ibe/fare/quote: 429 Retry-After: 2"
    held = re.fullmatch(
        r"requests /ibe/fare/quote: refused (\d+) times without a call, then 200 after (.+) s",
        out[2],
    )
    assert held is not None, out[2]
    assert int(held[1]) >= 1
    assert 1.5 <= float(held[2]) <= 3.5  # the 2 s hold, give or take a loaded box


def test_the_asgi_and_aiohttp_example_limits_callers_and_pushes_back(
    services: list[str],
) -> None:
    out = run("asgi_gateway_and_aiohttp_client.py", services).splitlines()
    assert out[0].startswith("alice -> 200 'supplier said 503'")
    assert out[1].startswith("alice -> 200 'supplier said 200'")
    assert out[2].startswith("alice -> 429 'Too Many Requests: /search (limited)'")
    assert "'retry-after':" in out[2]
    assert out[3].startswith("bob   -> 200 'supplier said 200'")
    rate = re.fullmatch(r"/supplier/availability: effective rate (.+) of 20 a second .*", out[4])
    assert rate is not None, out[4]
    assert 10 <= float(rate[1]) < 12  # halved, recovering by 1/s
