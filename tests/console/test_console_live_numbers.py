"""The console's live numbers come from the whole fleet: two real limiter processes send
traffic, each adds its per-interface tallies to its heartbeat, and ``/api/status`` sums
them; when they stop, the numbers leave with their members."""

from __future__ import annotations

import subprocess
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
