"""Four processes on one Redis spend one daily quota exactly, though three of their
clocks put them in another day: the Redis clock decides which day it is."""

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

from gateway_limiter.model.calendar import Calendar
from tests.support.limiting import write_row
from tests.support.services import RedisServer

QUOTA = 150
ZONE = "Asia/Shanghai"
WORKER = textwrap.dedent("""
    import json, sys, threading, time, types
    import gateway_limiter.backends.scripts as scripts
    db, redis_url, prefix, seconds, skew = sys.argv[1:4] + [float(a) for a in sys.argv[4:6]]
    # this process's clock, as the limiter reads it to compute the day's boundaries
    real = time.time
    scripts.time = types.SimpleNamespace(time=lambda: real() + skew)
    from gateway_limiter import GatewayLimiter
    admitted, lock = [0], threading.Lock()
    with GatewayLimiter(database_url=db, redis_url=redis_url, key_prefix=prefix,
                        redis_timeout=2.0) as lim:
        print("ready", flush=True)
        start_at = float(sys.stdin.readline())
        time.sleep(max(0.0, start_at - time.time()))
        def work():
            while time.time() < start_at + seconds:
                if lim.try_acquire("/daily"):
                    with lock:
                        admitted[0] += 1
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
        last = lim.decide("/daily")
        fell_back = lim.backend_fallbacks
    print(json.dumps({"admitted": admitted[0], "fell_back": fell_back,
                      "reset_at": last.reset_at}))
""")


@pytest.mark.slow
def test_four_processes_with_skewed_clocks_spend_one_daily_quota_exactly(
    migrated_db: tuple[str, Engine], redis_server: RedisServer, key_prefix: str
) -> None:
    db_url, engine = migrated_db
    write_row(engine, "/daily", rateLimit=1000, cache=0.0)
    write_row(
        engine, "/daily", add=True, rateLimit=QUOTA, cache=0.0, quotaPeriod="day", timeZone=ZONE
    )
    start, end = Calendar.of("day", ZONE).period_at(time.time())
    skews = [
        0.0,
        end - time.time() + 60.0,  # thinks it is a minute into tomorrow
        end - time.time() + 3600.0,  # an hour into tomorrow
        start - time.time() - 60.0,  # a minute before today began
    ]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, db_url, redis_server.url, key_prefix, "1.5", str(s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ | {"PYTHONPATH": str(Path(__file__).parents[2])},
        )
        for s in skews
    ]
    for p in procs:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
    start_at = time.time() + 0.2
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(f"{start_at}\n")
        p.stdin.close()
    results = []
    for p in procs:
        assert p.stdout is not None
        out = p.stdout.read()
        assert p.wait(timeout=60) == 0
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert [r["fell_back"] for r in results] == [0, 0, 0, 0]
    assert sum(r["admitted"] for r in results) == QUOTA
    assert all(r["admitted"] > 0 for r in results)  # each took part
    # every process tells the same renewal: the end of Redis's day, not of its own
    assert {r["reset_at"] for r in results} == {float(end)}
