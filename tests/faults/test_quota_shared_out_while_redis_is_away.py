"""A daily quota while Redis is away, under the ``share`` failure policy, against real
processes: each process decides on its part of what the fleet had left of the day (the
count it last knew, from the replies and the counters it reads every
``quota_checkpoint_s``), not on its part of a whole fresh day. Three processes; one spends
most of the day's quota through Redis; the private redis-server is then killed and every
process calls on: together they admit no more than was left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.support.limiting import write_row
from tests.support.services import RedisServer

URL = "/quota/outage"
ZONE = "Asia/Shanghai"
QUOTA = 60
SPENT = 45  # through Redis, before it goes
RATE = 30  # per second fleet-wide: each process's part, 10/s and 10 saved, binds less
PROCESSES = 3

WORKER = textwrap.dedent("""
    import json, sys, time
    from gateway_limiter import GatewayLimiter
    from gateway_limiter.core.decision import Reason
    db, redis_url, prefix, url, processes = sys.argv[1:6]
    with GatewayLimiter(database_url=db, redis_url=redis_url, key_prefix=prefix,
                        redis_timeout=0.5, redis_timeout_ceiling=1.0, quota_checkpoint_s=0.3,
                        fleet_size=int(processes), fleet_heartbeat=0.2,
                        on_backend_error="share") as lim:
        print("ready", flush=True)
        spend = int(sys.stdin.readline())
        spent = 0
        while spent < spend:
            spent += lim.decide(url, timeout=2.0).allowed
        print("spent", flush=True)
        sys.stdin.readline()  # Redis is gone
        admitted = fell_back = 0
        end = time.time() + 4.0
        while time.time() < end:
            d = lim.decide(url, timeout=0)
            admitted += d.allowed
            fell_back += d.reason == Reason.BACKEND_FALLBACK
            time.sleep(0.02)
        print(json.dumps({"admitted": admitted, "fell_back": fell_back}), flush=True)
""")


@pytest.mark.slow
def test_the_fleet_admits_no_more_than_was_left_while_redis_is_away(
    migrated_db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str
) -> None:
    db_url, engine = migrated_db
    write_row(engine, URL, rateLimit=RATE, cache=0)
    write_row(engine, URL, add=True, rateLimit=QUOTA, cache=0, quotaPeriod="day", timeZone=ZONE)
    env = os.environ | {"PYTHONPATH": str(Path(__file__).parents[2])}
    args = [db_url, private_redis.url, key_prefix, URL, str(PROCESSES)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(PROCESSES)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"

        def say(p: subprocess.Popen[str], line: str) -> None:
            assert p.stdin is not None
            p.stdin.write(line + "\n")
            p.stdin.flush()

        for i, p in enumerate(procs):
            say(p, str(SPENT if i == 0 else 0))
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "spent"
        # real time: every process has read the counter (every 0.3 s) since
        time.sleep(1.5)
        private_redis.kill()
        for p in procs:
            say(p, "gone")
        outcomes = []
        for p in procs:
            assert p.stdout is not None
            outcomes.append(json.loads(p.stdout.readline()))
            assert p.wait(timeout=60) == 0
    finally:
        for p in procs:
            p.kill()
    admitted = sum(o["admitted"] for o in outcomes)
    assert all(o["fell_back"] > 0 for o in outcomes)  # every process decided without Redis
    # each process's part of the 15 left: 5 (a fresh day's part would be 20, less the
    # 10 the share's empty start takes: 30 in all, twice what was left)
    assert 0 < admitted <= QUOTA - SPENT, outcomes
