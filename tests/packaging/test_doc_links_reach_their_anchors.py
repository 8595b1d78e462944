"""Every link between the docs reaches something: a file that exists, and a heading (or an
explicit ``<a id>``) for its ``#anchor``, slugged as GitHub slugs headings.

A heading renamed without its links leaves readers at the top of a long page; nothing
else would notice.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [*(CHECKOUT / "docs").glob("*.md"), CHECKOUT / "README.md", CHECKOUT / "CHANGELOG.md"]
)

#: ``[text](target)`` where the target is relative (no scheme), with or without ``#anchor``.
LINK = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:)([^)\s]*)\)", re.IGNORECASE)
HEADING = re.compile(r"#{1,6}\s+(.*?)\s*#*\s*$")
EXPLICIT = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation (backticks, dots, parentheses,
    slashes) dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    """The anchors a page offers: its headings' slugs (a repeated one numbered ``-1``,
    ``-2`` as GitHub does) and its explicit ``<a id>``; headings inside code fences are
    not headings."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if fenced:
            continue
        heading = HEADING.match(line)
        if heading:
            name = slug(heading.group(1))
            count = seen.get(name, 0)
            seen[name] = count + 1
            found.add(name if count == 0 else f"{name}-{count}")
        found.update(EXPLICIT.findall(line))
    return frozenset(found)


def links(page: Path) -> list[tuple[int, str]]:
    """(line, target) of every relative link on the page, code fences and spans left out."""
    text = page.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.DOTALL)
    text = re.sub(r"`[^`\n]*`", "``", text)
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in LINK.finditer(text)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(CHECKOUT)))
def test_every_relative_link_reaches_its_file_and_anchor(page: Path) -> None:
    broken = []
    for line, target in links(page):
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            broken.append(f"{page.name}:{line}: {target} (no such file)")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            broken.append(f"{page.name}:{line}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_slugs_are_githubs() -> None:
    """The cases the docs' headings use: code spans, parentheses, dots, slashes, a colon."""
    assert slug("Rate leases (`leaseMs`)") == "rate-leases-leasems"
    assert (
        slug("`bench/server_time.py`: Redis server time") == "benchserver_timepy-redis-server-time"
    )
    assert (
        slug("When to move from one Redis to a cluster")
        == "when-to-move-from-one-redis-to-a-cluster"
    )
