#!/usr/bin/env python
"""Redis CPU per decision, by how the decisions reach Redis: what to size masters by.

Run from the checkout, with the venv's Python (about 30 s)::

    python bench/redis_cpu.py
    python bench/redis_cpu.py --seconds 5 --processes 8

``bench/server_time.py`` measures a script's time inside Redis with its calls sent 100
to a pipeline: the least a decision can cost a master. A master also reads each
command from its socket and writes each reply, and that costs per round trip, not per
call: a decision alone in its round trip costs Redis several times what the same
decision costs in a batch. How many decisions share a round trip depends on how the
gateway calls the limiter, so this measures the Redis process's CPU (``INFO cpu``,
user + system) per admitted decision for each way, on one private ``redis-server``, one
``GatewayLimiter`` per process on a row so large that every call is admitted:

1. one process, one thread: every decision its own round trip;
2. several processes, one thread each (``--processes``): the same, from many clients;
3. one process, eight threads: threads share round trips (``backends/shared_trips.py``);
4. one process, 64 asyncio tasks: coroutines share round trips through lanes;
5. pipelines of 100 ``EVALSHA`` (as ``server_time.py`` sends them): the floor.

Each case runs ``--seconds`` after a warm-up; the Redis CPU is read just before and just
after. The clients run on the same machine as Redis, so on a small host they compete
with it for cores: decisions/s is what this host made, not what a master can take; the
CPU per decision is the figure to carry over.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import redis

# Run as a script from anywhere: the checkout's package wins over any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness.args import description, positive_float, positive_int
from bench.harness.limiters import OPEN_RATE, OPEN_URL, sqlite_table, started_limiter
from bench.harness.report import load_average, machine_facts, table
from bench.harness.runs import delete_keys, raise_interrupt
from bench.harness.servers import private_redis
from gateway_limiter import GatewayLimiter
from gateway_limiter.backends.scripts import Commands

#: Calls per pipeline in the pipelined case (as bench/server_time.py sends them).
PIPELINE = 100
WARM_S = 0.5


def redis_cpu_s(client: redis.Redis) -> float:
    """CPU seconds the Redis process has used (user + system, all its threads)."""
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


class Window:
    """One measured interval: the Redis CPU and the wall time between ``start`` and
    ``stop``, read by the process that runs the case."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.cpu_s = 0.0
        self.wall_s = 0.0

    def start(self) -> None:
        self._cpu = redis_cpu_s(self.client)
        self._wall = time.monotonic()

    def stop(self) -> None:
        self.wall_s = time.monotonic() - self._wall
        self.cpu_s = redis_cpu_s(self.client) - self._cpu


def in_threads(call: Callable[[], bool], threads: int, seconds: float, window: Window) -> int:
    """Admitted calls of ``threads`` threads calling ``call``, counted over ``seconds``
    after a warm-up."""
    stop, counting = threading.Event(), threading.Event()
    counts = [0] * threads

    def work(i: int) -> None:
        n = 0
        while not stop.is_set():
            if call() and counting.is_set():
                n += 1
        counts[i] = n

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    time.sleep(WARM_S)  # every thread running before the window opens
    window.start()
    counting.set()
    time.sleep(seconds)
    counting.clear()
    window.stop()
    stop.set()
    for w in workers:
        w.join()
    return sum(counts)


#: This measures Redis CPU, not the read deadline: a loaded host may hold a reply
#: past the default 50 ms, which would open the breaker and leave nothing measured.
PATIENT_S = 2.0


def in_tasks(limiter: GatewayLimiter, tasks: int, seconds: float, window: Window) -> int:
    """Admitted calls of ``tasks`` asyncio tasks for ``seconds``."""
    from gateway_limiter.aio import AsyncGatewayLimiter

    async def run() -> int:
        async with AsyncGatewayLimiter(limiter.settings) as alimiter:
            counting = False
            count = 0
            stop = False

            async def work() -> None:
                nonlocal count
                while not stop:
                    allowed = await alimiter.try_acquire(OPEN_URL, timeout=0)
                    if counting:
                        count += allowed

            running = [asyncio.create_task(work()) for _ in range(tasks)]
            await asyncio.sleep(WARM_S)
            window.start()
            counting = True
            await asyncio.sleep(seconds)
            counting = False
            window.stop()
            stop = True
            await asyncio.gather(*running)
            return count

    return asyncio.run(run())


def pipelined(limiter: GatewayLimiter, seconds: float, window: Window) -> int:
    """Admitted calls sent ``PIPELINE`` to a round trip, from one thread, for ``seconds``."""
    rule = limiter.registry.snapshot.rules[OPEN_URL]
    call = Commands(limiter.settings.key_prefix)(rule, 1, 0.0, None, None)
    client: redis.Redis = limiter.backend.client
    client.script_load(call.source)

    def batch() -> int:
        pipe = client.pipeline(transaction=False)
        for _ in range(PIPELINE):
            pipe.evalsha(*call.evalsha)
        return len(pipe.execute())

    deadline = time.monotonic() + WARM_S
    while time.monotonic() < deadline:
        batch()
    count = 0
    window.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        count += batch()
    window.stop()
    return count


def _process(
    database_url: str,
    redis_url: str,
    prefix: str,
    ready: Any,
    go: Any,
    stop: Any,
    counts: Any,
) -> None:
    """One gateway process of case 2: says it is ready, decides from ``go`` to
    ``stop``, then reports."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the run
    with ExitStack() as stack:
        limiter = started_limiter(
            stack, database_url, redis_url, prefix, expect_rules=1, redis_timeout=PATIENT_S
        )
        for _ in range(100):  # connected and warm
            limiter.try_acquire(OPEN_URL, timeout=0)
        ready.put(True)
        go.wait()
        n = 0
        while not stop.is_set():
            n += limiter.try_acquire(OPEN_URL, timeout=0)
        counts.put(n)


def in_processes(
    database_url: str, redis_url: str, prefix: str, processes: int, seconds: float, window: Window
) -> int:
    """Admitted calls of ``processes`` processes of one thread each, for ``seconds``:
    each counts from ``go`` to ``stop``, the window is the same interval."""
    context = multiprocessing.get_context("spawn")
    ready, go, stop, counts = context.Queue(), context.Event(), context.Event(), context.Queue()
    workers = [
        context.Process(
            target=_process, args=(database_url, redis_url, prefix, ready, go, stop, counts)
        )
        for _ in range(processes)
    ]
    for w in workers:
        w.start()
    try:
        for _ in workers:  # each spawned, imported, started and warm
            ready.get(timeout=120)
        window.start()
        go.set()
        time.sleep(seconds)
        stop.set()
        window.stop()
        total = sum(counts.get(timeout=60) for _ in workers)
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=10)
            if w.is_alive():
                w.terminate()
    return int(total)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--seconds", type=positive_float, default=3.0, help="per case")
    parser.add_argument(
        "--processes", type=positive_int, default=4, help="processes of the many-clients case"
    )
    parser.add_argument("--threads", type=positive_int, default=8, help="threads of case 3")
    parser.add_argument("--tasks", type=positive_int, default=64, help="asyncio tasks of case 4")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure every case and print one table; 130 when interrupted."""
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, raise_interrupt)
    began = time.monotonic()
    try:
        with ExitStack() as stack:
            url = stack.enter_context(private_redis())
            client = redis.Redis.from_url(url, socket_timeout=10)
            stack.callback(client.close)
            prefix = f"gwlcpu{uuid.uuid4().hex[:8]}"
            stack.callback(delete_keys, client, f"{prefix}*")
            for line in machine_facts(client, url, private=True):
                print(line)
            print(f"plan:     {args.seconds:g} s per case after a {WARM_S:g} s warm-up", flush=True)
            database_url = sqlite_table(stack, {OPEN_URL: {"rate_limit": OPEN_RATE, "cache": 0.0}})
            limiter = started_limiter(
                stack, database_url, url, prefix, expect_rules=1, redis_timeout=PATIENT_S
            )

            def call() -> bool:
                return limiter.try_acquire(OPEN_URL, timeout=0)

            cases: list[tuple[str, Callable[[Window], int]]] = [
                ("1 process x 1 thread", lambda w: in_threads(call, 1, args.seconds, w)),
                (
                    f"{args.processes} processes x 1 thread",
                    lambda w: in_processes(
                        database_url, url, prefix, args.processes, args.seconds, w
                    ),
                ),
                (
                    f"1 process x {args.threads} threads",
                    lambda w: in_threads(call, args.threads, args.seconds, w),
                ),
                (
                    f"1 process x {args.tasks} asyncio tasks",
                    lambda w: in_tasks(limiter, args.tasks, args.seconds, w),
                ),
                (f"pipelines of {PIPELINE} (floor)", lambda w: pipelined(limiter, args.seconds, w)),
            ]
            rows = []
            for name, run in cases:
                window = Window(client)
                admitted = run(window)
                if admitted <= 0:
                    raise SystemExit(f"{name}: no call admitted; the limit should be huge")
                rows.append(
                    [
                        name,
                        f"{admitted / window.wall_s:,.0f}",
                        f"{window.cpu_s / window.wall_s:.0%}",
                        f"{window.cpu_s * 1e6 / admitted:.1f}",
                    ]
                )
                print(f"  {name}: done", file=sys.stderr, flush=True)
            print()
            print("Redis CPU per admitted decision, by how decisions reach Redis")
            headers = ["case", "decisions/s", "Redis CPU (of one core)", "Redis CPU us/decision"]
            print(table(headers, rows))
            print(
                "Redis CPU: INFO cpu (user + sys) of the Redis process over the case's window. "
                "The clients share this host's cores with Redis."
            )
    except KeyboardInterrupt:
        print("\ninterrupted; cleaned up", file=sys.stderr)
        return 130
    print(f"\n(run took {time.monotonic() - began:.1f} s; load average now {load_average()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
