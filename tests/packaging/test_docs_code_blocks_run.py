"""Every code block in the README and the documentation site that is a complete program
or command runs as written; every other block says it is a fragment.

A block is classified by the comment line right above its fence:

- ``<!-- fragment ... -->``: part of a program (it names a limiter, a server or a call of
  the reader's own). A Python fragment must still parse.
- ``<!-- run by tests/... -->``: run by that test, which must read this page.
- nothing: run here, with no servers. ``sql`` is executed on a freshly migrated SQLite
  database of the tables; ``bash`` is a list of ``gateway-limiter`` commands, run in
  order against such a database and ``memory://``, each of which must exit 0;
  ``python`` runs as a program with those settings; ``toml`` must parse.

Other languages (``text``, ``yaml``, ``promql``...) are not programs.
"""

from __future__ import annotations

import ast
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway_limiter.admin import upgrade
from gateway_limiter.cli import main as cli_main

CHECKOUT = Path(__file__).resolve().parents[2]
PAGES = sorted([CHECKOUT / "README.md", *(CHECKOUT / "docs").rglob("*.md")])

FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
MARKER = re.compile(r"^\s*<!--\s*(fragment|run by (\S+))\b.*-->\s*$")
SHELLS = {"bash", "sh", "shell", "console"}


@dataclass(frozen=True)
class Block:
    """A fenced code block of a page."""

    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    marker: str | None  # "fragment", "run by <path>", or None

    def __str__(self) -> str:
        return f"{self.page.relative_to(CHECKOUT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The page's fenced blocks, with the marker line above each."""
    found: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        indent, ticks, language = fence.groups()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(ticks):
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        previous = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        marked = MARKER.match(previous)
        marker = None if marked is None else marked.group(1)
        found.append(Block(page, i + 1, language.lower(), "\n".join(body) + "\n", marker))
        i = j + 1
    return found


ALL = [block for page in PAGES for block in blocks(page)]
RUN_HERE = {"python", "sql", *SHELLS, "toml"}


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file holding the tables at the newest revision (copied for each block)."""
    path = tmp_path_factory.mktemp("docs") / "template.db"
    upgrade(f"sqlite:///{path}")
    return path


def fresh_database(migrated: Path, tmp_path: Path) -> Path:
    path = tmp_path / "limits.db"
    shutil.copy(migrated, path)
    return path


def test_the_pages_hold_blocks_to_check() -> None:
    """The parsing finds the blocks: a page's worth, some of each kind."""
    kinds = {b.language for b in ALL if b.marker is None}
    assert {"python", "sql", "bash"} <= {b.language for b in ALL}
    assert {"sql", "bash"} <= kinds


@pytest.mark.parametrize("block", [b for b in ALL if b.marker is not None], ids=str)
def test_a_marked_block_is_a_fragment_that_parses_or_is_run_by_its_test(block: Block) -> None:
    assert block.marker is not None
    if block.marker.startswith("run by "):
        test = CHECKOUT / block.marker.removeprefix("run by ")
        assert test.is_file(), f"{block}: no such test {test}"
        assert block.page.name in test.read_text(encoding="utf-8"), (
            f"{block}: {test.name} does not read {block.page.name}"
        )
    elif block.language == "python":
        ast.parse(block.code, filename=str(block))


@pytest.mark.parametrize(
    "block", [b for b in ALL if b.marker is None and b.language in RUN_HERE], ids=str
)
def test_an_unmarked_block_runs_as_written(
    block: Block, migrated: Path, tmp_path: Path, no_local_settings: None
) -> None:
    if block.language == "toml":
        tomllib.loads(block.code)
    elif block.language == "sql":
        run_sql(block, fresh_database(migrated, tmp_path))
    elif block.language in SHELLS:
        run_commands(block, fresh_database(migrated, tmp_path))
    else:
        run_program(block, fresh_database(migrated, tmp_path), tmp_path)


def run_sql(block: Block, database: Path) -> None:
    with sqlite3.connect(database) as db:
        try:
            db.executescript(block.code)
        except sqlite3.Error as e:
            pytest.fail(f"{block}: {e}")


def run_commands(block: Block, database: Path) -> None:
    lines = block.code.replace("\\\n", " ").splitlines()  # a command continued with "\\"
    for number, line in enumerate(lines, start=block.line + 1):
        words = shlex.split(line, comments=True)
        if not words:
            continue
        assert words[0] == "gateway-limiter", (
            f"{block}, line {number}: not a gateway-limiter command; mark the block as a "
            "fragment if it is not one to run here"
        )
        argv = ["--database-url", f"sqlite:///{database}", "--redis-url", "memory://"]
        code = cli_main([*argv, *words[1:]])
        assert code == 0, f"{block}, line {number}: {line!r} exited {code}"


def run_program(block: Block, database: Path, tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "GATEWAY_LIMITER_DATABASE_URL": f"sqlite:///{database}",
        "GATEWAY_LIMITER_REDIS_URL": "memory://",
    }
    done = subprocess.run(
        [sys.executable, "-c", block.code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{block}: exited {done.returncode}\n{done.stderr}"
