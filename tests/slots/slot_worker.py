"""A gateway process for the slot tests: ``python -m tests.slots.slot_worker CONFIG``.

CONFIG is JSON: database_url, redis_url, key_prefix, url (the interface), supplier
(base URL), mode ("threads" or "asyncio"), callers, settings (more settings). Once its
limiter has started the process prints "ready" and reads one line from stdin,
"START_AT STOP_AT" (time.time()), so that every process of a test starts together
however long a loaded host takes to start each. Each caller loops: a slot, one
supplier call, the slot back, until STOP_AT; the process prints JSON
{"calls", "refused"} and exits.

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


def _threads(config: dict[str, Any]) -> dict[str, int]:
    counts = {"calls": 0, "refused": 0}
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
                try:
                    with (
                        limiter.slot(config["url"], timeout=5.0),
                        urllib.request.urlopen(config["supplier"] + "/call", timeout=10),
                    ):
                        pass
                    with lock:
                        counts["calls"] += 1
                except Refused:
                    with lock:
                        counts["refused"] += 1

        threads = [threading.Thread(target=caller) for _ in range(config["callers"])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return counts


async def _tasks(config: dict[str, Any]) -> dict[str, int]:
    counts = {"calls": 0, "refused": 0}
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
                try:
                    async with limiter.slot(config["url"], timeout=5.0):
                        (await client.get(config["supplier"] + "/call")).raise_for_status()
                    counts["calls"] += 1
                except Refused:
                    counts["refused"] += 1

        await asyncio.gather(*(caller() for _ in range(config["callers"])))
    return counts


def main() -> None:
    """Run the worker the JSON argument describes."""
    config = json.loads(sys.argv[1])
    asyncio_mode = config["mode"] == "asyncio"
    counts = asyncio.run(_tasks(config)) if asyncio_mode else _threads(config)
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
