"""A parallel run starts the longest test files first (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from tests.conftest import LONGEST_FIRST, pytest_collection_modifyitems

ROOT = Path(__file__).resolve().parents[2]


def test_every_file_named_longest_first_exists() -> None:
    """A file renamed or removed would silently fall back to its usual place."""
    missing = [path for path in LONGEST_FIRST if not (ROOT / path).is_file()]
    assert missing == []
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)


class Collected:
    """What the hook reads of a collected test."""

    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid

    def __repr__(self) -> str:
        return self.nodeid


def test_the_longest_files_come_first_and_each_file_keeps_its_order() -> None:
    second, first = LONGEST_FIRST[1], LONGEST_FIRST[0]
    ids = [
        "tests/asyncio/test_a.py::test_one",
        f"{second}::test_b[1]",
        "tests/asyncio/test_a.py::test_two",
        f"{first}::test_z",
        f"{second}::test_a[0]",
        "tests/cli/test_c.py::test_c",
        f"{first}::test_y",
    ]
    items: list[Any] = [Collected(i) for i in ids]
    pytest_collection_modifyitems(cast(list[pytest.Item], items))
    assert [i.nodeid for i in items] == [
        f"{first}::test_z",
        f"{first}::test_y",
        f"{second}::test_b[1]",
        f"{second}::test_a[0]",
        "tests/asyncio/test_a.py::test_one",
        "tests/asyncio/test_a.py::test_two",
        "tests/cli/test_c.py::test_c",
    ]


def test_the_project_options_keep_the_collection_order() -> None:
    """Without ``--no-loadscope-reorder`` pytest-xdist hands out the files with the most
    tests first, whatever the collection order."""
    options = (ROOT / "pyproject.toml").read_text()
    assert "--no-loadscope-reorder" in options.split("addopts", 1)[1].splitlines()[0]
