"""The site's references name every column of the limits table and every setting, as
the code defines them: a new column or setting without its line fails here."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from gateway_limiter.config.settings import Settings
from gateway_limiter.config.table import RateLimitConf

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference"


def test_every_column_of_the_limits_table_has_a_row_in_the_table_reference() -> None:
    page = (REFERENCE / "table.md").read_text(encoding="utf-8")
    columns = [column.name for column in RateLimitConf.__table__.columns]
    assert "rateLimit" in columns
    missing = [name for name in columns if f"| `{name}` |" not in page]
    assert not missing, f"docs/reference/table.md has no row for {missing}"


def test_every_setting_has_a_row_in_the_settings_reference() -> None:
    page = (REFERENCE / "settings.md").read_text(encoding="utf-8")
    missing = [f.name for f in dataclasses.fields(Settings) if f"| `{f.name}` |" not in page]
    assert not missing, f"docs/reference/settings.md has no row for {missing}"
