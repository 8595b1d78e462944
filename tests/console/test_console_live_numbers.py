"""The console's live numbers come from the whole fleet: two real limiter processes send
traffic, each adds its per-interface tallies to its heartbeat, and ``/api/status`` sums
them; when they stop, the numbers leave with their members."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.console.conftest import Served
from tests.support.limiting import write_row

URL = "/ibe/live"

#: A gateway process: asks for URL as fast as it can for ``seconds``, beating every 0.2 s.
WORKER = f"""
import sys, time
from gateway_limiter import GatewayLimiter
db, redis_url, prefix, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
with GatewayLimiter(database_url=db, redis_url=redis_url, key_prefix=prefix,
                    fleet_heartbeat=0.2, metrics=False) as lim:
    print("ready", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        lim.try_acquire({URL!r}, timeout=0)
        time.sleep(0.002)
"""


def wait_until(what: str, check: Callable[[], Any], seconds: float = 30.0) -> Any:
    """Poll ``check`` until it answers something true (that answer), or fail."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    pytest.fail(f"not within {seconds} s: {what}")


@pytest.fixture
def workers(console: Served) -> Iterator[list[subprocess.Popen[str]]]:
    """Two gateway processes sending traffic to URL (20/s for the fleet, no waiting)."""
    write_row(console.engine, URL, rateLimit=20, cache=0)
    s = console.settings
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, s.database_url, s.redis_url, s.key_prefix, "60"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready"
        yield procs
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
            if p.stdout is not None:
                p.stdout.close()


def test_live_numbers_are_the_fleets(console: Served, workers: list[subprocess.Popen[str]]) -> None:
    with console.client() as http:

        def fleet_numbers() -> dict[str, Any] | None:
            status = http.get("/api/status").json()
            members = status["fleet"]["members"]
            live = status["fleet"]["tallies"].get(URL)
            if len(members) == 2 and live and live["admitted"] > 0 and live["refused"] > 0:
                return dict(live)
            return None

        live = wait_until("both workers' tallies in /api/status", fleet_numbers)
        # The row allows 20/s to the whole fleet and the two ask far more: what was
        # admitted stays near 20/s (one heartbeat's window is 0.2 s, so it is coarse).
        assert 0 < live["admitted"] <= 60
        assert live["refused"] > live["admitted"]
        for p in workers:
            p.terminate()
            p.wait(timeout=30)

        def gone() -> bool:
            status = http.get("/api/status").json()
            return not status["fleet"]["members"] and URL not in status["fleet"]["tallies"]

        wait_until("the tallies to leave with the members", gone)
