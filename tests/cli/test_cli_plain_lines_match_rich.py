"""A command that prints only lines (``switch status``) skips loading rich: ``Output.line``
writes the text itself. What it writes must be what rich's ``Console.out`` writes, byte
for byte, for any text, on a pipe or on a terminal."""

from __future__ import annotations

import io
from contextlib import redirect_stdout

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from gateway_limiter.cli.output import Output

TRICKY = [
    "",
    "[bold]not markup[/bold] :smile: http://x/[a]",
    "/ibe/é中🙂`x`",
    "a\x00b\x1b[31mred\x7f\x85\u2028\u200b",
    "tab\there\rand\x07bell\x08\x0b\x0c",
    "w" * 500,
]


def through_rich(text: str, *, terminal: bool) -> str:
    out = io.StringIO()
    Console(file=out, highlight=False, soft_wrap=True, force_terminal=terminal).out(
        text, highlight=False
    )
    return out.getvalue()


def through_output(text: str) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        Output().line(text)
    return out.getvalue()


@pytest.mark.parametrize("text", TRICKY)
def test_tricky_lines_are_written_as_rich_writes_them(text: str) -> None:
    written = through_output(text)
    assert written == through_rich(text, terminal=False)
    assert written == through_rich(text, terminal=True)


@settings(max_examples=300, deadline=None)
@given(text=st.text())
def test_any_line_is_written_as_rich_writes_it(text: str) -> None:
    assert through_output(text) == through_rich(text, terminal=False)
