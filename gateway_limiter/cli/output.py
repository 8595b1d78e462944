"""Where results go: rich tables on a terminal, plain aligned text when piped.

rich is imported only when something needs it (a table, a terminal check, a live
display): a command that prints plain lines, such as ``switch status``, never loads it.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console, Group
    from rich.table import Table


@dataclass(frozen=True, slots=True)
class Column:
    """A column of a table: its header, whether it holds numbers (right-aligned), and
    how it gives way on a narrow terminal (``status --watch``).

    ``short`` is a shorter header, taken when the table is too wide; ``drop`` orders
    the columns left out when it is still too wide (1 first; 0: never left out);
    ``cut`` is how narrow the column may be cut, its text ending in an ellipsis
    (0: never cut).
    """

    header: str
    numeric: bool = False
    short: str = ""
    drop: int = 0
    cut: int = 0


#: What a command reports, in order: lines, and tables (columns, rows).
Report = list[str | tuple[Sequence[Column], Sequence[Sequence[str]]]]

# What rich's Console.out changes in a line (it drops these controls and expands tabs);
# a line without them is written as is, the same bytes, without loading rich.
_RICH_REWRITES = re.compile(r"[\x07\x08\x0b\x0c\x0d\t]")


def plain_table(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], *, width: int | None = None
) -> list[str]:
    """Rows as aligned text lines, header first (for output that is not a terminal).

    With ``width``, the table fits it as ``rich_table`` fits a terminal (short headers,
    the columns that matter least left out), except that a cell too wide for its column
    folds onto more lines rather than being cut: nothing of what is shown is lost.
    """
    if width is not None:
        keep, headers, fitted = _fit(columns, rows, width, fold=True)
        columns = [replace(columns[i], header=headers[i]) for i in keep]
        rows = [[row[i] for i in keep] for row in rows]
        widths = [fitted[i] for i in keep]
    else:
        widths = [
            max([len(c.header), *(len(row[i]) for row in rows)]) for i, c in enumerate(columns)
        ]

    def lines(cells: Sequence[str]) -> list[str]:
        parts = [_fold(cell, w) for cell, w in zip(cells, widths, strict=True)]
        return [
            "  ".join(
                (part[n] if n < len(part) else "").rjust(w)
                if c.numeric
                else (part[n] if n < len(part) else "").ljust(w)
                for part, w, c in zip(parts, widths, columns, strict=True)
            ).rstrip()
            for n in range(max(len(part) for part in parts))
        ]

    out = lines([c.header for c in columns])
    for row in rows:
        out.extend(lines(row))
    return out


def _fold(cell: str, width: int) -> list[str]:
    """``cell`` in lines of at most ``width``: at spaces where it can, else mid-word."""
    if len(cell) <= width:
        return [cell]
    return textwrap.wrap(cell, width, break_on_hyphens=False) or [""]


def left_out(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> list[str]:
    """The headers of the columns a table fitted to ``width`` leaves out."""
    keep, _, _ = _fit(columns, rows, width, fold=True)
    return [c.header for i, c in enumerate(columns) if i not in keep]


def env_width() -> int | None:
    """``$COLUMNS`` when it is a width (what output that is not a terminal fits), else
    None: every column, as wide as it takes."""
    value = os.environ.get("COLUMNS", "")
    return int(value) if value.isdigit() and int(value) >= 40 else None


def rich_table(
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    *,
    width: int | None = None,
    fold: bool = False,
) -> Table:
    """A table for a terminal.

    Without ``width``, a cell too wide for the terminal folds onto more lines. With
    ``width``, the table fits it: it takes the short headers, then leaves out the
    columns that matter least, one by one, then narrows the columns that may be cut,
    rightmost first. Their text ends in an ellipsis (``status --watch``: a cell broken
    mid-word is unreadable in a table redrawn every second), or with ``fold`` goes on
    over more lines (``conf list``, one-shot ``status``: nothing shown is lost).
    """
    if width is None:
        return _table([(c.header, c.numeric, None) for c in columns], rows)
    keep, headers, widths = _fit(columns, rows, width, fold)
    return _table(
        [(headers[i], columns[i].numeric, widths[i]) for i in keep],
        [[row[i] for i in keep] for row in rows],
        fold=fold,
    )


#: Characters between two columns (a space of padding and the box's divider).
_GAP = 2


def _fit(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int, fold: bool = False
) -> tuple[list[int], list[str], dict[int, int]]:
    """The columns kept (indexes), every column's header, and the kept columns' widths
    for a table at most ``width`` wide (if it can be: at worst rich squeezes it).

    With ``fold`` (cells that fold onto more lines), a column that may be cut counts at
    its narrowest when deciding what to leave out, and gets back what room is left
    after, leftmost first: the URL and the effect fold rather than push other columns
    out.
    """
    from rich.cells import cell_len

    headers = [c.header for c in columns]
    keep = list(range(len(columns)))
    drops = sorted({c.drop for c in columns if c.drop})
    natural: dict[int, int] = {}
    for step in ("full", "short", *drops):
        if step == "short":
            headers = [c.short or c.header for c in columns]
        elif isinstance(step, int):
            keep = [i for i in keep if columns[i].drop != step]
        natural = {
            i: max([cell_len(headers[i]), *(cell_len(row[i]) for row in rows)]) for i in keep
        }
        least = {
            i: max(cell_len(headers[i]), min(w, columns[i].cut)) if fold and columns[i].cut else w
            for i, w in natural.items()
        }
        if sum(least.values()) + _GAP * (len(keep) - 1) <= width:
            break
    if fold:
        widths = dict(least)
        spare = width - sum(widths.values()) - _GAP * (len(keep) - 1)
        for i in [i for i in keep if columns[i].cut]:  # the leftmost (the URL) gets first
            give = max(0, min(spare, natural[i] - widths[i]))
            widths[i] += give
            spare -= give
        return keep, headers, widths
    widths = dict(natural)
    excess = sum(widths.values()) + _GAP * (len(keep) - 1) - width
    for i in reversed([i for i in keep if columns[i].cut]):  # the rightmost is cut first
        if excess <= 0:
            break
        give = min(excess, max(0, natural[i] - columns[i].cut))
        widths[i] -= give
        excess -= give
    return keep, headers, widths


def _table(
    columns: Sequence[tuple[str, bool, int | None]],
    rows: Sequence[Sequence[str]],
    *,
    fold: bool = False,
) -> Table:
    """A rich table of (header, numeric, width) columns; with widths, cells are cut
    with an ellipsis, never broken over lines (unless ``fold``); without, they fold."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    # Narrow padding so a usual table fits without wrapping.
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True)
    for header, numeric, width in columns:
        fitted = width is not None and not fold
        table.add_column(
            header,
            justify="right" if numeric else "left",
            width=width,
            no_wrap=fitted,
            overflow="ellipsis" if fitted else "fold",
        )
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    return table


class Output:
    """Where results go: rich tables on a terminal, plain aligned text otherwise."""

    def __init__(self, console: Console | None = None) -> None:
        self._console = console

    @property
    def console(self) -> Console:
        """The rich console, made on first use."""
        if self._console is None:
            from rich.console import Console

            # soft_wrap: piped output is never cut at 80 columns; highlight off: no
            # colours guessed from the text.
            self._console = Console(highlight=False, soft_wrap=True)
        return self._console

    @property
    def is_terminal(self) -> bool:
        """True when stdout is a terminal (rich styles and tables)."""
        return self.console.is_terminal

    def line(self, text: str = "") -> None:
        """One line, printed as is (no markup: URLs may hold brackets)."""
        if self._console is None and not _RICH_REWRITES.search(text):
            print(text, file=sys.stdout)
            return
        self.console.out(text, highlight=False)

    def table(self, columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> None:
        """A table: boxed on a terminal, aligned columns otherwise; fitted to the
        terminal's width (not a terminal: ``$COLUMNS``, if set), with a line naming the
        columns left out to fit."""
        width = self.console.width if self.is_terminal else env_width()
        if not self.is_terminal:
            for text in plain_table(columns, rows, width=width):
                self.line(text)
        else:
            self.console.print(rich_table(columns, rows, width=width, fold=True))
        dropped = [] if width is None else left_out(columns, rows, width)
        if width is not None and dropped:
            note = f"left out to fit {width} columns: {', '.join(dropped)} (--json: all)"
            for text in textwrap.wrap(note, width, break_on_hyphens=False):
                self.line(text)

    def show(self, report: Report) -> None:
        """Print a report's lines and tables in order."""
        for item in report:
            if isinstance(item, str):
                self.line(item)
            else:
                self.table(*item)

    def renderable(self, report: Report) -> Group:
        """A report as one rich renderable fitted to the terminal (for ``Live``, which
        redraws it in place)."""
        from rich.console import Group
        from rich.text import Text

        width = self.console.width
        return Group(
            *(
                Text(item) if isinstance(item, str) else rich_table(*item, width=width)
                for item in report
            )
        )
