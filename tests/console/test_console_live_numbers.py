"""The console's live numbers come from the whole fleet: two real limiter processes send
traffic, each adds its per-interface tallies to its heartbeat, and ``/api/status`` sums
them; when they stop, the numbers leave with their members."""

from __future__ import annotations

import subprocess
import time
from typing import Any

from tests.console.conftest import LIVE_URL as URL
from tests.console.conftest import Served, wait_until


def test_live_numbers_are_the_fleets(console: Served, workers: list[subprocess.Popen[str]]) -> None:
    with console.client() as http:

        def fleet_numbers() -> dict[str, Any] | None:
            status = http.get("/api/status").json()
            members = status["fleet"]["members"]
            live = status["fleet"]["tallies"].get(URL)
            if len(members) == 2 and live and live["admitted"] > 0 and live["refused"] > 0:
                return dict(live)
            return None

        wait_until("both workers' tallies in /api/status", fleet_numbers)
        # The first readings hold the full bucket's burst; past it the fleet is admitted
        # what the row allows, 20/s in all however much more the two ask. Each reading
        # covers one 0.2 s heartbeat per member, so a few are averaged.
        # real time: tallies of real traffic, over 0.2 s heartbeats
        time.sleep(1.5)
        readings = []
        for _ in range(6):
            status = http.get("/api/status").json()
            readings.append(status["fleet"]["tallies"].get(URL, {}))
            # real time: readings a heartbeat apart
            time.sleep(0.3)
        admitted = sum(r.get("admitted", 0.0) for r in readings) / len(readings)
        refused = sum(r.get("refused", 0.0) for r in readings) / len(readings)
        assert 5 <= admitted <= 60, readings
        assert refused > admitted, readings
        for p in workers:
            p.terminate()
            p.wait(timeout=30)

        def gone() -> bool:
            status = http.get("/api/status").json()
            return not status["fleet"]["members"] and URL not in status["fleet"]["tallies"]

        wait_until("the tallies to leave with the members", gone)
