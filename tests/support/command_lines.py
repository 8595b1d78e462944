"""Run scripts' command lines that end before any measurement (``--help``, a refused
argument, an unreachable ``--redis-url``) one after another in this one process, as
``python <script> <args>`` would, and print what each did as JSON.

    python -m tests.support.command_lines '[["bench/priority.py", ["--help"]], ...]'

One interpreter pays for the imports once, where a process per command line would pay
for them some sixty times (tests/bench/test_benchmarks_still_run.py). Each script runs
as ``__main__`` with ``sys.argv`` set as its own process would have it, so the program
name in its messages is the script's.
"""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import sys
import time
import traceback
from pathlib import Path
from typing import Any


def run(script: str, args: list[str]) -> dict[str, Any]:
    """One command line: its exit code, what it wrote to each stream, its time (s)."""
    out, err = io.StringIO(), io.StringIO()
    argv, path = sys.argv, list(sys.path)
    sys.argv = [script, *args]
    started = time.monotonic()
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_path(script, run_name="__main__")
            except SystemExit as exited:
                if exited.code is None:
                    code = 0
                elif isinstance(exited.code, int):
                    code = exited.code
                else:  # sys.exit("message"): printed, and 1, as the interpreter does
                    print(exited.code, file=sys.stderr)
                    code = 1
            except BaseException:  # what the interpreter would print, and exit 1
                traceback.print_exc()
                code = 1
    finally:
        sys.argv, sys.path[:] = argv, path
    return {
        "returncode": code,
        "stdout": out.getvalue(),
        "stderr": err.getvalue(),
        "took_s": time.monotonic() - started,
    }


def main() -> int:
    """Each command line of the JSON list in ``sys.argv[1]``, in turn."""
    lines: list[tuple[str, list[str]]] = json.loads(sys.argv[1])
    print(json.dumps([run(str(Path(script)), list(args)) for script, args in lines]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
