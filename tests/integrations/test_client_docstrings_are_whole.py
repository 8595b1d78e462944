"""The client integrations' docstrings share parts written once
(gateway_limiter/integrations/documented.py): at import each class's docstring has them
in place, and the API reference, which reads the source, puts them in place the same way
(docs_hooks.py's griffe extension)."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest

from gateway_limiter.integrations.aiohttp import LimiterMiddleware
from gateway_limiter.integrations.documented import PARTS, expand
from gateway_limiter.integrations.httpx import AsyncLimiterTransport, LimiterTransport
from gateway_limiter.integrations.requests import LimiterAdapter

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = [LimiterTransport, AsyncLimiterTransport, LimiterAdapter, LimiterMiddleware]


@pytest.mark.parametrize("cls", CLIENTS, ids=lambda c: c.__name__)
def test_each_client_docstring_has_every_part_in_place(cls: type) -> None:
    doc = inspect.cleandoc(cls.__doc__ or "")
    assert "{" not in doc  # no marker left
    for part in PARTS.values():
        assert part in doc
    # the parts sit where the sections want them: the arguments under Args, then Raises
    args, raises = doc.index("\nArgs:\n"), doc.index("\nRaises:\n")
    assert args < doc.index("\n    interface: maps a request") < raises
    assert doc.index("\n    priority: each request's class") < raises
    assert "\n    gateway_limiter.Refused: from the call" in doc[raises:]


def test_a_line_that_only_looks_like_a_marker_stays() -> None:
    text = "Intro.\n\n    {unknown}\n  {observes} and more\n"
    assert expand(text) == text
    assert expand("A.\n\n  {observes}\n").endswith(
        "  so the fleet's calendar quotas follow the supplier's own count.\n"
    )


def test_the_api_reference_reads_the_same_docstrings() -> None:
    griffe = pytest.importorskip("griffe")  # the docs extra
    sys.path.insert(0, str(ROOT))
    try:
        from docs_hooks import SharedDocstrings
    finally:
        sys.path.remove(str(ROOT))
    package = griffe.load(
        "gateway_limiter.integrations",
        search_paths=[str(ROOT)],
        extensions=griffe.Extensions(SharedDocstrings()),
        allow_inspection=False,
    )
    for cls in CLIENTS:
        read = package[f"{cls.__module__.rsplit('.', 1)[1]}.{cls.__name__}"]
        assert read.docstring.value == inspect.cleandoc(cls.__doc__ or "")
