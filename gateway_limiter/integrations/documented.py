"""What the client integrations' docstrings say alike, written once.

A class docstring names a part of ``PARTS`` by a line of its own, ``{name}``, indented as
the docstring's sections (``Args:``, ``Raises:``); ``documented`` puts the part there,
each of its lines indented the same, when the module is imported. So ``help()`` shows
the whole text; the API reference, which reads docstrings from the source, completes
them the same way (``expand``, called by ``SharedDocstrings`` in docs_hooks.py).
"""

from __future__ import annotations

import re
from typing import Final, TypeVar

__all__ = ["PARTS", "documented", "expand"]

C = TypeVar("C", bound=type)

#: The parts, by name; each as it stands at a section's indentation.
PARTS: Final[dict[str, str]] = {
    # what a response's quota report does (after the docstring's first paragraph)
    "observes": """\
After a response that says what is left of the supplier's quota (``RateLimit``, or
``X-RateLimit-Remaining`` with ``X-RateLimit-Reset``), it calls ``limiter.observe``,
so the fleet's calendar quotas follow the supplier's own count.""",
    # the last arguments under ``Args:``, and what the request's call raises
    "options": """\
    interface: maps a request to its ``interfaceUrl``; default: the URL's path.
        A function that returns None leaves that request unlimited.
    priority: each request's class (see priority classes): one ``Priority``, a
        mapping of ``interfaceUrl`` to class, or a function of the request
        (None: the row's); default: the row's.

Raises:
    gateway_limiter.Refused: from the call that sends the request (``get``, ``post``
        and the like), when refused; the request never reaches the supplier.""",
}

_MARKER = re.compile(rf"^( *)\{{({'|'.join(PARTS)})\}}$", re.M)


def _part(marker: re.Match[str]) -> str:
    indent, name = marker.groups()
    return "\n".join(indent + line if line else "" for line in PARTS[name].splitlines())


def expand(docstring: str) -> str:
    """``docstring``, each ``{name}`` line of it replaced by ``PARTS[name]``."""
    return _MARKER.sub(_part, docstring)


def documented(cls: C) -> C:
    """``cls``, its docstring expanded (``expand``)."""
    if cls.__doc__ is not None:
        cls.__doc__ = expand(cls.__doc__)
    return cls
