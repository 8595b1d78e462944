"""Shadow mode from the table and the command line: ``conf set --shadow/--no-shadow``
writes the column, ``conf list`` and ``status`` show it, and a schema from before
revision 0005 still loads. Real MariaDB and SQLite; the CLI runs in-process."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from gateway_limiter.config.migrate import upgrade
from gateway_limiter.config.rules import build_rules
from gateway_limiter.config.table import make_engine, read_rows
from tests.support.commandline import cli, settings_file
from tests.support.limiting import limiter, write_row
from tests.support.services import RedisServer

#: No settings.toml or GATEWAY_LIMITER_* from the developer's machine leak in.
pytestmark = pytest.mark.usefixtures("no_local_settings")


def shadow_of(engine: Engine, url: str) -> object:
    with engine.connect() as conn:
        return conn.execute(
            text("select shadow from t_ratelimite_conf where interfaceUrl = :u"), {"u": url}
        ).scalar_one()


def test_conf_set_turns_shadow_on_and_off_and_says_what_it_means(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_any_db
    code, out, err = cli(capsys, "--database-url", db, "conf", "set", "/s", "--rate", "5")
    assert code == 0, err
    assert shadow_of(engine, "/s") == 0  # a new row is enforced unless --shadow

    code, out, err = cli(
        capsys, "--database-url", db, "conf", "set", "/s", "--rate", "5", "--enable", "--shadow"
    )
    assert code == 0, err
    assert shadow_of(engine, "/s") == 1
    assert "shadow 0 -> 1" in out
    assert "IN SHADOW MODE: decided and counted, never enforced" in out

    code, out, err = cli(capsys, "--database-url", db, "conf", "set", "/s", "--rate", "7")
    assert code == 0, err
    assert shadow_of(engine, "/s") == 1  # a flag left out leaves the column as it is

    code, out, err = cli(
        capsys, "--database-url", db, "conf", "set", "/s", "--rate", "7", "--no-shadow"
    )
    assert code == 0, err
    assert shadow_of(engine, "/s") == 0
    assert "SHADOW" not in out

    code, out, err = cli(
        capsys, "--database-url", db, "conf", "set", "/s", "--rate", "7", "--shadow", "--no-shadow"
    )
    assert code == 2
    assert "not allowed with argument" in err


def test_conf_list_has_a_shadow_column_and_says_shadow_rows_are_not_enforced(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_any_db
    write_row(engine, "/trial", rateLimit=20, cache=0.2, status=1, shadow=1)
    write_row(engine, "/real", rateLimit=20, cache=0.2, status=1)
    code, out, err = cli(capsys, "--database-url", db, "conf", "list")
    assert code == 0, err
    lines = out.splitlines()
    header = lines[1].split()
    assert header[6:8] == ["status", "shadow"]
    trial = next(line for line in lines if " /trial " in line).split()
    real = next(line for line in lines if " /real " in line).split()
    assert (trial[6], trial[7]) == ("1", "1")
    assert (real[6], real[7]) == ("1", "0")
    assert "shadow (not enforced): 20/s, burst 20, wait <= 0.2 s" in " ".join(trial)
    assert "shadow" not in " ".join(real[8:])


def test_an_enforced_row_wins_over_a_shadow_row_for_the_same_url(
    migrated_any_db: tuple[str, Engine],
) -> None:
    _, engine = migrated_any_db
    with engine.begin() as conn:
        for rate, shadow in ((5, 1), (50, 0)):  # the shadow row is stricter, and loses
            conn.execute(
                text(
                    "insert into t_ratelimite_conf (interfaceUrl, rateLimit, status, shadow) "
                    "values ('/x', :r, 1, :s)"
                ),
                {"r": rate, "s": shadow},
            )
    ruleset = build_rules(read_rows(engine), 0.5)
    rule = ruleset.rules["/x"]
    assert (rule.rate, rule.shadow) == (50, False)
    (skipped,) = ruleset.skipped
    assert "is enforced (this one is shadow) and applies" in skipped.reason


def test_status_marks_shadow_rules(
    capsys: pytest.CaptureFixture[str],
    migrated_any_db: tuple[str, Engine],
    redis_server: RedisServer,
    key_prefix: str,
    tmp_path: Path,
) -> None:
    db, engine = migrated_any_db
    write_row(engine, "/trial", rateLimit=1, cache=0.0, status=1, shadow=1)  # 1 s per permit
    settings = settings_file(tmp_path, db, redis_server.url, key_prefix)
    lim = limiter(db, redis_server.url, key_prefix)
    try:
        assert all(lim.try_acquire("/trial") for _ in range(5))  # shadow: never refused
    finally:
        lim.close()
    code, out, err = cli(capsys, "--settings", str(settings), "status")
    assert code == 0, err
    line = next(line for line in out.splitlines() if line.startswith("/trial "))
    assert float(line.split()[5]) < 1  # drained (plus what refilled since), as if enforced
    assert "shadow: counted, not enforced" in line


def test_a_table_from_before_revision_0005_still_loads_enforced(
    mariadb_db: str,
    redis_server: RedisServer,
    key_prefix: str,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = make_engine(mariadb_db)
    try:
        upgrade(engine, "0003")  # code newer than the schema: no shadow column yet
        write_row(engine, "/old", rateLimit=2, cache=0.0, status=1)
        assert read_rows(engine)[0].shadow is None
        caplog.set_level(logging.WARNING, logger="gateway_limiter")
        lim = limiter(mariadb_db, redis_server.url, key_prefix)
        try:
            assert lim.registry.snapshot.rules["/old"].shadow is False
            assert [lim.decide("/old").reason for _ in range(3)] == [
                "admitted",
                "admitted",
                "limited",
            ]
        finally:
            lim.close()
        assert not caplog.records  # nothing skipped, nothing to warn about
        code, out, err = cli(capsys, "--database-url", mariadb_db, "conf", "list")
        assert code == 0, err
        assert next(line for line in out.splitlines() if " /old " in line).split()[7] == "-"
    finally:
        engine.dispose()
