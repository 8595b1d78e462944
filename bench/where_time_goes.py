#!/usr/bin/env python
"""Where a gateway-limiter decision spends the time that a bare EVALSHA does not.

Run from the checkout, with the venv's Python (about 15 s)::

    python bench/where_time_goes.py
    python bench/where_time_goes.py --quick   # smoke run: one repetition of each part

It splits the gap between ``try_acquire`` and the floor of ``decision_cost.py`` into:

1. Redis server time per EVALSHA (``INFO commandstats`` usec_per_call): ``return 1``,
   ``TIME`` alone, the bare state commands (TIME, GET, SET with PX), and
   ``bucket.lua`` as shipped. What bucket.lua costs beyond the state commands is the
   script's own logic (arithmetic, packing the state and the reply).
2. Wall and client CPU per call (``time.thread_time``), layer by layer: the floor,
   the shipped script called through redis-py with the limiter's own ARGV, the
   backend's ``reserve`` (adds building ARGV and parsing the reply), ``try_acquire``
   (adds argument checks, routing, the breaker). Client CPU is a rough guide only:
   the kernel charges loopback work to whichever side happens to run it.
3. Python alone, Redis stubbed out: the backend's round trips
   (``backends/shared_trips.py``) replaced by a canned reply, so what is left is the
   limiter's own code (argument checks, routing, breaker, ARGV building, reply
   parsing); and, for comparison, redis-py's ``Script.__call__`` of ``return 1`` with
   ``evalsha`` stubbed.

Every number is a median over interleaved repetitions; the machine facts are printed
first so the numbers can be read against the host they came from.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import timeit
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import redis

# Run as a script from anywhere: the checkout's package wins over any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness.args import description
from bench.harness.limiters import (
    OPEN_RATE,
    OPEN_URL,
    STATE_COMMANDS_LUA,
    sqlite_table,
    started_limiter,
)
from bench.harness.report import machine_facts, table
from bench.harness.servers import private_redis
from gateway_limiter.backends.scripts import BUCKET_LUA, REPLY, Commands

REPEATS = 5


def sent_args(limiter: Any) -> list[str | bytes]:
    """The ARGV the limiter sends with its EVALSHA for ``try_acquire(OPEN_URL,
    timeout=0)``, built as the backend builds it (``backends/scripts.py``)."""
    rule = limiter.registry.snapshot.rules[OPEN_URL]
    call = Commands(limiter.settings.key_prefix)(rule, 1, 0.0, None, None)
    numkeys = int(call.args[0])
    return [a if isinstance(a, bytes) else str(a) for a in call.args[1 + numkeys :]]


class Canned:
    """Stands in for the backend's round trips (``backends/shared_trips.py``): every
    call is answered with ``reply`` at once, without Redis."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply

    def run(self, call: Any) -> tuple[Any, float]:
        """``reply``, as if sent at once."""
        return self.reply, 0.0


def server_micros(
    client: redis.Redis,
    scripts: dict[str, str],
    key: str,
    args: list[str | bytes],
    repeats: int = REPEATS,
) -> dict[str, float]:
    """Median server-side µs per EVALSHA of each script (INFO commandstats)."""
    found: dict[str, list[float]] = {name: [] for name in scripts}
    registered = {name: client.register_script(src) for name, src in scripts.items()}
    for _ in range(repeats):
        for i, (name, script) in enumerate(registered.items()):
            k = f"{key}{i}"
            script(keys=[k], args=args)
            client.config_resetstat()
            for _ in range(1000):
                script(keys=[k], args=args)
            stats = client.info("commandstats")["cmdstat_evalsha"]
            found[name].append(float(stats["usec_per_call"]))
    return {name: statistics.median(v) for name, v in found.items()}


def client_micros(
    calls: dict[str, Callable[[], Any]], n: int = 1000, repeats: int = REPEATS
) -> dict[str, tuple[float, float]]:
    """Median (client CPU µs, wall µs) per call of each callable, interleaved."""
    cpu: dict[str, list[float]] = {name: [] for name in calls}
    wall: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            for _ in range(100):
                call()
            c0, w0 = time.thread_time(), time.perf_counter()
            for _ in range(n):
                call()
            cpu[name].append(1e6 * (time.thread_time() - c0) / n)
            wall[name].append(1e6 * (time.perf_counter() - w0) / n)
    return {name: (statistics.median(cpu[name]), statistics.median(wall[name])) for name in calls}


def python_micros(
    calls: dict[str, Callable[[], Any]], n: int = 2_000, rounds: int = 50
) -> dict[str, float]:
    """Best-of µs per call with no I/O at all, in interleaved rounds: on a shared machine
    a burst of load then hits every call alike, and the best round of each is its cost."""
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(rounds):
        for name, call in calls.items():
            best[name] = min(best[name], timeit.timeit(call, number=n) / n * 1e6)
    return best


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print the three tables (``--help`` says what it is)."""
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument(
        "--quick", action="store_true", help="one repetition of each part (a smoke run)"
    )
    quick = parser.parse_args(argv).quick
    repeats = 1 if quick else REPEATS
    with ExitStack() as stack:
        redis_url = stack.enter_context(private_redis())
        admin = redis.Redis.from_url(redis_url, socket_timeout=5)
        stack.callback(admin.close)
        for line in machine_facts(admin, redis_url, private=True):
            print(line)
        print()

        # The open row of decision_cost.py: every call decided by bucket.lua, admitted.
        database_url = sqlite_table(stack, {OPEN_URL: {"rate_limit": OPEN_RATE, "cache": 0.0}})
        # This bench splits up the cost of a decision that succeeds: a deadline a loaded
        # host can pass (the 50 ms default) would only end the run with a TimeoutError.
        patient: dict[str, Any] = {"redis_timeout": 2.0, "redis_timeout_ceiling": 2.0}
        limiter = started_limiter(stack, database_url, redis_url, "gwlbenchwhere", **patient)
        quiet = started_limiter(
            stack, database_url, redis_url, "gwlbenchwhere", metrics=False, **patient
        )
        client: redis.Redis = limiter.backend.client
        args = sent_args(limiter)

        server = server_micros(
            admin,
            {
                "return 1": "return 1",
                "TIME only": 'redis.call("TIME") return 1',
                "TIME+GET+SET PX": STATE_COMMANDS_LUA,
                "bucket.lua as shipped": BUCKET_LUA,
            },
            "where:{/srv}:",
            args,
            repeats,
        )
        base = server["return 1"]
        print("1. Redis server time per EVALSHA (INFO commandstats)")
        print(
            table(
                ["script", "us/call", "+ over return 1"],
                [[name, f"{us:.1f}", f"{us - base:+.1f}"] for name, us in server.items()],
            )
        )
        print()

        rule = limiter.registry.snapshot.rules[OPEN_URL]
        bare = client.register_script("return 1")
        shipped = client.register_script(BUCKET_LUA)
        measured = client_micros(
            {
                "floor: EVALSHA return 1": bare,
                "bucket.lua via redis-py": lambda: shipped(keys=["where:{/c}:tb"], args=args),
                "backend.reserve(rule)": lambda: limiter.backend.reserve(rule, 1, 0.0),
                "try_acquire(timeout=0)": lambda: limiter.try_acquire(OPEN_URL, timeout=0),
            },
            repeats=repeats,
        )
        floor_cpu, floor_wall = measured["floor: EVALSHA return 1"]
        print("2. Client CPU and wall time per call, 1 thread, layer by layer")
        print(
            table(
                ["call", "CPU us", "+ CPU", "wall us", "+ wall"],
                [
                    [
                        name,
                        f"{cpu:.1f}",
                        f"{cpu - floor_cpu:+.1f}",
                        f"{wall:.1f}",
                        f"{wall - floor_wall:+.1f}",
                    ]
                    for name, (cpu, wall) in measured.items()
                ],
            )
        )
        print()

        # Redis stubbed out below: nothing after this may talk to Redis.
        # what bucket.lua answers: six packed doubles
        canned = REPLY.pack(1.0, 0.0, 9999999.0, 0.0, 1.0, 0.0)
        client.evalsha = lambda *a, **k: canned  # type: ignore[method-assign]
        limiter.backend._sharing = Canned(canned)  # type: ignore[attr-defined]
        quiet.backend._sharing = Canned(canned)  # type: ignore[attr-defined]
        stub = python_micros(
            {
                "Script.__call__ (return 1, stubbed)": bare,
                "backend.reserve (stubbed)": lambda: limiter.backend.reserve(rule, 1, 0.0),
                "try_acquire, metrics off (stubbed)": lambda: quiet.try_acquire(
                    OPEN_URL, timeout=0
                ),
                "try_acquire (stubbed)": lambda: limiter.try_acquire(OPEN_URL, timeout=0),
                "decide (stubbed)": lambda: limiter.decide(OPEN_URL, timeout=0),
            },
            rounds=3 if quick else 50,
        )
        script_only = stub["Script.__call__ (return 1, stubbed)"]
        print("3. Python alone (round trips stubbed with a canned reply)")
        print(
            table(
                ["call", "us/call", "+ over Script.__call__"],
                [[name, f"{us:.2f}", f"{us - script_only:+.2f}"] for name, us in stub.items()],
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
