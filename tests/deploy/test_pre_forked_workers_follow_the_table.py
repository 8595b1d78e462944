"""The deployment recipes (examples/deploy/, docs/deploy.md) under the real servers:
gunicorn (sync and gthread workers, with and without ``--preload``: the limiter is
started at import, so with ``--preload`` it starts in the master before the fork),
uvicorn and hypercorn workers (the limiter starts in the lifespan).

One server start per setup, on a real MariaDB table and a private Redis; each checks:

- ``gateway-limiter fleet`` lists exactly the worker processes (not a master that only
  forks);
- a row change reaches every worker within ``reload_interval`` (1 s here);
- the workers together admit exactly what the row allows (one shared bucket);
- stopped, the workers leave the fleet at once;
- with ``--preload`` and prometheus-client's multiprocess mode, each worker writes
  its own metrics (a file of its pid, its gauges set afresh after the fork).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.mmap_dict import MmapedDict
from sqlalchemy import Engine

from tests.support.deploy import (
    BIN,
    Answer,
    Seen,
    ask,
    fleet_pids,
    limiter_env,
    poll,
    reached_by,
    serve,
)
from tests.support.limiting import write_row
from tests.support.services import RedisServer, free_port

pytestmark = pytest.mark.slow

WORKERS = 2
RELOAD_S = 1.0
#: One reload interval, its jitter (a tenth), a reload's own time and a loaded host.
REACHED_WITHIN_S = RELOAD_S * 1.1 + 1.0
RATE = "/sup/rate"
COUNTED = "/sup/counted"
COUNTED_LIMIT = 10


def gunicorn(*options: str) -> list[str]:
    return [str(BIN / "gunicorn"), "-w", str(WORKERS), *options]


SETUPS = {
    "gunicorn-sync": (gunicorn(), "wsgi_gunicorn:app"),
    "gunicorn-sync-preload": (gunicorn("--preload"), "wsgi_gunicorn:app"),
    "gunicorn-gthread": (gunicorn("-k", "gthread", "--threads", "4"), "wsgi_gunicorn:app"),
    "gunicorn-gthread-preload": (
        gunicorn("-k", "gthread", "--threads", "4", "--preload"),
        "wsgi_gunicorn:app",
    ),
    "uvicorn": ([str(BIN / "uvicorn"), "--workers", str(WORKERS)], "asgi_workers:app"),
    "hypercorn": ([str(BIN / "hypercorn"), "--workers", str(WORKERS)], "asgi_workers:app"),
}


def bind(name: str, port: int) -> list[str]:
    if name.startswith("gunicorn"):
        return ["-b", f"127.0.0.1:{port}"]
    if name == "uvicorn":
        return ["--host", "127.0.0.1", "--port", str(port)]
    return ["-b", f"127.0.0.1:{port}"]


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.mark.parametrize("setup", list(SETUPS))
def test_every_worker_follows_the_table_and_the_fleet_is_the_workers(
    setup: str,
    migrated_db: tuple[str, Engine],
    redis: RedisServer,
    key_prefix: str,
    tmp_path: Path,
) -> None:
    db, engine = migrated_db
    write_row(engine, RATE, rateLimit=1000, cache=0)
    write_row(engine, COUNTED, rateLimit=COUNTED_LIMIT, periodSeconds=3600, cache=0)
    metrics = tmp_path / "prometheus"
    metrics.mkdir()
    preloaded = setup.endswith("-preload")
    more = {"PROMETHEUS_MULTIPROC_DIR": str(metrics), "GATEWAY_LIMITER_METRICS": "true"}
    env = limiter_env(db, redis.url, key_prefix, **(more if preloaded else {}))
    port = free_port()
    command, app = SETUPS[setup]
    with serve(
        [*command, *bind(setup, port), app], env, port, tmp_path / "server.log", WORKERS
    ) as served:
        workers = served.workers()
        assert len(workers) == WORKERS

        # Every worker has decided and beaten: the fleet is the workers, nothing else.
        seen: dict[int, Answer] = {}

        def every_worker_answered() -> bool:
            answer = ask(port, RATE)
            assert answer.status == 200, (answer, served.output())
            if answer.pid is not None:
                seen[answer.pid] = answer
            return set(seen) == workers

        assert poll(every_worker_answered, 30, every_s=0), (seen, workers)
        assert {a.limit for a in seen.values()} == {1000}
        assert poll(lambda: fleet_pids(env) == workers, 10), (fleet_pids(env), workers)

        # A row change reaches every worker within the reload interval.
        write_row(engine, RATE, rateLimit=2000)

        def one() -> list[Seen]:
            answer = ask(port, RATE)
            return [(answer.sent_at, answer.pid, answer.limit)]

        assert reached_by(workers, 2000, one, 15) < REACHED_WITHIN_S

        # The workers share one bucket: 10 per hour, whoever asks.
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda _: ask(port, COUNTED), range(3 * COUNTED_LIMIT)))
        assert sorted({a.status for a in answers}) == [200, 429]
        assert sum(a.status == 200 for a in answers) == COUNTED_LIMIT
        assert fleet_pids(env) == workers  # still the workers, after all that
    # stopped: every worker closed its limiter and left (a member lapses after 15 s)
    assert fleet_pids(env) == set()

    if preloaded:  # each worker's own files, its gauges set since the fork
        for pid in workers:
            assert published(metrics / f"gauge_mostrecent_{pid}.db", "effective_rate") == {
                RATE: 2000.0,
                COUNTED: 10.0,
            }
            assert published(metrics / f"counter_{pid}.db", "decisions_total").keys() >= {RATE}


def published(path: Path, metric: str) -> dict[str, float]:
    """interface -> value of ``gateway_limiter_<metric>`` in one worker's file."""
    found = {}
    for key, value, _, _ in MmapedDict.read_all_values_from_file(str(path)):  # type: ignore[no-untyped-call]
        _, name, labels, _ = json.loads(key)
        if name == f"gateway_limiter_{metric}":
            found[labels["interface"]] = value
    return found
