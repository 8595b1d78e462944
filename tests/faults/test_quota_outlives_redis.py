"""A day's quota outlives Redis: four real processes spend a daily quota while their
private redis-server is killed mid-day and restarted empty; the fleet resumes from what it
had counted (each process's floor, the database's checkpoint), so over the day it admits
at most what it admitted in one checkpoint interval beyond the quota (and what the failure
policy admitted while Redis was away), not a second day's quota. The counter is
checkpointed to ``t_ratelimite_quota``.

On a real 3-master cluster, a fleet that restarts with every master flushed resumes from
the database's checkpoint alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from gateway_limiter.backends.state import state_key
from gateway_limiter.config.rules import CALENDAR_SECONDS, Rule
from gateway_limiter.model.calendar import Calendar
from tests.support.clusters import LocalCluster, wait_for
from tests.support.limiting import limiter, write_row
from tests.support.services import RedisServer

URL = "/quota/restart"
ZONE = "America/New_York"
QUOTA = 300
RATE = 40  # per second, fleet-wide: how fast the fleet spends the day
CHECKPOINT_S = 1.0
CHECKPOINT = str(CHECKPOINT_S)
PROCESSES = 4
KILL_AT_S = 4.0  # into the run: about half the quota spent
DOWN_S = 0.5
RUN_S = 14.0  # long enough to spend the quota twice over, were it lost

WORKER = textwrap.dedent("""
    import json, sys, threading, time
    from gateway_limiter import GatewayLimiter
    from gateway_limiter.core.decision import Reason
    db, redis_url, prefix, url = sys.argv[1:5]
    seconds, checkpoint = float(sys.argv[5]), float(sys.argv[6])
    admitted, lock = [], threading.Lock()
    with GatewayLimiter(database_url=db, redis_url=redis_url, key_prefix=prefix,
                        redis_timeout=2.0, quota_checkpoint_s=checkpoint) as lim:
        print("ready", flush=True)
        start_at = float(sys.stdin.readline())
        time.sleep(max(0.0, start_at - time.time()))
        def work():
            while time.time() < start_at + seconds:
                d = lim.decide(url, timeout=0)
                if d.allowed:
                    with lock:
                        admitted.append((time.time(), d.reason == Reason.BACKEND_FALLBACK))
                time.sleep(0.005)
        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads: t.start()
        for t in threads: t.join()
    print(json.dumps({"admitted": admitted}))
""")


def fleet(db_url: str, redis_url: str, prefix: str, seconds: float) -> list[subprocess.Popen[str]]:
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WORKER,
                db_url,
                redis_url,
                prefix,
                URL,
                str(seconds),
                CHECKPOINT,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ | {"PYTHONPATH": str(Path(__file__).parents[2])},
        )
        for _ in range(PROCESSES)
    ]
    for p in procs:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
    return procs


def go(procs: list[subprocess.Popen[str]]) -> float:
    start_at = time.time() + 0.3
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(f"{start_at}\n")
        p.stdin.close()
    return start_at


def results(procs: list[subprocess.Popen[str]]) -> list[tuple[float, bool]]:
    admitted: list[tuple[float, bool]] = []
    for p in procs:
        assert p.stdout is not None
        out = p.stdout.read()
        assert p.wait(timeout=120) == 0
        admitted += [(t, f) for t, f in json.loads(out.strip().splitlines()[-1])["admitted"]]
    return admitted


def checkpointed(engine: Engine) -> list[tuple[str, int, int]]:
    with engine.connect() as conn:
        rows = conn.execute(text("select counterKey, periodStart, used from t_ratelimite_quota"))
        return [(str(k), int(w), int(u)) for k, w, u in rows]


def daily_rows(engine: Engine) -> None:
    write_row(engine, URL, rateLimit=RATE, cache=0)
    write_row(engine, URL, add=True, rateLimit=QUOTA, cache=0, quotaPeriod="day", timeZone=ZONE)


@pytest.mark.slow
def test_a_redis_restart_mid_day_gives_away_at_most_one_checkpoint_interval(
    migrated_db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str, figures: object
) -> None:
    db_url, engine = migrated_db
    daily_rows(engine)
    procs = fleet(db_url, private_redis.url, key_prefix, RUN_S)
    start_at = go(procs)
    try:
        # real time: the kill at its moment of the fleet's run
        time.sleep(max(0.0, start_at + KILL_AT_S - time.time()))
        killed = time.time()
        private_redis.kill()
        # real time: Redis down for DOWN_S while the fleet runs
        time.sleep(DOWN_S)
        private_redis.start()  # empty: no save, no append-only file
        restarted = time.time()
        admitted = results(procs)
    finally:
        for p in procs:
            p.kill()
    by_redis = [t for t, fell_back in admitted if not fell_back]
    by_policy = len(admitted) - len(by_redis)
    # what the fleet admitted in the checkpoint interval before the kill: the most it may
    # have counted that no floor and no checkpoint held when Redis went
    last_interval = sum(1 for t in by_redis if killed - CHECKPOINT_S <= t <= killed)
    before = sum(1 for t in by_redis if t <= killed)
    after = sum(1 for t in by_redis if t >= restarted)
    assert figures is not None
    figures(  # type: ignore[operator]
        "a daily quota across a Redis restart",
        quota=QUOTA,
        admitted=len(admitted),
        before_kill=before,
        after_restart=after,
        by_failure_policy=by_policy,
        last_interval_before_kill=last_interval,
    )
    assert before < QUOTA  # the kill came mid-day, with quota left
    assert len(admitted) <= QUOTA + last_interval + by_policy
    assert len(admitted) >= QUOTA  # and the fleet still spent its day
    # the counter is checkpointed, by one process at a time, to the table's database
    key = counter(key_prefix)
    rows = {k: (w, u) for k, w, u in checkpointed(engine)}
    start = Calendar.of("day", ZONE).period_at(time.time())[0]
    assert rows[key][0] == start * 1_000_000
    assert QUOTA - RATE <= rows[key][1] <= len(admitted)


def counter(prefix: str) -> str:
    """The Redis key of URL's daily quota counter."""
    calendar = Calendar.of("day", ZONE)
    period = CALENDAR_SECONDS[calendar.renewal.period]
    return state_key(prefix, Rule(URL, QUOTA, 0.0, 2, period=period, calendar=calendar))


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """Three masters, no replicas: flushing them loses every counter."""
    running = LocalCluster(masters=3, replicas=0).start()
    yield running
    running.stop()


def test_a_fleet_restarting_on_a_flushed_cluster_resumes_from_the_checkpoints(
    migrated_db: tuple[str, Engine], cluster: LocalCluster, key_prefix: str
) -> None:
    db_url, engine = migrated_db
    spent = {"/quota/a": 15, "/quota/b": 12}  # two interfaces: two slots, most likely
    for url in spent:
        write_row(engine, url, rateLimit=1000, cache=0)
        write_row(engine, url, add=True, rateLimit=20, cache=0, quotaPeriod="month", timeZone=ZONE)
    settings = {"redis_timeout": 2.0, "quota_checkpoint_s": 0.2}
    first = limiter(db_url, cluster.url, key_prefix, **settings)
    try:
        for url, calls in spent.items():
            assert [first.try_acquire(url) for _ in range(calls)] == [True] * calls

        def saved() -> bool:
            return sorted(u for _, _, u in checkpointed(engine)) == sorted(spent.values())

        wait_for("both counters checkpointed", saved)
    finally:
        first.close()
    for node in cluster.running():
        node.client().flushall()  # every counter gone, as after a restart of every master
    second = limiter(db_url, cluster.url, key_prefix, **settings)
    try:
        for url, calls in spent.items():
            left = 20 - calls
            got = [second.try_acquire(url) for _ in range(left + 3)]
            assert got == [True] * left + [False] * 3, url
    finally:
        second.close()
