"""No test waits by sleeping for something a clock or an event could tell it (issue 31).

Every ``time.sleep`` / ``asyncio.sleep`` call under tests/ is a poll (inside a ``while``
loop of its own function, which waits for a condition with a deadline, as
``tests.support.waiting.wait_for`` does), a turn of the loop (``sleep(0)``), or carries
a comment ``# real time: <why>`` on its line or the line above: real traffic paced
against real Redis or real processes, whose promise is about real time. Anything else
is a fixed sleep standing in for a state the test could poll for, an event the code
sets, or a clock the test could drive (``clock=`` on the limiter; ``memory://`` and the
in-process fallback read it). tests/support/sim.py is the simulated fleet's clock and
is left out.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
EXEMPT = {TESTS / "support" / "sim.py"}
SLEEP_MODULES = {"time", "asyncio"}
REASON = re.compile(r"#\s*real time:\s*\S")


def _sleep_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """The names this module calls the two modules by, and the names ``sleep`` itself
    was imported as (``from time import sleep``)."""
    modules, functions = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in SLEEP_MODULES:
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module in SLEEP_MODULES:
            for alias in node.names:
                if alias.name == "sleep":
                    functions.add(alias.asname or alias.name)
    return modules, functions


def _is_sleep(call: ast.Call, modules: set[str], functions: set[str]) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr == "sleep":
        return isinstance(func.value, ast.Name) and func.value.id in modules
    return isinstance(func, ast.Name) and func.id in functions


def _no_time(call: ast.Call) -> bool:
    """``sleep(0)``: a turn of the event loop (or the GIL), no wait at all."""
    args = call.args or [k.value for k in call.keywords]
    return len(args) == 1 and isinstance(args[0], ast.Constant) and args[0].value == 0


def _in_a_poll(stack: list[ast.AST]) -> bool:
    """A ``while`` loop between the call and the function (or module) it runs in."""
    for node in reversed(stack):
        if isinstance(node, ast.While):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
    return False


def bare_sleeps(path: Path, source: str) -> list[str]:
    """``path:line`` of every sleep call in ``source`` that is neither a poll nor said
    to be about real time."""
    tree = ast.parse(source, filename=str(path))
    modules, functions = _sleep_names(tree)
    if not modules and not functions:
        return []
    lines = source.splitlines()
    found: list[str] = []

    def reasoned(call: ast.Call) -> bool:
        end = call.end_lineno or call.lineno
        candidates = range(max(call.lineno - 2, 0), end)  # the line above, through the call's
        return any(REASON.search(lines[i]) for i in candidates)

    def visit(node: ast.AST, stack: list[ast.AST]) -> None:
        if (
            isinstance(node, ast.Call)
            and _is_sleep(node, modules, functions)
            and not _no_time(node)
            and not _in_a_poll(stack)
            and not reasoned(node)
        ):
            found.append(f"{path.relative_to(TESTS.parent)}:{node.lineno}")
        stack.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child, stack)
        stack.pop()

    visit(tree, [])
    return found


def test_every_sleep_in_the_tests_is_a_poll_or_says_why_it_is_real_time() -> None:
    found = [
        where
        for path in sorted(TESTS.rglob("*.py"))
        if path not in EXEMPT
        for where in bare_sleeps(path, path.read_text())
    ]
    assert not found, (
        "sleeps that wait for what a clock or an event could tell (poll with "
        "tests.support.waiting.wait_for, wait on the event, or drive clock=); if the test "
        "is about real time, say so on the line: # real time: <why>\n" + "\n".join(found)
    )


def test_the_scan_tells_a_bare_sleep_from_a_poll_and_from_real_time() -> None:
    here = TESTS / "example.py"
    source = (
        "import asyncio\n"
        "import time as clock\n"
        "from time import sleep as nap\n"
        "def bare():\n"
        "    clock.sleep(0.5)\n"  # 5
        "async def bare_async():\n"
        "    await asyncio.sleep(0.5)\n"  # 7
        "def imported():\n"
        "    nap(1)\n"  # 9
        "def poll(done):\n"
        "    while not done():\n"
        "        clock.sleep(0.01)\n"
        "def said():\n"
        "    clock.sleep(1)  # real time: the TTL is Redis' seconds\n"
        "    # real time: a breaker opens after a second of failures\n"
        "    clock.sleep(1)\n"
        "def empty_reason():\n"
        "    clock.sleep(1)  # real time:\n"  # 18
        "def defined_in_a_loop():\n"
        "    while True:\n"
        "        def inner():\n"
        "            clock.sleep(1)\n"  # 22: its own function has no loop
        "        return inner\n"
        "def other():\n"
        "    self.sleep(1)\n"  # a clock's own sleep, not time's
        "async def turn():\n"
        "    await asyncio.sleep(0)\n"  # a turn of the loop
        "    await asyncio.sleep(0.0)\n"
        "    await asyncio.sleep(delay=0.01)\n"  # 29
    )
    assert bare_sleeps(here, source) == [
        "tests/example.py:5",
        "tests/example.py:7",
        "tests/example.py:9",
        "tests/example.py:18",
        "tests/example.py:22",
        "tests/example.py:29",
    ]
