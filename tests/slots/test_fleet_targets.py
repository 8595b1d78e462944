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
from typing import Any, NamedTuple

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
#: The least share of the slots' time held while a caller waits (the first test's docstring).
USED = 0.5

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


class SlotTime(NamedTuple):
    """What ``_slot_time`` measured, in s but ``most``."""

    most: int  # the most slots held at once
    idle_s: float  # slot-time idle while a caller waited (at most one slot per caller)
    held_s: float  # slot-time held
    release_s: float  # the callers' time giving slots back (leaving the block to return)
    waited_s: float  # the time during which a caller waited
    busy_s: float  # slot-time held during that time


def _slot_time(spans: list[list[float | None]], cap: int) -> SlotTime:
    """From the callers' ``[asked, entered, left, released]`` spans (slot_worker.py):
    the most slots held at once; the slot-time that stood idle while a caller waited (at
    each moment, as many slots as there were callers waiting, at most the slots no
    caller held); the slot-time held; the time the callers took to give their slots
    back (from leaving the block until ``slot()`` returned); the time during which at
    least one caller waited; and the slot-time held during it.

    "Held" is a caller's own time inside its ``with slot()`` block: the slot is leased
    before the block begins and given back after it ends, so this undercounts what Redis
    held, never overcounts it (which is why never more than ``cap`` are seen).
    """
    moves: list[tuple[float, int, int]] = []  # (moment, waiting +-1, held +-1)
    release_s = 0.0
    for asked, entered, left, released in spans:
        assert asked is not None and left is not None
        moves.append((asked, 1, 0))
        if entered is None:  # refused: waited until it was told so
            moves.append((left, -1, 0))
        else:
            assert released is not None
            moves += [(entered, -1, 1), (left, 0, -1)]
            release_s += released - left
    moves.sort(key=lambda m: (m[0], m[1] + m[2]))  # at one moment, the ends first
    waiting = held = most = 0
    idle_s = held_s = waited_s = busy_s = 0.0
    for (at, dw, dh), (then, _, _) in zip(moves, moves[1:] + moves[-1:], strict=True):
        waiting, held = waiting + dw, held + dh
        most = max(most, held)
        idle_s += max(0, min(waiting, cap - held)) * (then - at)
        held_s += held * (then - at)
        if waiting > 0:
            waited_s += then - at
            busy_s += held * (then - at)
    return SlotTime(most, idle_s, held_s, release_s, waited_s, busy_s)


def test_a_fleet_never_has_more_than_max_concurrent_calls_at_the_supplier(
    limiter_db: tuple[str, Engine],
    limiter_redis_url: str,
    key_prefix: str,
    supplier: Supplier,
    figures: Any,
) -> None:
    """56 callers in 4 processes share 4 slots: the supplier never sees more than 4
    calls at once (nor do the callers, by their own clocks), all 4 are used, and the
    fleet keeps the supplier busy: the slots are held while callers wait, and a freed
    slot does not stand idle while a caller waits for one.

    Both are measured from each caller's own clock around ``slot()``
    (``time.monotonic``: one clock for every process of the host). The bound: while any
    caller waited, the callers held at least ``USED`` (half) of the 4 slots' time, each
    counted only inside its ``with`` block, so the limiter's whole work between one
    caller leaving and the next entering (the release's round trips, the grant's
    publication, the wake-up) counts against it, and a slower limiter passes less easily:
    0.89-0.96 measured at load 7-15 on this 2-core box, 0.71-0.90 with two busy loops
    beside (load 8-15, a release taking up to 23 ms); 0.08 with grants heard by nobody
    (each waiter's next ask a second later). Waiters asking every 20 ms (the pace
    without the subscriber) held 0.77 at load 9: more than a loaded host leaves a sound
    limiter, so this bound does not catch them.

    The slot-time idle while a caller waited (at each moment, as many free slots as
    callers waiting) over the callers' release time is reported, and held loosely to 6:
    on a hand-over the release is the limiter's work (its script hands the slot to the
    first caller queued and tells its process, which wakes it; docs/concurrency.md,
    "Waiting"), and both stretch alike on a loaded host, so the ratio follows the
    wake-up more than the host: 1.2-3.5 measured (1.1-1.8 at load 3-18 in earlier
    runs), 12.6-20 with the 20 ms asks at load 9 (3.5-5.0 at load 10-14 earlier, which
    it lets pass), 523 with grants unheard. It counts each release's own time as idle,
    so it lets a slower release pass more easily; the share held is the bound that
    does not.

    Calls per second at the supplier, once the measure (at least 56/s, 0.7 of the ideal
    80/s), measured the host as much as the limiter: each call also holds its slot for
    the callers' and the supplier's own HTTP work (a TCP connect per call from the
    threads, a thread per call at the supplier), which a loaded host stretches (30-57/s
    at load 6-18 with the fleet as it is), and the 20 ms asks passed it on a quieter
    host (60/s at load 3). They are reported, not asserted.
    """
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
    for w in workers:  # every one told before any is waited for: they run together
        assert w.stdin is not None
        w.stdin.write(f"{start_at} {start_at + seconds}\n")
        w.stdin.flush()
    outputs = [w.communicate(timeout=120)[0] for w in workers]
    assert all(w.returncode == 0 for w in workers), outputs
    counts = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
    stats = supplier.stats()
    st = _slot_time([s for c in counts for s in c["spans"]], MAX)
    per_s = stats["calls"] / (stats["last_s"] - stats["first_s"])
    used = st.busy_s / (MAX * st.waited_s)
    figures(
        "slots: 3 processes x 8 threads + 32 asyncio tasks, maxConcurrent 4, 50 ms supplier",
        used_while_waited=round(used, 3),
        waited_s=round(st.waited_s, 2),
        idle_per_release=round(st.idle_s / st.release_s, 2),
        release_ms=round(1000 * st.release_s / stats["calls"], 2),
        idle_ms_per_call=round(1000 * st.idle_s / stats["calls"], 2),
        held_ms_per_call=round(1000 * st.held_s / stats["calls"], 2),
        calls_per_s=round(per_s, 1),
        ideal_per_s=MAX / DELAY_S,
        most_in_flight=stats["most_in_flight"],
        refused=sum(c["refused"] for c in counts),
        calls_by_process=[c["calls"] for c in counts],
    )
    assert stats["most_in_flight"] <= MAX
    assert st.most <= MAX  # the callers' side of the same cap
    assert stats["calls"] == sum(c["calls"] for c in counts)
    assert all(c["calls"] > 0 for c in counts)  # a fleet: every process had its turns
    assert stats["most_in_flight"] == MAX  # the slots were all used, not just never exceeded
    assert used >= USED, (
        f"{used:.2f} of the {MAX} slots' time held over the {st.waited_s:.2f} s callers "
        f"waited ({1000 * st.release_s / stats['calls']:.1f} ms a release)"
    )
    assert st.idle_s <= 6 * st.release_s, (
        f"slots idle {st.idle_s:.2f} s while callers waited, "
        f"{st.idle_s / st.release_s:.1f} x the {st.release_s:.2f} s their releases took"
    )


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
