"""The getting-started page's ``gateway_limiter.admin`` example runs as written, and does what its
comments say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway_limiter.config.table import find_rows, make_engine, read_switch

PAGE = Path(__file__).resolve().parents[2] / "docs" / "getting-started.md"


def admin_block() -> str:
    """The python block of the page's ``gateway_limiter.admin`` section."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("\n## From Python: `gateway_limiter.admin`\n", 1)[1].split("\n## ")[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) == 1, "the admin section should hold exactly one python block"
    return str(blocks[0])


def test_the_admin_block_runs_as_written(
    tmp_path: Path, no_local_settings: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # its sqlite:///limits.db is relative
    exec(compile(admin_block(), str(PAGE), "exec"), {})

    engine = make_engine(f"sqlite:///{tmp_path / 'limits.db'}")
    search = {(r.period_seconds, r.per_caller): r for r in find_rows(engine, "/ibe/flight/search")}
    (booking,) = find_rows(engine, "/ibe/booking")
    switch = read_switch(engine)
    engine.dispose()
    assert search[(1, 0)].rate_limit == 20 and search[(1, 0)].cache == pytest.approx(0.2)
    assert search[(60, 0)].rate_limit == 600
    assert (booking.rate_limit, booking.per_caller, booking.status) == (2, 1, 1)
    assert switch is None
