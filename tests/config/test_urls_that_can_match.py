"""An interfaceUrl the integrations never decide on (a scheme and host, or no leading
``/``) is refused by ``conf set`` and the console, saying what they match and how to
map another key (``interface=``), unless told it is a key callers pass themselves; the
reload applies such a row with a warning (callers may pass that key to ``try_acquire``).
The channel row's ``*`` stays valid. Real MariaDB; the console's part is in
tests/console/test_console_api.py."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.config.rules import build_rules, url_shape_problem
from gateway_limiter.config.table import read_rows
from tests.support.commandline import cli
from tests.support.limiting import write_row


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("https://supplier.example/sup/full", "('/sup/full' here)"),
        ("sup/noslash", "which always does ('/sup/noslash')"),
    ],
)
def test_conf_set_refuses_a_url_no_integration_matches(
    capsys: pytest.CaptureFixture[str], migrated_db: tuple[str, Engine], url: str, said: str
) -> None:
    db, engine = migrated_db
    ran = cli(capsys, "--database-url", db, "conf", "set", url, "--rate", "5", "--enable")
    assert ran.code == 2
    assert said in ran.err and "interface=" in ran.err and "--any-key" in ran.err
    assert read_rows(engine) == []
    ran = cli(capsys, "--database-url", db, "conf", "set", url, "--rate", "5", "--any-key")
    assert ran.code == 0, ran.err
    assert [r.interface_url for r in read_rows(engine)] == [url]


def test_paths_and_the_channel_row_are_fine(
    capsys: pytest.CaptureFixture[str], migrated_db: tuple[str, Engine]
) -> None:
    assert url_shape_problem("/sup/full") == ""
    assert url_shape_problem("*") == ""
    db, _ = migrated_db
    ran = cli(capsys, "--database-url", db, "conf", "set", "*", "--channel", "IBE+", "--rate", "9")
    assert ran.code == 0, ran.err


def test_the_reload_applies_such_a_row_with_a_warning(
    migrated_db: tuple[str, Engine], caplog: pytest.LogCaptureFixture
) -> None:
    db, engine = migrated_db
    config_id = write_row(engine, "sup/noslash", rateLimit=2, cache=0.0)
    write_row(engine, "/sup/path", rateLimit=2, cache=0.0)
    ruleset = build_rules(read_rows(engine), 0.5)
    assert "sup/noslash" in ruleset.rules and "/sup/path" in ruleset.rules
    [warning] = ruleset.warnings
    assert warning.startswith(f"configId {config_id}: interfaceUrl 'sup/noslash'")
    caplog.set_level(logging.WARNING, logger="gateway_limiter")
    with GatewayLimiter(database_url=db, redis_url="memory://") as limiter:
        # a caller passing the key itself is still limited by it
        assert [limiter.try_acquire("sup/noslash") for _ in range(3)] == [True, True, False]
    assert any("does not start with '/'" in r.getMessage() for r in caplog.records)
