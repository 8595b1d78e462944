#!/usr/bin/env python3
"""Write the threaded limiter shell from the asyncio one.

The two shells carry out the same engine steps (``gateway_limiter/core``); only how they
wait differs. So the shell is written once, as asyncio, and this script writes each
threaded module of ``TWINS`` from its asyncio module, in the manner of httpcore's
``scripts/unasync.py``: ``gateway_limiter/limiter.py`` (the public API,
``GatewayLimiter``) from ``gateway_limiter/aio.py``, and ``gateway_limiter/shell.py``
(the I/O half below it, ``Shell``) from ``gateway_limiter/shell_async.py``:

1. take the asyncio module from the end of its docstring to the line that begins
   ``# --- asyncio only`` (what follows, in ``aio.py`` the process-wide asyncio limiter,
   is left out; a module without that line is taken to its end), less any lines from
   ``# --- begin asyncio only`` to ``# --- end asyncio only`` (members only the asyncio
   limiter has), and with a line ``# --- threaded only: <code>`` made ``<code>``;
2. rewrite each line with ``SUBSTITUTIONS`` below, in order: ``async`` and
   ``await`` dropped, ``AsyncX`` -> ``X``, ``x_async`` -> ``x`` (the twins in
   ``gateway_limiter/concurrency.py``, ``core/failure.py``, ``core/slots.py``,
   ``config/reload.py``), and the few names that differ otherwise;
3. put ``HEADER`` and the twin's docstring on top, sort the imports and format the whole with
   ruff (the version pinned in pyproject.toml), so the file passes ``ruff check`` and
   ``ruff format --check``.

Usage::

    python scripts/generate_sync.py          # write limiter.py and shell.py
    python scripts/generate_sync.py --check  # exit 1 if either is not what it writes

A name the asyncio shell starts using needs a twin under the renamed name (or a line
here); the generated module is type-checked and tested like any other.
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The line of an asyncio module from which on nothing is generated.
STOP = "# --- asyncio only"
#: Lines between these two (each alone on its line, indented as the code) are not
#: generated either: a member the threaded limiter does not have.
BEGIN_ASYNC_ONLY = "# --- begin asyncio only"
END_ASYNC_ONLY = "# --- end asyncio only"
#: A line ``# --- threaded only: <code>`` is ``<code>`` in the threaded module (an import
#: of a name the asyncio module defines itself below ``STOP``).
THREADED_ONLY = re.compile(r"^( *)# --- threaded only: (.*)$")

HEADER = """\
# This file is generated from gateway_limiter/{source}
# by scripts/generate_sync.py: do not edit it. Change {source}
# (and the twins it uses), then run `python scripts/generate_sync.py`; CI fails while
# this file is stale (`--check`). How: docs/design.md, "One shell, two ways to wait",
# and the script's docstring.
"""

LIMITER_DOCSTRING = '''\
"""``GatewayLimiter``: the facade every gateway process calls before an upstream call.

The decision path itself (routing, the failure policy and its circuit breaker, local
refusals, shadow rules, metrics) is ``gateway_limiter.core.pipeline.LimiterCore``,
shared with the asyncio limiter (``gateway_limiter.aio``). This class is the core's
threaded I/O shell: it calls the backend, sleeps with ``time.sleep``, and renews the
fleet membership and slot leases on daemon threads (``gateway_limiter.concurrency``).
``decide`` returns a decision as a ``Decision``; ``try_acquire`` is its ``allowed``.

This module is generated from ``gateway_limiter/aio.py`` by ``scripts/generate_sync.py``.
"""
'''

SHELL_DOCSTRING = '''\
"""``Shell``: the I/O half of the threaded limiter, below its public API.

It carries out the engine's steps (``core/steps.py``) over the backend, and runs the
background work on daemon threads (``gateway_limiter.concurrency``): the fleet's
heartbeats, the slot leases' renewals, the calendar quotas' keeper.
``gateway_limiter.limiter`` puts the public API on it.

This module is generated from ``gateway_limiter/shell_async.py`` by
``scripts/generate_sync.py``.
"""
'''

OPERATIONS_DOCSTRING = '''\
"""``Operations``: every backend operation written once, over a narrow threaded transport.

A threaded Redis transport (``RedisBackend``, ``SentinelBackend``,
``RedisClusterBackend``) implements only how to send: ``call``, ``batch``,
``subscribe``, ``close`` and ``prepare`` (``backends/base.py``'s ``Transport``). What
each operation sends and what its reply means is ``backends/calls.py`` (no I/O).

This module is generated from ``gateway_limiter/backends/operations_async.py`` by
``scripts/generate_sync.py``.
"""
'''


@dataclass(frozen=True)
class Twin:
    """A threaded module (``target``) written from an asyncio one (``source``)."""

    source: Path
    target: Path
    docstring: str


PACKAGE = ROOT / "gateway_limiter"
TWINS = [
    Twin(PACKAGE / "aio.py", PACKAGE / "limiter.py", LIMITER_DOCSTRING),
    Twin(PACKAGE / "shell_async.py", PACKAGE / "shell.py", SHELL_DOCSTRING),
    Twin(
        PACKAGE / "backends" / "operations_async.py",
        PACKAGE / "backends" / "operations.py",
        OPERATIONS_DOCSTRING,
    ),
]

#: (regular expression, replacement), applied in order to each line. Specific names
#: first, then the general rules.
SUBSTITUTIONS: list[tuple[str, str]] = [
    (r"\bcall await start\(\)", "call start()"),
    (r"\bopen_async_backend\b", "open_backend"),
    (r"\bASYNCIO\b", "THREADED"),
    (r"\basynccontextmanager\b", "contextmanager"),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\baclose\b", "close"),
    (r"\basync (def|with|for)\b", r"\1"),
    (r"\bawait ", ""),
    (r"\bAsync([A-Z]\w*)\b", r"\1"),
    (r"\b(\w+)_async\b", r"\1"),
]
_COMPILED = [(re.compile(pattern), repl) for pattern, repl in SUBSTITUTIONS]


def unasync_line(line: str) -> str:
    """``line`` of the asyncio shell as the threaded shell has it."""
    for pattern, repl in _COMPILED:
        line = pattern.sub(repl, line)
    return line


def shell_part(source: str, name: str = "aio.py") -> str:
    """What of an asyncio module (``name``) is generated: after its docstring, before
    ``STOP`` (if it has that line), less the lines from a ``BEGIN_ASYNC_ONLY`` line to an
    ``END_ASYNC_ONLY`` line (both included)."""
    docstring_end = source.index('"""', source.index('"""') + 3) + 3
    body = source[docstring_end:]
    stop = re.search(rf"^{re.escape(STOP)}", body, re.M)
    kept, skipping = [], False
    for line in body[: len(body) if stop is None else stop.start()].splitlines(True):
        marker = line.strip()
        if marker in {BEGIN_ASYNC_ONLY, END_ASYNC_ONLY}:
            if skipping == (marker == BEGIN_ASYNC_ONLY):
                raise SystemExit(f"{name}: {marker!r} out of turn")
            skipping = marker == BEGIN_ASYNC_ONLY
        elif not skipping:
            kept.append(THREADED_ONLY.sub(r"\1\2", line))
    if skipping:
        raise SystemExit(f"{name}: {BEGIN_ASYNC_ONLY!r} without {END_ASYNC_ONLY!r}")
    return "".join(kept)


def ruff(text: str, target: Path, *command: str) -> str:
    """``text`` as ``ruff <command>`` (pyproject.toml's settings) leaves it."""
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "--stdin-filename", str(target), "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"ruff {command[0]} failed on the generated text:\n{done.stderr}")
    return done.stdout


def ruff_format(text: str, target: Path) -> str:
    """``text`` with its imports sorted (the names renamed sort otherwise) and formatted."""
    sorted_imports = ruff(text, target, "check", "--select", "I", "--fix", "--quiet")
    return ruff(sorted_imports, target, "format")


def generate(twin: Twin) -> str:
    """The text of ``twin.target``."""
    part = shell_part(twin.source.read_text(), twin.source.name)
    body = "".join(unasync_line(line) for line in part.splitlines(True))
    header = HEADER.format(source=twin.source.relative_to(PACKAGE).as_posix())
    return ruff_format(header + twin.docstring + body.rstrip() + "\n", twin.target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if a threaded module is stale; write nothing"
    )
    args = parser.parse_args(argv)
    stale = 0
    for twin in TWINS:
        wanted = generate(twin)
        current = twin.target.read_text() if twin.target.exists() else ""
        target = twin.target.relative_to(ROOT)
        if current == wanted:
            continue
        if args.check:
            diff = difflib.unified_diff(
                current.splitlines(True),
                wanted.splitlines(True),
                f"{target} (as it is)",
                f"{target} (generated from {twin.source.name})",
            )
            sys.stderr.writelines(diff)
            sys.stderr.write(f"\n{target} is stale: run `python scripts/generate_sync.py`\n")
            stale = 1
        else:
            twin.target.write_text(wanted)
            print(f"wrote {target}")
    return stale


if __name__ == "__main__":
    sys.exit(main())
