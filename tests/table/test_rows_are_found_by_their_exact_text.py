"""Every command finds a row by the exact text it holds, as the limiter does when it
matches a call, never by the database's comparison of text (which, under MariaDB's
default collation, says 'partner' = 'Partner' and 'IBE+ ' = 'IBE+'): an edit never lands
on another row. On MariaDB before and after revision 0008."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, text

from gateway_limiter import admin
from tests.support.commandline import cli
from tests.support.limiting import write_row

pytestmark = pytest.mark.usefixtures("no_local_settings")


def rows(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        found = conn.execute(
            text(
                "select configId, interfaceUrl, channelType, callerKey, rateLimit, status "
                "from t_ratelimite_conf order by configId"
            )
        ).all()
    return [tuple(r) for r in found]


def test_a_named_caller_in_other_case_gets_its_own_row(
    capsys: pytest.CaptureFixture[str], collated_db: tuple[str, Engine]
) -> None:
    db, engine = collated_db
    partner = write_row(engine, "/fare", rateLimit=10, perCaller=1, callerKey="Partner")
    ran = cli(
        capsys, "--database-url", db, "conf", "set", "/fare", "--per-caller",
        "--caller", "partner", "--rate", "50",
    )  # fmt: skip
    assert ran.code == 0, ran.err
    assert "created configId" in ran.out
    assert rows(engine) == [
        (partner, "/fare", None, "Partner", 10, 1),
        (partner + 1, "/fare", None, "partner", 50, 0),
    ]


def test_a_channel_cap_in_other_case_leaves_the_cap_of_its_twin(
    capsys: pytest.CaptureFixture[str], collated_db: tuple[str, Engine]
) -> None:
    db, engine = collated_db
    cap = write_row(engine, "*", rateLimit=100, channelType="IBE+")
    ran = cli(
        capsys, "--database-url", db, "conf", "set", "*", "--channel", "ibe+", "--rate", "500"
    )
    assert ran.code == 0, ran.err
    assert rows(engine) == [(cap, "*", "IBE+", None, 100, 1), (cap + 1, "*", "ibe+", None, 500, 0)]
    for action in ("disable", "delete"):
        ran = cli(capsys, "--database-url", db, "conf", action, "*", "--channel", "IBE+ ")
        assert ran.code == 1, ran.out  # 'IBE+ ' is no channel of the table
        assert "no row for URL *" in ran.err
    assert rows(engine)[0] == (cap, "*", "IBE+", None, 100, 1)
    assert cli(capsys, "--database-url", db, "conf", "delete", "*", "--channel", "ibe+").code == 0
    assert rows(engine) == [(cap, "*", "IBE+", None, 100, 1)]


def test_admin_set_limit_writes_the_url_it_names(collated_db: tuple[str, Engine]) -> None:
    db, engine = collated_db
    lower = write_row(engine, "/api/x", rateLimit=100)
    made = admin.set_limit(db, "/API/x", 5)
    assert made != lower
    assert rows(engine) == [
        (lower, "/api/x", None, None, 100, 1),
        (made, "/API/x", None, None, 5, 1),
    ]


def test_twins_lock_no_command_out(
    capsys: pytest.CaptureFixture[str], collated_db: tuple[str, Engine]
) -> None:
    db, engine = collated_db
    lower = write_row(engine, "/api/x", rateLimit=100)
    upper = write_row(engine, "/API/x", add=True, rateLimit=7)
    accent = write_row(engine, "/hotel/e", rateLimit=3)
    accented = write_row(engine, "/hotel/é", add=True, rateLimit=4)
    for url in ("/api/x", "/API/x", "/hotel/e", "/hotel/é"):
        for argv in (("set", url, "--rate", "9"), ("disable", url), ("enable", url)):
            ran = cli(capsys, "--database-url", db, "conf", *argv)
            assert ran.code == 0, (argv, ran.err)
    assert [r[4] for r in rows(engine)] == [9, 9, 9, 9]
    assert cli(capsys, "--database-url", db, "conf", "delete", "/API/x").code == 0
    assert [r[0] for r in rows(engine)] == [lower, accent, accented]
    assert upper not in [r[0] for r in rows(engine)]
