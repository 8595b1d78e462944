"""The console writes the priority columns as ``conf set`` does: a bad ``priority`` or
``reserve`` is 422 naming the field, and nothing is written."""

from __future__ import annotations

import pytest

from tests.cli.test_status_shows_classes import RESERVE, write_class_rows
from tests.console.conftest import Served
from tests.console.test_console_api import row_of
from tests.support.limiting import write_row

URL = "/ibe/flight/book"


def test_the_class_and_the_reserve_are_written(console: Served) -> None:
    config_id = write_row(console.engine, URL, rateLimit=10)
    with console.client() as http:
        done = http.patch(
            f"/api/rules/{config_id}",
            json={"priority": "critical", "reserve": "sheddable=0.5"},
        )
    assert done.status_code == 200, done.text
    row = row_of(console.engine, config_id)
    assert row is not None
    assert (row["priority"], row["reserve"]) == ("critical", "sheddable=0.5")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"priority": "urgent"}, "priority"),
        ({"priority": 1}, "priority"),
        ({"reserve": "default=1"}, "reserve"),
        ({"reserve": "default=0.4,sheddable=0.1"}, "reserve"),
        ({"reserve": "sheddable=0.5", "algorithm": "warm_up", "warmupPeriod": 2}, "reserve"),
    ],
)
def test_a_bad_value_names_its_field_and_writes_nothing(
    console: Served, body: dict[str, object], field: str
) -> None:
    config_id = write_row(console.engine, URL, rateLimit=10)
    before = row_of(console.engine, config_id)
    with console.client() as http:
        got = http.patch(f"/api/rules/{config_id}", json=body)
    assert got.status_code == 422, got.text
    assert got.json()["field"] == field
    assert field in got.json()["error"]
    assert row_of(console.engine, config_id) == before


def test_status_carries_each_limits_class_and_reserve(console: Served) -> None:
    write_class_rows(console.engine)
    with console.client() as http:
        buckets = http.get("/api/status").json()["buckets"]
    got = {(b["url"], b["channelType"]): (b["priority"], b["reserve"]) for b in buckets}
    assert got[("/cl/search", None)] == ("sheddable", None)
    assert got[("*", "CL")] == (None, RESERVE)
    assert got[("/cl/plain", None)] == (None, None)
