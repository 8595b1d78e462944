"""A change is checked against the row as it is in the transaction that writes it: a
change another session makes meanwhile is included in the check (the writer waits for
it), so no command or console edit answers "ok" and leaves a row the reload skips; and
what MariaDB's single-precision FLOAT would store is what is checked. MariaDB."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, text

from gateway_limiter import admin
from gateway_limiter.config.rules import Skipped, build_rules
from gateway_limiter.config.table import read_rows
from tests.console.conftest import TOKEN, serve
from tests.support.commandline import Ran, cli
from tests.support.limiting import write_row
from tests.support.services import RedisServer
from tests.table.conftest import wait_for_lock_wait

pytestmark = pytest.mark.usefixtures("no_local_settings")

URL = "/race2"


def _row(engine: Engine, config_id: int) -> tuple[Any, ...]:
    with engine.connect() as conn:
        found = conn.execute(
            text(
                "select algorithm, maxPermits, warmupPeriod from t_ratelimite_conf "
                "where configId = :i"
            ),
            {"i": config_id},
        ).one()
    return tuple(found)


def _while_another_session_switches_to_warm_up(
    engine: Engine, database: str, config_id: int, write: Callable[[], Any]
) -> Any:
    """Run ``write`` while another transaction, holding the row, changes it to warm_up;
    commit that transaction once ``write`` waits for the row (or has finished)."""
    result: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            result["value"] = write()
        finally:
            done.set()

    with engine.connect() as other:
        other.execute(
            text(
                "update t_ratelimite_conf set algorithm = 'warm_up', warmupPeriod = 5 "
                "where configId = :i"
            ),
            {"i": config_id},
        )
        writer = threading.Thread(target=run)
        writer.start()
        wait_for_lock_wait(engine, database, done)
        other.commit()
    writer.join(60)
    assert not writer.is_alive()
    return result["value"]


def _skipped(engine: Engine) -> list[Skipped]:
    return list(build_rules(read_rows(engine), 0.5).skipped)


def test_conf_set_checks_the_row_another_session_changed_meanwhile(
    capsys: pytest.CaptureFixture[str], migrated_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_db
    config_id = write_row(engine, URL, rateLimit=10)

    def conf_set() -> Ran:
        return cli(capsys, "--database-url", db, "conf", "set", URL, "--max-permits", "5")

    ran = _while_another_session_switches_to_warm_up(
        engine, db.rsplit("/", 1)[1], config_id, conf_set
    )
    assert ran.code == 2, ran.out
    assert "maxPermits" in ran.err
    assert _row(engine, config_id) == ("warm_up", None, 5.0)
    assert _skipped(engine) == []


def test_a_console_edit_checks_the_row_another_session_changed_meanwhile(
    migrated_db: tuple[str, Engine], redis_server: RedisServer, key_prefix: str
) -> None:
    db, engine = migrated_db
    config_id = write_row(engine, URL, rateLimit=10)
    for served in serve(db, engine, redis_server.url, key_prefix, TOKEN):
        with served.client() as client:

            def patch() -> httpx.Response:
                return client.patch(f"/api/rules/{config_id}", json={"maxPermits": 5})

            answer = _while_another_session_switches_to_warm_up(
                engine, db.rsplit("/", 1)[1], config_id, patch
            )
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"] == "maxPermits"
    assert _row(engine, config_id) == ("warm_up", None, 5.0)
    assert _skipped(engine) == []


def test_a_warm_up_period_mariadb_would_store_as_zero_is_refused_everywhere(
    capsys: pytest.CaptureFixture[str],
    migrated_db: tuple[str, Engine],
    redis_server: RedisServer,
    key_prefix: str,
) -> None:
    db, engine = migrated_db
    config_id = write_row(engine, URL, rateLimit=10, algorithm="warm_up", warmupPeriod=5)
    ran = cli(capsys, "--database-url", db, "conf", "set", URL, "--warmup", "1e-46")
    assert ran.code == 2
    assert "warmupPeriod" in ran.err or "--warmup" in ran.err
    with pytest.raises(ValueError, match=r"warmupPeriod.*1e-46"):
        admin.set_limit(db, URL, 10, algorithm="warm_up", warmup_period=1e-46)
    for served in serve(db, engine, redis_server.url, key_prefix, TOKEN):
        with served.client() as client:
            answer = client.patch(f"/api/rules/{config_id}", json={"warmupPeriod": 1e-46})
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"] == "warmupPeriod"
    assert _row(engine, config_id) == ("warm_up", None, 5.0)
    # the shortest warm-up period a row may have is stored and applied as such
    ran = cli(capsys, "--database-url", db, "conf", "set", URL, "--warmup", "0.001")
    assert ran.code == 0, ran.err
    assert _skipped(engine) == []


def test_admin_refuses_a_limit_the_reload_would_skip_beside_the_rows_of_its_url(
    migrated_db: tuple[str, Engine],
) -> None:
    db, engine = migrated_db
    write_row(engine, URL, rateLimit=10, periodSeconds=60)
    with pytest.raises(ValueError, match="the reload would skip"):
        admin.set_limit(db, URL, 5, algorithm="warm_up", warmup_period=3)
    assert _skipped(engine) == []


def test_conf_enable_refuses_a_row_the_reload_would_skip(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_any_db
    empty = write_row(engine, "/no-rate", status=0)  # rateLimit NULL, written by SQL
    ran = cli(capsys, "--database-url", db, "conf", "enable", "/no-rate")
    assert ran.code == 2
    assert f"configId {empty} would not be limited once enabled" in ran.err
    assert "rateLimit" in ran.err
    write_row(engine, URL, rateLimit=10, periodSeconds=60)
    warm = write_row(
        engine, URL, add=True, rateLimit=5, algorithm="warm_up", warmupPeriod=3, status=0
    )
    ran = cli(capsys, "--database-url", db, "conf", "enable", URL, "--period", "1")
    assert ran.code == 2
    assert f"configId {warm} would not be limited once enabled" in ran.err
    with engine.connect() as conn:
        statuses = conn.execute(
            text("select status from t_ratelimite_conf order by configId")
        ).scalars()
        assert list(statuses) == [0, 1, 0]
    assert _skipped(engine) == []
