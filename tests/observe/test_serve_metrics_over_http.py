"""``gateway-limiter serve-metrics``: a real process serving Prometheus' text format on a
real socket, with the rules, the switch, reloads and every bucket's live state in Redis;
SIGTERM or Ctrl-C stop it cleanly. Real MariaDB, real Redis."""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine

from gateway_limiter.cli import main
from gateway_limiter.observe import metrics
from tests.support.limiting import limiter, set_switch, write_row
from tests.support.services import RedisServer

CLI = (sys.executable, "-m", "gateway_limiter")


@pytest.fixture
def settings(
    migrated_db: tuple[str, Engine],
    redis_server: RedisServer,
    key_prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Path:
    """A settings file on a table with /a (5/s), /closed, and /trial in shadow mode."""
    for key in list(os.environ):
        if key.startswith("GATEWAY_LIMITER_"):
            monkeypatch.delenv(key)
    db, engine = migrated_db
    write_row(engine, "/a", rateLimit=5, cache=0.0, status=1)
    write_row(engine, "/closed", rateLimit=0, cache=0.0, status=1)
    write_row(engine, "/trial", rateLimit=2, cache=0.0, status=1, shadow=1)
    path = tmp_path / "settings.toml"
    path.write_text(
        f'database_url = "{db}"\nredis_url = "{redis_server.url}"\n'
        f'key_prefix = "{key_prefix}"\nreload_interval = 0.5\n'
    )
    return path


@pytest.fixture
def server(settings: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``serve-metrics --port 0`` in a process of its own, and the URL it serves on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_LIMITER_")}
    proc = subprocess.Popen(
        [*CLI, "--settings", str(settings), "serve-metrics", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=env,
    )
    assert proc.stdout is not None
    line = b""
    deadline = time.monotonic() + 30
    while b"\n" not in line and time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 0.1)[0]:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            line += chunk
    found = re.search(rb"serving metrics on (http://127\.0\.0\.1:\d+/metrics)", line)
    try:
        assert found, (line, proc.poll())
        yield proc, found.group(1).decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample the endpoint serves: (name, labels) -> value."""
    reply = httpx.get(url, timeout=10)
    assert reply.status_code == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(reply.text)
        for s in family.samples
    }


def test_serves_rules_switch_reloads_and_live_buckets_until_sigterm(
    server: tuple[subprocess.Popen[bytes], str],
    migrated_db: tuple[str, Engine],
    redis_server: RedisServer,
    key_prefix: str,
) -> None:
    proc, url = server
    gateway = limiter(migrated_db[0], redis_server.url, key_prefix)  # a gateway elsewhere
    try:
        assert gateway.reserve("/a", permits=5).allowed  # the stored permits
        assert gateway.reserve("/a", permits=10, timeout=5).allowed  # 2 s of debt, not slept
    finally:
        gateway.close()

    first = scrape(url)
    assert first[("gateway_limiter_rules_in_force", ())] == 3
    assert first[("gateway_limiter_shadow_rules", ())] == 1
    assert first[("gateway_limiter_switch_on", ())] == 1
    assert first[("gateway_limiter_backend_fallback", ())] == 0
    assert 0 <= first[("gateway_limiter_reload_age_seconds", ())] < 30
    assert first[("gateway_limiter_reloads_total", (("outcome", "ok"),))] >= 1
    assert first[("gateway_limiter_rule_permits_per_second", (("interface", "/a"),))] == 5
    # The bucket the gateway drew from, read from Redis at the scrape: in debt.
    assert first[("gateway_limiter_bucket_stored_permits", (("interface", "/a"),))] == 0
    debt = first[("gateway_limiter_bucket_debt_seconds", (("interface", "/a"),))]
    assert 0 < debt <= 2
    free = first[("gateway_limiter_bucket_next_free_seconds", (("interface", "/a"),))]
    assert free == pytest.approx(debt + 0.2)  # behind the debt, one interval at 5/s
    # An untouched bucket is full; a closed rule has no bucket.
    assert first[("gateway_limiter_bucket_stored_permits", (("interface", "/trial"),))] == 2
    assert ("gateway_limiter_bucket_stored_permits", (("interface", "/closed"),)) not in first

    set_switch(migrated_db[1], 0)  # the exporter reloads like a gateway (every 0.5 s here)
    deadline = time.monotonic() + 20
    while scrape(url)[("gateway_limiter_switch_on", ())] != 0:
        assert time.monotonic() < deadline, "the switch never showed as off"
        time.sleep(0.1)

    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert err == b""
    assert b"Traceback" not in out


def test_ctrl_c_stops_it_cleanly(server: tuple[subprocess.Popen[bytes], str]) -> None:
    proc, url = server
    assert scrape(url)[("gateway_limiter_rules_in_force", ())] == 3
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert (proc.returncode, err) == (0, b"")


def test_a_port_in_use_is_a_one_line_error(
    capsys: pytest.CaptureFixture[str], settings: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        capsys.readouterr()
        code = main(["--settings", str(settings), "serve-metrics", "--port", str(port)])
        err = capsys.readouterr().err
    assert code == 1
    assert err.startswith(f"gateway-limiter: error: cannot serve metrics on 127.0.0.1:{port}")
    assert len(err.splitlines()) == 1


def test_without_prometheus_client_it_says_what_to_install(
    capsys: pytest.CaptureFixture[str], settings: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics, "prometheus_client", None)  # as if the extra were absent
    capsys.readouterr()
    code = main(["--settings", str(settings), "serve-metrics", "--port", "0"])
    err = capsys.readouterr().err
    assert code == 1
    assert "pip install 'gateway-limiter[metrics]'" in err
    assert metrics.process_metrics() is None  # and a limiter then records nothing
