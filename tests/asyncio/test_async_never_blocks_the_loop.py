"""Nothing the asyncio limiter does holds the event loop: not callers waiting their turn
on real Redis, not a reload stuck in a real MariaDB, not a start against it.

The instrument is a ticker on the loop that sleeps 5 ms at a time and records how late
it wakes. On a shared 2-core host the OS alone can keep a process off the CPU for tens
of milliseconds, so the ticker subtracts the time this process's threads spent runnable
but waiting for a CPU (the run-queue time in /proc/self/task/<tid>/schedstat): the
loop's thread's own, and every other thread's, since a thread the OS stops while it
holds the GIL (a reload's, the audit's) keeps the loop waiting just as long
(``tests/support/cpu.py``). What is left is time the loop was held by something on it:
running Python (ours, or a thread holding the GIL) or blocking in a call. That is what
must stay under ``STALL``.

``STALL`` is set by the bugs this file guards against, not by the host: a waiting
caller that sleeps in its thread holds the loop for its whole wait (here up to a
second, and 10 ms for every caller queued before it), and a reload stuck in the
database for as long as the table stays locked (half a second and more). Both are
far above 60 ms. What the instrument cannot subtract stays below it: on this shared
2-core host at load 16 it once saw 34.5 ms, 20 ms of it one garbage collection of the
callers' own objects; a virtual machine's CPU taken away by its host (steal) is
another part it cannot see, since the guest counts that time as running.

One more thing holds every thread of a process: a full collection by Python's garbage
collector, which runs with the GIL in whichever thread triggers it and takes time in
proportion to every object alive, most of them left by the tests before. Run after
the thousand coroutines of test_async_keeps_rate.py, the ticker here once saw the loop
held 56 ms while one collection took 68 ms (and CI saw 121 ms, no thread waiting for a
CPU). So the ticker collects and freezes what exists before it starts
(``gc.freeze``): collections while it ticks still run, but scan only what was made
since, the limiter's own garbage included; and it reports the longest one.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
from types import TracebackType
from typing import Any

import pymysql
import pytest
from sqlalchemy import Engine

from gateway_limiter.aio import AsyncGatewayLimiter
from tests.support.cpu import off_cpu_since, run_queues, waited_since
from tests.support.limiting import write_row
from tests.support.services import RedisServer, mariadb_connection

STALL = 0.060
TICK = 0.005


class LoopTicker:
    """Ticks on the running loop; ``worst`` is the longest the loop was held (s)."""

    def __init__(self) -> None:
        self.worst = 0.0
        self.worst_raw = 0.0
        self.ticks = 0
        #: of the tick that gave ``worst``: its lateness, the loop's thread's wait for a
        #: CPU, the other threads' (s)
        self.worst_parts = (0.0, 0.0, 0.0)
        #: the longest one garbage collection took while ticking, in any thread (s)
        self.longest_collection = 0.0
        self._collecting_since = 0.0
        self._task: asyncio.Task[None] | None = None

    def _collection(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._collecting_since = time.perf_counter()
        else:
            took = time.perf_counter() - self._collecting_since
            self.longest_collection = max(self.longest_collection, took)

    async def _tick(self) -> None:
        me = str(threading.get_native_id())
        while True:
            started, before = time.perf_counter(), run_queues()
            await asyncio.sleep(TICK)
            late = time.perf_counter() - started - TICK
            waited = waited_since(before)
            own = waited.pop(me, 0.0)
            others = sum(waited.values(), 0.0)
            held = late - own - others
            self.worst_raw = max(self.worst_raw, late)
            if held > self.worst:
                self.worst, self.worst_parts = held, (late, own, others)
            self.ticks += 1

    async def __aenter__(self) -> LoopTicker:
        gc.collect()
        gc.freeze()  # what exists now is not scanned again until __aexit__
        gc.callbacks.append(self._collection)
        self._task = asyncio.create_task(self._tick())
        await asyncio.sleep(0)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        gc.callbacks.remove(self._collection)
        gc.unfreeze()

    def __repr__(self) -> str:
        late, own, others = (round(s * 1000, 1) for s in self.worst_parts)
        return (
            f"loop held {self.worst * 1000:.1f} ms (that tick: {late} ms late, the loop's "
            f"thread waited {own} ms for a CPU, other threads {others} ms; raw lateness at "
            f"worst {self.worst_raw * 1000:.1f} ms; longest garbage collection "
            f"{self.longest_collection * 1000:.1f} ms)"
        )


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    engine = limiter_db[1]
    write_row(engine, "/wait", rateLimit=100, cache=0.0, status=1)
    write_row(engine, "/quick", rateLimit=100_000, cache=0.0, status=1)
    return limiter_db


@pytest.fixture
def limiter_settings() -> dict[str, Any]:
    return {"reload_interval": 60}


class TableLock:
    """``LOCK TABLES t_ratelimite_conf WRITE`` from another session: every read of the
    limits table, the limiter's reload included, waits until ``release``."""

    def __init__(self, engine: Engine) -> None:
        database = engine.url.database
        assert database is not None
        self.conn = mariadb_connection(database)

    def __enter__(self) -> TableLock:
        with self.conn.cursor() as cur:
            cur.execute("LOCK TABLES t_ratelimite_conf WRITE")
        return self

    def insert(self, url: str, rate: int) -> None:
        """A row written under the lock: seen by a reload only once the lock is released."""
        with self.conn.cursor() as cur:
            cur.execute(
                "insert into t_ratelimite_conf (interfaceUrl, rateLimit, cache, status) "
                "values (%s, %s, 0, 1)",
                (url, rate),
            )

    def release(self) -> None:
        """UNLOCK TABLES."""
        with self.conn.cursor() as cur:
            cur.execute("UNLOCK TABLES")

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(pymysql.Error):
            self.release()
        self.conn.close()


async def test_the_ticker_sees_a_loop_held_by_a_blocking_call_or_by_cpu_work() -> None:
    async with LoopTicker() as ticker:
        # real time: the ticker ticks on the real loop
        await asyncio.sleep(0.02)
        time.sleep(0.15)  # real time: a blocking call in a coroutine, the bug this file guards
        # real time: the ticker ticks on the real loop
        await asyncio.sleep(0.02)
    assert ticker.worst > STALL, ticker

    async with LoopTicker() as ticker:
        # real time: the ticker ticks on the real loop
        await asyncio.sleep(0.02)
        until = time.thread_time() + 0.15
        while time.thread_time() < until:  # 150 ms of CPU on the loop holds it just the same
            pass
        # real time: the ticker ticks on the real loop
        await asyncio.sleep(0.02)
    assert ticker.worst > STALL, ticker


async def test_callers_waiting_their_turn_on_redis_do_not_hold_the_loop(
    alim: AsyncGatewayLimiter,
) -> None:
    await alim.acquire("/quick")  # a first connection, as a running gateway has
    waited: list[float] = []

    async def caller(arrives_after: float) -> None:
        # real time: callers arrive over 200 ms, as traffic does
        await asyncio.sleep(arrives_after)
        waited.append(await alim.acquire("/wait"))

    async with LoopTicker() as ticker:
        # 200 callers arriving over 200 ms, as traffic does (a burst of N at one instant
        # is N decisions' CPU in one turn of the loop: work, not a stall), then waiting
        # up to a second for their turn at 100/s.
        await asyncio.gather(*(caller(i / 1000) for i in range(200)))

    assert len(waited) == 200
    assert max(waited) > 0.5  # they did wait (100 stored, then 100 more at 100/s)
    assert ticker.ticks > 20
    assert ticker.worst < STALL, ticker


@pytest.mark.parametrize("operation", ["reload", "start"])
async def test_a_reload_stuck_in_the_database_does_not_hold_the_loop(
    operation: str,
    migrated_db: tuple[str, Engine],
    redis_server: RedisServer,
    key_prefix: str,
) -> None:
    url, engine = migrated_db
    write_row(engine, "/quick", rateLimit=100_000, cache=0.0, status=1)
    lim = AsyncGatewayLimiter(
        database_url=url, redis_url=redis_server.url, key_prefix=key_prefix, reload_interval=60
    )
    if operation == "reload":
        await lim.start()
        await lim.acquire("/quick")
    try:
        with TableLock(engine) as lock:
            lock.insert("/new", 7)
            async with LoopTicker() as ticker:
                stuck = asyncio.create_task(getattr(lim, operation)())
                slowest = 0.0
                for _ in range(50):  # requests keep being decided meanwhile
                    started, before = time.perf_counter(), run_queues()
                    if operation == "reload":
                        assert await lim.try_acquire("/quick", timeout=0)
                    # less what the OS kept this process's threads waiting for a CPU
                    slowest = max(slowest, time.perf_counter() - started - off_cpu_since(before))
                    # real time: requests paced while the reload is stuck
                    await asyncio.sleep(0.01)
                assert not stuck.done()  # still waiting for the table lock, in its thread
                lock.release()
                summary = await asyncio.wait_for(stuck, 10)
        assert summary.ok
        assert "/new" in lim.registry.snapshot.rules
        assert slowest < 0.1
        assert ticker.worst < STALL, ticker
    finally:
        await lim.aclose()
