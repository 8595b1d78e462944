"""The worker-pool recipes (examples/deploy/, docs/deploy.md), run as documented on a
real MariaDB table and a private Redis: a ``multiprocessing`` pool forked after the
limiter started, and a plain thread pool. Each: every worker follows a row change
within ``reload_interval``, the fleet is the processes that decide, and together they
admit what the row allows."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rq import Queue
from sqlalchemy import Engine

from tests.support.deploy import (
    BIN,
    RECIPES,
    Seen,
    Served,
    fleet_pids,
    limiter_env,
    poll,
    reached_by,
    stop,
)
from tests.support.limiting import write_row
from tests.support.services import RedisServer

pytestmark = pytest.mark.slow

RELOAD_S = 1.0
REACHED_WITHIN_S = RELOAD_S * 1.1 + 1.0
RATE = "/sup/rate"
COUNTED = "/sup/counted"
COUNTED_LIMIT = 10


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


class Batches:
    """A recipe that reads batches of interfaces on stdin and prints a JSON line each."""

    def __init__(self, script: str, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(RECIPES / script)], cwd=RECIPES, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    err = ""

    def line(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        text = self.process.stdout.readline()
        assert text, f"the recipe ended: {self.stop()}"
        answer: dict[str, Any] = json.loads(text)
        return answer

    def batch(self, *urls: str) -> list[dict[str, Any]]:
        assert self.process.stdin is not None
        self.process.stdin.write(" ".join(urls) + "\n")
        self.process.stdin.flush()
        return [self.line() for _ in urls]

    def stop(self) -> str:
        """Close stdin (the recipe ends), and what it said on stderr."""
        if self.process.stdin is None:
            return self.err
        self.process.stdin.close()
        self.process.stdin = None
        try:
            _, err = self.process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, err = self.process.communicate()
        self.err = str(err)
        return self.err


@pytest.mark.parametrize(("recipe", "processes"), [("fork_pool.py", 2), ("thread_pool.py", 1)])
def test_a_worker_pool_follows_the_table(
    recipe: str, processes: int, migrated_db: tuple[str, Engine], redis: RedisServer,
    key_prefix: str,
) -> None:  # fmt: skip
    db, engine = migrated_db
    write_row(engine, RATE, rateLimit=1000, cache=0)
    write_row(engine, COUNTED, rateLimit=COUNTED_LIMIT, periodSeconds=3600, cache=0)
    env = limiter_env(db, redis.url, key_prefix, WORKERS=str(processes), THREADS="6")
    pool = Batches(recipe, env)
    try:
        workers = set(pool.line()["workers"])
        assert len(workers) == processes
        answers = pool.batch(*[RATE] * 20)
        assert {a["limit"] for a in answers} == {1000}
        decided = {a["pid"] for a in answers}
        assert decided <= workers
        # a worker joins the fleet with its first decision, and a pool may hand one worker
        # a whole batch: batches go on until every worker has decided (bounded)
        for _ in range(50):
            if decided == workers:
                break
            decided |= {a["pid"] for a in pool.batch(*[RATE] * 20)}
        assert decided == workers
        # the fork pool's parent only hands out jobs: the fleet is the workers
        assert poll(lambda: fleet_pids(env) == workers, 10), (fleet_pids(env), workers)

        def batch() -> list[Seen]:
            sent_at = time.monotonic()
            return [(sent_at, a["pid"], a["limit"]) for a in pool.batch(*[RATE] * 8)]

        write_row(engine, RATE, rateLimit=2000)
        assert reached_by(workers, 2000, batch, 15) < REACHED_WITHIN_S

        counted = pool.batch(*[COUNTED] * (3 * COUNTED_LIMIT))
        assert sum(a["allowed"] for a in counted) == COUNTED_LIMIT
        assert fleet_pids(env) == workers
    finally:
        err = pool.stop()
    assert pool.process.returncode == 0, err
    if recipe == "thread_pool.py":  # closed by its with: left the fleet at once
        assert fleet_pids(env) == set()


def test_an_rq_worker_pool_follows_the_table(
    migrated_db: tuple[str, Engine], redis: RedisServer, key_prefix: str, tmp_path: Path
) -> None:
    db, engine = migrated_db
    write_row(engine, RATE, rateLimit=1000, cache=0)
    write_row(engine, COUNTED, rateLimit=COUNTED_LIMIT, periodSeconds=3600, cache=0)
    env = limiter_env(db, redis.url, key_prefix)
    argv = [
        str(BIN / "rq"), "worker-pool", "-n", "2", "-w", "rq.worker.SimpleWorker",
        "-u", redis.url, "-P", str(RECIPES), "supplier",
    ]  # fmt: skip
    log = tmp_path / "rq.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            argv, cwd=RECIPES, env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
    served = Served(process, 0, log)
    connection = redis.client()
    queue = Queue("supplier", connection=connection)

    def run(*urls: str) -> list[tuple[float, dict[str, Any]]]:
        sent_at = time.monotonic()
        jobs = [queue.enqueue("rq_jobs.call_supplier", url) for url in urls]
        results: list[tuple[float, dict[str, Any]]] = []
        for job in jobs:
            assert poll(lambda job=job: job.get_status() in ("finished", "failed"), 30, 0.02)
            result = job.return_value()
            assert isinstance(result, dict), (job.get_status(), served.output())
            results.append((sent_at, result))
        return results

    try:
        assert poll(lambda: len(served.workers()) == 2, 30), served.output()
        workers = served.workers()
        seen: set[int] = set()

        def every_worker_answered() -> bool:
            seen.update(result["pid"] for _, result in run(RATE, RATE))
            return seen == workers

        assert poll(every_worker_answered, 30), (seen, workers)
        assert poll(lambda: fleet_pids(env) == workers, 10), (fleet_pids(env), workers)

        def batch() -> list[Seen]:
            return [(sent_at, r["pid"], r["limit"]) for sent_at, r in run(*[RATE] * 6)]

        write_row(engine, RATE, rateLimit=2000)
        assert reached_by(workers, 2000, batch, 15) < REACHED_WITHIN_S

        counted = run(*[COUNTED] * (3 * COUNTED_LIMIT))
        assert sum(r["allowed"] for _, r in counted) == COUNTED_LIMIT
    finally:
        connection.close()
        stop(process)
