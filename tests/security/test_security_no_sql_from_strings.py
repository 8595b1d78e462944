"""No SQL is built from strings: every value reaches the database as a bound parameter.

Checked in the source (no ``text()``/``exec_driver_sql``/``execute`` of a string made at
run time) and at run time: with URLs full of SQL quotes and comments, every statement
the package sends is recorded, and the hostile text is only ever a parameter.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, inspect, select

from gateway_limiter import GatewayLimiter
from gateway_limiter.cli import main
from gateway_limiter.config.table import CONF_TABLE, RateLimitConf

ROOT = Path(__file__).parents[2]
SOURCES = sorted(
    [*ROOT.joinpath("gateway_limiter").rglob("*.py"), *ROOT.joinpath("migrations").rglob("*.py")]
)
#: Calls that take SQL text.
SQL_CALLS = {"text", "exec_driver_sql"}
#: Where SQL text is not a literal, and why that is safe.
ALLOWED = {
    # The demo runs an operator's UPDATEs; their text is made of module constants only
    # (checked below) so that it can also be shown on screen.
    ("gateway_limiter/cli/demo.py", "change.sql"),
}


def calls(tree: ast.AST) -> Iterator[ast.Call]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node


def name_of(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def made_at_run_time(node: ast.expr) -> bool:
    """An f-string, a concatenation or %-format, or a .format()/.join() call."""
    if isinstance(node, (ast.JoinedStr, ast.BinOp)):
        return True
    return isinstance(node, ast.Call) and name_of(node) in ("format", "join")


def test_the_sources_hold_no_sql_made_from_strings() -> None:
    assert len(SOURCES) > 10
    problems = []
    for path in SOURCES:
        rel = path.relative_to(ROOT).as_posix()
        for call in calls(ast.parse(path.read_text(encoding="utf-8"))):
            name = name_of(call)
            if name not in (*SQL_CALLS, "execute") or not call.args:
                continue
            arg = call.args[0]
            where = f"{rel}:{call.lineno} {ast.unparse(call)[:80]}"
            literal = isinstance(arg, ast.Constant) and isinstance(arg.value, str)
            if made_at_run_time(arg):
                problems.append(f"SQL made at run time: {where}")
            elif name in SQL_CALLS and not literal and (rel, ast.unparse(arg)) not in ALLOWED:
                problems.append(f"SQL text that is not a literal: {where}")
    assert problems == []


def test_the_demo_sql_is_made_of_module_constants_only() -> None:
    tree = ast.parse(ROOT.joinpath("gateway_limiter/cli/demo.py").read_text(encoding="utf-8"))
    # Upper-case names assigned or imported at module level (CONF_TABLE from table.py).
    assigned = {
        t.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    imported = {
        a.asname or a.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for a in node.names
    }
    constants = {n for n in assigned | imported if n.isupper()}
    changes = [c for c in calls(tree) if name_of(c) == "Change"]
    assert len(changes) >= 3
    for change in changes:
        sql = change.args[1]
        used = {n.id for n in ast.walk(sql) if isinstance(n, ast.Name)}
        assert used <= constants, ast.unparse(sql)


# --- at run time -------------------------------------------------------------------------

HOSTILE = [
    "/x'; DROP TABLE t_ratelimite_conf; --",
    '/x" OR "1"="1',
    "/x' OR '1'='1",
    "/x\\'; DELETE FROM t_ratelimite_conf WHERE '1'='1",
    "/{x}%s%(x)s:x",
    "/é中🙂`x`",
]


@pytest.fixture
def statements() -> Iterator[list[tuple[str, Any]]]:
    """Every statement any engine sends while the test runs, with its parameters."""
    seen: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        seen.append((statement, parameters))

    event.listen(Engine, "before_cursor_execute", record)
    yield seen
    event.remove(Engine, "before_cursor_execute", record)


def test_urls_full_of_sql_are_only_ever_parameters(
    migrated_any_db: tuple[str, Engine],
    statements: list[tuple[str, Any]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)  # no settings.toml of the checkout
    db_url, engine = migrated_any_db
    for i, url in enumerate(HOSTILE):
        for argv in (
            ["conf", "set", url, "--rate", str(i + 1), "--cache", "0.1", "--channel", url[:24]],
            ["conf", "enable", url],
            ["conf", "disable", url],
            ["conf", "enable", url],
            ["status", url],
        ):
            assert main(["--database-url", db_url, *argv]) == 0, capsys.readouterr().err
    assert main(["--database-url", db_url, "conf", "list"]) == 0
    with GatewayLimiter(database_url=db_url, redis_url="memory://", reload_interval=3600) as lim:
        assert sorted(lim.registry.snapshot.rules) == sorted(HOSTILE)
        for url in HOSTILE:
            assert lim.try_acquire(url, timeout=0)

    assert len(statements) > 50
    for statement, _ in statements:
        for url in HOSTILE:
            for piece in ("DROP TABLE", "OR '1'", 'OR "1"', "DELETE FROM", url, url[1:]):
                assert piece not in statement, statement
    sent = repr([p for _, p in statements])
    assert all(repr(url)[1:-1] in sent for url in HOSTILE)  # they went as parameters
    # The table is whole, and holds each URL exactly as typed.
    assert CONF_TABLE in inspect(engine).get_table_names()
    t = RateLimitConf.__table__
    with engine.connect() as conn:
        stored = conn.execute(select(t.c.interfaceUrl, t.c.rateLimit).order_by(t.c.configId))
        assert [tuple(r) for r in stored] == [(url, i + 1) for i, url in enumerate(HOSTILE)]
