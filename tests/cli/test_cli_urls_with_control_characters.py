"""A URL with a newline, tab, NUL, escape or other control character is refused by
``conf set``, ``enable``, ``disable`` and ``delete`` with exit 2 and one line naming the
character, before the database is touched (no caller sends such a URL, and a newline
would split every line that shows the row)."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text

from tests.support.commandline import cli

pytestmark = pytest.mark.usefixtures("no_local_settings")

BAD = {
    "newline": ("/ibe/x\nGET /admin", r"'\n'"),
    "carriage return": ("/ibe/x\r", r"'\r'"),
    "tab": ("/ibe/\tx", r"'\t'"),
    "NUL": ("/ibe/x\x00", r"'\x00'"),
    "escape": ("/ibe/\x1b[31mx", r"'\x1b'"),
    "DEL": ("/ibe/x\x7f", r"'\x7f'"),
    "C1 control": ("/ibe/x\x85", r"'\x85'"),
    "line separator": ("/ibe/x\u2028y", r"'\u2028'"),
}
COMMANDS = {
    "set": ["set", "{url}", "--rate", "5"],
    "enable": ["enable", "{url}"],
    "disable": ["disable", "{url}", "--period", "1"],
    "delete": ["delete", "{url}"],
}


def row_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("select count(*) from t_ratelimite_conf")).scalar_one())


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("case", list(BAD))
def test_a_url_with_a_control_character_is_refused_with_exit_2(
    capsys: pytest.CaptureFixture[str],
    migrated_any_db: tuple[str, Engine],
    command: str,
    case: str,
) -> None:
    db, engine = migrated_any_db
    url, shown = BAD[case]
    with engine.begin() as conn:  # a row the command could touch, were the URL accepted
        conn.execute(
            text(
                "insert into t_ratelimite_conf (interfaceUrl, rateLimit, status) values (:u, 5, 1)"
            ),
            {"u": url},
        )
    argv = [url if a == "{url}" else a for a in COMMANDS[command]]
    ran = cli(capsys, "--database-url", db, "conf", *argv)
    assert ran.code == 2, (ran.out, ran.err)
    assert ran.out == ""
    [line] = ran.err.splitlines()
    assert "control character" in line and shown in line, line
    with engine.connect() as conn:
        status = conn.execute(text("select status from t_ratelimite_conf")).scalar_one()
    assert (row_count(engine), status) == (1, 1)


def test_a_plain_url_with_unicode_is_still_accepted(
    capsys: pytest.CaptureFixture[str], migrated_any_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_any_db
    ran = cli(capsys, "--database-url", db, "conf", "set", "/ibe/é中/x", "--rate", "5")
    assert ran.code == 0, ran.err
    assert row_count(engine) == 1
