"""The concurrency targets, against a real supplier process that counts its own calls in
flight: a fleet of gateway processes never has more than ``maxConcurrent`` calls at the
supplier, keeps it busy, and a killed process's slots come back within a lease."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.backends.slots import slot_keys
from tests.support.counting_supplier import Supplier
from tests.support.limiting import write_row
from tests.support.waiting import wait_for

URL = "/supplier/fares"
MAX = 4
DELAY_S = 0.05

pytestmark = pytest.mark.slow

#: The checkout, so that the worker processes import its tests package.
CHECKOUT = Path(__file__).resolve().parents[2]


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    write_row(limiter_db[1], URL, rateLimit=5000, cache=5.0, maxConcurrent=MAX)
    return limiter_db


@pytest.fixture
def supplier() -> Iterator[Supplier]:
    server = Supplier(DELAY_S)
    yield server
    server.stop()


def _worker(config: dict[str, Any]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(CHECKOUT)}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.slots.slot_worker", json.dumps(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_a_fleet_never_has_more_than_max_concurrent_calls_at_the_supplier(
    limiter_db: tuple[str, Engine],
    limiter_redis_url: str,
    key_prefix: str,
    supplier: Supplier,
    figures: Any,
) -> None:
    seconds = 6.0
    base = {
        "database_url": limiter_db[0],
        "redis_url": limiter_redis_url,
        "key_prefix": key_prefix,
        "url": URL,
        "supplier": supplier.url,
        "settings": {
            "reload_interval": 3600,
            "metrics": False,
            # a loaded box can take longer than the default 50 ms to answer: no false outages
            "redis_timeout": 0.5,
            "redis_timeout_ceiling": 1.0,
        },
    }
    workers = [_worker({**base, "mode": "threads", "callers": 8}) for _ in range(3)]
    workers.append(_worker({**base, "mode": "asyncio", "callers": 32}))
    for w in workers:  # each started, however long a loaded host took
        assert w.stdout is not None and w.stdout.readline().strip() == "ready"
    start_at = time.time() + 0.5
    outputs = [w.communicate(f"{start_at} {start_at + seconds}\n", timeout=120)[0] for w in workers]
    assert all(w.returncode == 0 for w in workers), outputs
    counts = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
    stats = supplier.stats()
    assert stats["most_in_flight"] <= MAX
    assert stats["calls"] == sum(c["calls"] for c in counts)
    per_s = stats["calls"] / (stats["last_s"] - stats["first_s"])
    figures(
        "slots: 3 processes x 8 threads + 32 asyncio tasks, maxConcurrent 4, 50 ms supplier",
        calls_per_s=round(per_s, 1),
        ideal_per_s=MAX / DELAY_S,
        most_in_flight=stats["most_in_flight"],
        refused=sum(c["refused"] for c in counts),
        calls_by_process=[c["calls"] for c in counts],
    )
    assert stats["most_in_flight"] == MAX  # the slots were all used, not just never exceeded
    # The target is 0.85 x 80/s = 68/s, measured at 69-74/s at load 2-5 on this
    # 2-core box (docs/concurrency.md). Four gateway processes, the supplier and Redis
    # compete for those cores with other test runs, so the bound here leaves a margin
    # for a busier box; the limiter before the hand-over (and the supplier before
    # TCP_NODELAY): 48-53/s, which fails it.
    assert per_s >= 0.7 * MAX / DELAY_S


def test_a_killed_process_s_slots_come_back_within_a_lease(
    limiter_db: tuple[str, Engine],
    limiter_redis_url: str,
    key_prefix: str,
    redis_client: redis.Redis,
    figures: Any,
) -> None:
    # The live holder renews every third of a lease: its slots stay counted unless the
    # host keeps its renewing thread off the CPU for 2/3 of a lease, which 1 s leases
    # (0.67 s) left within reach of a loaded 2-core host; 2 s leases need 1.33 s.
    lease_s = 2.0
    holder = _worker(
        {
            "database_url": limiter_db[0],
            "redis_url": limiter_redis_url,
            "key_prefix": key_prefix,
            "url": URL,
            "mode": "hold",
            "callers": MAX,
            "settings": {"reload_interval": 3600, "metrics": False, "slot_lease": lease_s},
        }
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        # held past several leases: the live process renews them
        # real time: held past leases on Redis' clock, renewed
        time.sleep(1.5 * lease_s)
        assert redis_client.zcard(slot_keys(key_prefix, URL)[0]) == MAX
        with GatewayLimiter(
            database_url=limiter_db[0],
            redis_url=limiter_redis_url,
            key_prefix=key_prefix,
            reload_interval=3600,
            slot_lease=lease_s,
        ) as lim:
            got: list[float] = []
            leave = threading.Event()
            came = threading.Condition()

            def wait_for_a_slot() -> None:
                with lim.slot(URL, timeout=8.0):
                    with came:
                        got.append(time.monotonic())
                        came.notify_all()
                    leave.wait(10)

            waiters = [threading.Thread(target=wait_for_a_slot) for _ in range(MAX)]
            for t in waiters:
                t.start()
            queue = slot_keys(key_prefix, URL)[1]
            wait_for(lambda: redis_client.zcard(queue) == MAX, 5, "the waiters queued")
            assert got == []  # the holder's slots are still counted
            holder.send_signal(signal.SIGKILL)
            holder.wait(10)
            killed = time.monotonic()
            with came:  # told as each slot comes, not polled
                came.wait_for(lambda: len(got) == MAX, timeout=5)
            back_s = max(got) - killed if len(got) == MAX else None
            leave.set()
            for t in waiters:
                t.join(10)
        figures("slots: SIGKILLed holder of 4 slots", lease_s=lease_s, back_s=back_s)
        assert back_s is not None, f"only {len(got)} of {MAX} slots came back"
        assert back_s <= lease_s + 1.0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)
