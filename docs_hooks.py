"""MkDocs hooks (mkdocs.yml): reference pages whose text is made from the code at build
time, so that they cannot drift from it.

A page asks for a generated part with a marker line:

- ``<!-- generated: command line -->``: every command's ``--help``, from the parser
  ``gateway-limiter`` itself runs;
- ``<!-- generated: settings.toml -->``: the top-level settings.toml, which documents
  every key with its default (a test holds it to the built-in defaults).

And a griffe extension (mkdocs.yml, mkdocstrings' ``extensions``): ``SharedDocstrings``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import griffe

from gateway_limiter.cli import build_parser
from gateway_limiter.cli.context import PROG
from gateway_limiter.integrations.documented import expand

CHECKOUT = Path(__file__).resolve().parent
#: The width --help is laid out in on the page.
HELP_COLUMNS = "88"


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """The parsers of a parser's commands, in the order --help lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.values()


def _walk(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """The parser and every command under it, each with its own arguments added."""
    load = getattr(parser, "load", None)
    if load is not None:
        load()  # a command's module adds its arguments when the command is used
    yield parser
    for sub in _subcommands(parser):
        yield from _walk(sub)


def command_line() -> str:
    """Markdown: one section per command, its ``--help`` as the program prints it."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        parts = []
        for parser in _walk(build_parser()):
            name = parser.prog.replace(PROG, "", 1).strip()
            depth = "##" if " " not in name else "###"
            title = f"`{parser.prog}`" if name else f"`{PROG}` (global options)"
            parts.append(f"{depth} {title}\n\n```text\n{parser.format_help().rstrip()}\n```\n")
        return "\n".join(parts)
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


def settings_file() -> str:
    """Markdown: settings.toml, as shipped."""
    text = (CHECKOUT / "settings.toml").read_text(encoding="utf-8").rstrip()
    return f"```toml\n{text}\n```\n"


MARKERS: dict[str, Callable[[], str]] = {
    "<!-- generated: command line -->": command_line,
    "<!-- generated: settings.toml -->": settings_file,
}


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Replace each marker line with what it names."""
    for marker, make in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown


class SharedDocstrings(griffe.Extension):
    """The parts of docstrings written once (gateway_limiter/integrations/documented.py),
    put in place as the API reference reads the source, as ``documented`` puts them in
    place at import."""

    def on_class_instance(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        """Expand a class's docstring as it is read."""
        if cls.docstring is not None:
            cls.docstring.value = expand(cls.docstring.value)
