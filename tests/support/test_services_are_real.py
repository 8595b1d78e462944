"""The fixtures reach real servers (and fail, not skip, in CI when they cannot)."""

from __future__ import annotations

from sqlalchemy import Engine, text

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
