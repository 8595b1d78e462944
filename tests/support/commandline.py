"""Running the command line in-process, as the CLI tests do."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from gateway_limiter.cli import main


class Ran(NamedTuple):
    """What one command did: its exit code and what it printed."""

    code: int
    out: str
    err: str


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> Ran:
    """``gateway-limiter *argv`` through ``main``, with what it printed."""
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return Ran(code, out, err)
