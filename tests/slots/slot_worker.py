"""A gateway process for the slot tests: ``python -m tests.slots.slot_worker CONFIG``.

CONFIG is JSON: database_url, redis_url, key_prefix, url (the interface), supplier
(base URL), mode ("threads" or "asyncio"), callers, settings (more settings). Once its
limiter has started the process prints "ready" and reads one line from stdin,
"START_AT STOP_AT" (time.time()), so that every process of a test starts together
however long a loaded host takes to start each. Each caller loops: a slot, one
supplier call, the slot back, until STOP_AT; the process prints JSON
{"calls", "refused", "spans"} and exits. ``spans`` holds one
``[asked, entered, left, released]`` per ``slot()`` call, on ``time.monotonic()`` (one
clock for every process of the host): when the caller asked, when it was inside the
block holding the slot, when it left the block, and when ``slot()`` had given the slot
back (for a refusal: ``entered`` and ``released`` null, ``left`` when ``Refused`` was
raised).

Mode "hold": take ``callers`` slots and hold them forever, printing "held" once all are
held (the test kills the process).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
import urllib.request
from typing import Any

import httpx

from gateway_limiter import GatewayLimiter, Refused
from gateway_limiter.aio import AsyncGatewayLimiter


def _ready(config: dict[str, Any]) -> None:
    """Say "ready" and take START_AT and STOP_AT from stdin, into ``config``."""
    print("ready", flush=True)
    config["start_at"], config["stop_at"] = map(float, sys.stdin.readline().split())


Span = list[float | None]


def _threads(config: dict[str, Any]) -> dict[str, Any]:
    counts = {"calls": 0, "refused": 0}
    spans: list[Span] = []
    lock = threading.Lock()
    with GatewayLimiter(
        database_url=config["database_url"],
        redis_url=config["redis_url"],
        key_prefix=config["key_prefix"],
        **config["settings"],
    ) as limiter:
        if config["mode"] == "hold":
            entered = threading.Semaphore(0)

            def hold() -> None:
                with limiter.slot(config["url"], timeout=9.0):
                    entered.release()
                    threading.Event().wait()

            for _ in range(config["callers"]):
                threading.Thread(target=hold, daemon=True).start()
            for _ in range(config["callers"]):
                entered.acquire()
            print("held", flush=True)
            threading.Event().wait()

        _ready(config)

        def caller() -> None:
            # real time: the fleet's callers start at one moment
            time.sleep(max(0.0, config["start_at"] - time.time()))
            while time.time() < config["stop_at"]:
                asked = time.monotonic()
                try:
                    with limiter.slot(config["url"], timeout=5.0):
                        entered = time.monotonic()
                        with urllib.request.urlopen(config["supplier"] + "/call", timeout=10):
                            pass
                        left = time.monotonic()
                    with lock:
                        counts["calls"] += 1
                        spans.append([asked, entered, left, time.monotonic()])
                except Refused:
                    with lock:
                        counts["refused"] += 1
                        spans.append([asked, None, time.monotonic(), None])

        threads = [threading.Thread(target=caller) for _ in range(config["callers"])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return {**counts, "spans": spans}


async def _tasks(config: dict[str, Any]) -> dict[str, Any]:
    counts = {"calls": 0, "refused": 0}
    spans: list[Span] = []
    async with (
        AsyncGatewayLimiter(
            database_url=config["database_url"],
            redis_url=config["redis_url"],
            key_prefix=config["key_prefix"],
            **config["settings"],
        ) as limiter,
        httpx.AsyncClient(limits=httpx.Limits(max_connections=64)) as client,
    ):
        await asyncio.to_thread(_ready, config)

        async def caller() -> None:
            # real time: the fleet's callers start at one moment
            await asyncio.sleep(max(0.0, config["start_at"] - time.time()))
            while time.time() < config["stop_at"]:
                asked = time.monotonic()
                try:
                    async with limiter.slot(config["url"], timeout=5.0):
                        entered = time.monotonic()
                        (await client.get(config["supplier"] + "/call")).raise_for_status()
                        left = time.monotonic()
                    spans.append([asked, entered, left, time.monotonic()])
                    counts["calls"] += 1
                except Refused:
                    counts["refused"] += 1
                    spans.append([asked, None, time.monotonic(), None])

        await asyncio.gather(*(caller() for _ in range(config["callers"])))
    return {**counts, "spans": spans}


def main() -> None:
    """Run the worker the JSON argument describes."""
    config = json.loads(sys.argv[1])
    asyncio_mode = config["mode"] == "asyncio"
    counts = asyncio.run(_tasks(config)) if asyncio_mode else _threads(config)
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
