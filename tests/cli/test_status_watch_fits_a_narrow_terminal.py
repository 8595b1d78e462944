"""``status --watch`` on an 80-column terminal: every line fits, and no cell is broken
over lines mid-word (columns that matter least give way first, then text is cut with an
ellipsis). Real MariaDB and Redis; rich renders as it would on a terminal 80 wide."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.support.commandline import cli
from tests.support.services import RedisServer

WIDTH = 80
#: CSI sequences (colours, cursor moves, erase) that rich Live writes on a terminal.
CSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
ROWS = {
    "/ibe/flight/search/availability": ["--rate", "20", "--cache", "0.2", "--shadow"],
    "/ibe/booking/create": ["--rate", "5", "--algorithm", "warm_up", "--warmup", "10"],
    "/ibe/fare/quote": ["--rate", "3", "--algorithm", "sliding_window", "--per-caller"],
    "/ibe/order/cancel": ["--rate", "0"],
}


@pytest.fixture
def settings(
    migrated_db: tuple[str, Engine],
    redis_server: RedisServer,
    key_prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> Path:
    """Settings on a table whose rows make long state cells, and a terminal 80 wide."""
    for key in list(os.environ):
        if key.startswith("GATEWAY_LIMITER_"):
            monkeypatch.delenv(key)
    db, _ = migrated_db
    path = tmp_path / "settings.toml"
    path.write_text(
        f'database_url = "{db}"\nredis_url = "{redis_server.url}"\nkey_prefix = "{key_prefix}"\n'
    )
    for url, argv in ROWS.items():
        ran = cli(capsys, "--settings", str(path), "conf", "set", url, *argv, "--enable")
        assert ran.code == 0, ran.err
    # rich takes the terminal's size from COLUMNS/LINES, and FORCE_COLOR makes it
    # draw as on a terminal (Live, tables) although pytest captures the output.
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    monkeypatch.setenv("LINES", "24")
    monkeypatch.setenv("FORCE_COLOR", "1")
    return path


def screen_lines(raw: str) -> list[str]:
    """What the terminal shows, line by line (escape sequences removed)."""
    return [CSI.sub("", line).rstrip() for line in raw.replace("\r", "\n").split("\n")]


def whole(shown: str) -> str:
    """The URL a first cell shows, whole or cut with an ellipsis."""
    [url] = [u for u in ROWS if u == shown or (shown.endswith("…") and u.startswith(shown[:-1]))]
    return url


def test_every_line_fits_80_columns_and_each_row_is_one_line(
    capsys: pytest.CaptureFixture[str], settings: Path
) -> None:
    ran = cli(capsys, "--settings", str(settings), "status", "--watch", "--count", "1")
    assert ran.code == 0, ran.err
    assert "\x1b[" in ran.out  # drawn as on a terminal, not piped text
    lines = screen_lines(ran.out)
    too_wide = [line for line in lines if len(line) > WIDTH]
    assert too_wide == []
    headers = [line for line in lines if line.lstrip().startswith(("interfaceUrl", "URL"))]
    assert headers, ran.out
    header = headers[-1]
    for wanted in ("stored", "debt", "state"):  # what a watch is for stays
        assert wanted in header, header
    # The body: after the rule under the header, one line per limit, each starting
    # with its URL; a cell broken over lines would start a line with spaces.
    start = lines.index(header) + 2
    body = [line for line in lines[start:] if line.strip()]
    body = body[: len(ROWS)]
    shown = [line.split()[0] for line in body]
    assert [whole(url) for url in shown] == sorted(ROWS), "\n".join(lines)
    for line in body:
        state = line.split("  ")[-1].strip()
        # the state is whole, or visibly cut with an ellipsis: never ends mid-word
        assert state.endswith("…") or re.search(r"[a-z)]$", state), line


def test_a_wide_terminal_keeps_every_column(
    capsys: pytest.CaptureFixture[str], settings: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    ran = cli(capsys, "--settings", str(settings), "status", "--watch", "--count", "1")
    assert ran.code == 0, ran.err
    text = "\n".join(screen_lines(ran.out))
    for header in ("configId", "cache s", "capacity", "stored permits", "next free ms"):
        assert header in text
    assert "…" not in text
