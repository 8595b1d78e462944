"""``conf set URL --priority CLASS`` and ``conf set '*' --channel C --reserve SHARES``
write the priority columns; bad values are refused naming the field before anything is
written; rows written by plain SQL with bad values are skipped by the reload with a
warning naming the configId. On MariaDB and SQLite."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from tests.support.commandline import Command, Refuses, conf_columns
from tests.support.limiting import write_row

URL = "/ibe/flight/search"

pytestmark = pytest.mark.usefixtures("no_local_settings")


def priority_columns(engine: Engine) -> list[tuple[Any, ...]]:
    return conf_columns(engine, "interfaceUrl", "channelType", "priority", "reserve")


def test_conf_set_writes_the_class_and_the_channel_reserve(
    command: Command, migrated_any_db: tuple[str, Engine]
) -> None:
    engine = migrated_any_db[1]
    ran = command(
        *("conf", "set", URL, "--rate", "100", "--channel", "IBE+"),
        *("--priority", "sheddable", "--enable"),
    )
    assert ran.code == 0, ran.err
    assert "priority 'sheddable'" in ran.out or "sheddable" in ran.out
    ran = command(
        *("conf", "set", "*", "--channel", "IBE+", "--rate", "100", "--enable"),
        *("--reserve", "default=0.1,sheddable_plus=0.3,sheddable=0.5"),
    )
    assert ran.code == 0, ran.err
    assert priority_columns(engine) == [
        (1, URL, "IBE+", "sheddable", None),
        (2, "*", "IBE+", None, "default=0.1,sheddable_plus=0.3,sheddable=0.5"),
    ]
    listed = json.loads(command("conf", "list", "--json").out)["rows"]
    assert [(r["priority"], r["reserve"]) for r in listed] == [
        ("sheddable", None),
        (None, "default=0.1,sheddable_plus=0.3,sheddable=0.5"),
    ]
    effects = [r["effect"] for r in listed]
    assert "calls sheddable unless they say" in effects[0]
    assert "reserve default=0.1,sheddable_plus=0.3,sheddable=0.5" in effects[1]
    ran = command("conf", "set", URL, "--priority", "none")
    assert ran.code == 0, ran.err
    assert priority_columns(engine)[0][3] is None


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("--priority", "urgent"), "argument --priority: priority 'urgent'"),
        (("--reserve", "sheddable=1.5"), "argument --reserve: reserve 'sheddable=1.5'"),
        (("--reserve", "critical=0.1"), "argument --reserve"),
        (("--reserve", "default=0.5,sheddable=0.2"), "at least what default leaves"),
        (("--reserve", "default=0.1", "--algorithm", "warm_up", "--warmup", "2"), "reserve"),
    ],
)
def test_conf_set_refuses_bad_priority_values_naming_the_field(
    refuses: Refuses, argv: tuple[str, ...], says: str
) -> None:
    refuses(("conf", "set", URL, "--rate", "100", *argv), says)


def test_a_priority_on_a_channel_row_is_refused(
    refuses: Refuses,
) -> None:
    argv = ("conf", "set", "*", "--channel", "IBE+", "--rate", "100", "--priority", "critical")
    refuses(argv, "priority", "channel row")


def test_the_reload_skips_rows_with_bad_values_naming_the_config_id(
    migrated_db: tuple[str, Engine], caplog: pytest.LogCaptureFixture
) -> None:
    db, engine = migrated_db
    bad_reserve = write_row(engine, "/bad/reserve", rateLimit=5, reserve="sheddable=2")
    bad_class = write_row(engine, "/bad/class", rateLimit=5, priority="urgent")
    write_row(engine, "/good", rateLimit=5, priority="critical", reserve="sheddable=0.5")
    with caplog.at_level(logging.WARNING, logger="gateway_limiter"):
        lim = GatewayLimiter(database_url=db, redis_url="memory://")
        lim.start()
    try:
        rules = lim.registry.snapshot.rules
        assert set(rules) == {"/good"}
        said = caplog.text
        assert f"configId {bad_reserve}" in said and "reserve" in said
        assert f"configId {bad_class}" in said and "priority 'urgent'" in said
    finally:
        lim.close()
