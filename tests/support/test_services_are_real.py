"""The fixtures reach real servers (and fail, not skip, in CI when they cannot)."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text

from tests.support import services
from tests.support.services import RedisServer


def test_private_redis_answers_and_restarts_on_the_same_port(private_redis: RedisServer) -> None:
    client = private_redis.client()
    client.set("k", "v")
    assert client.get("k") == b"v"
    port = private_redis.port
    private_redis.kill()
    private_redis.start()
    assert private_redis.port == port
    assert private_redis.client().get("k") is None  # restarted empty


def test_mariadb_database_is_real_and_migrated(migrated_db: tuple[str, Engine]) -> None:
    _, engine = migrated_db
    with engine.connect() as conn:
        version = conn.execute(text("select version()")).scalar_one()
    assert "MariaDB" in version


def test_parallel_workers_pick_ports_from_shares_that_do_not_overlap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under pytest-xdist each worker picks from its own share of the ports: two workers
    never hand out the same port between checking that it is free and binding it."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    shares = []
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        low, top = services._port_range()
        assert services.PORTS_FROM <= low < top <= services._ephemeral_from()
        port = services.free_port()
        assert low <= port < top
        shares.append(range(low, top))
    assert not set(shares[0]) & set(shares[1])
