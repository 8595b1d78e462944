"""Where results go: rich tables on a terminal, plain aligned text when piped.

rich is imported only when something needs it (a table, a terminal check, a live
display): a command that prints plain lines, such as ``switch status``, never loads it.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console, Group
    from rich.table import Table


@dataclass(frozen=True, slots=True)
class Column:
    """A column of a table: its header, and whether it holds numbers (right-aligned)."""

    header: str
    numeric: bool = False


#: What a command reports, in order: lines, and tables (columns, rows).
Report = list[str | tuple[Sequence[Column], Sequence[Sequence[str]]]]

# What rich's Console.out changes in a line (it drops these controls and expands tabs);
# a line without them is written as is, the same bytes, without loading rich.
_RICH_REWRITES = re.compile(r"[\x07\x08\x0b\x0c\x0d\t]")


def plain_table(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows as aligned text lines, header first (for output that is not a terminal)."""
    widths = [max([len(c.header), *(len(row[i]) for row in rows)]) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.rjust(w) if c.numeric else cell.ljust(w)
            for cell, w, c in zip(cells, widths, columns, strict=True)
        ).rstrip()

    return [line([c.header for c in columns]), *(line(row) for row in rows)]


def rich_table(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> Table:
    """A table for a terminal."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    # Narrow padding so a usual table fits without wrapping; on a narrow terminal
    # cells fold rather than lose characters.
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True)
    for c in columns:
        table.add_column(c.header, justify="right" if c.numeric else "left", overflow="fold")
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
        """A table: boxed on a terminal, aligned columns otherwise."""
        if not self.is_terminal:
            for text in plain_table(columns, rows):
                self.line(text)
            return
        self.console.print(rich_table(columns, rows))

    def show(self, report: Report) -> None:
        """Print a report's lines and tables in order."""
        for item in report:
            if isinstance(item, str):
                self.line(item)
            else:
                self.table(*item)

    def renderable(self, report: Report) -> Group:
        """A report as one rich renderable (for ``Live``, which redraws it in place)."""
        from rich.console import Group
        from rich.text import Text

        return Group(
            *(Text(item) if isinstance(item, str) else rich_table(*item) for item in report)
        )
