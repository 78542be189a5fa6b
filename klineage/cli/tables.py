"""Tables for the `klineage` command that stay readable at 80 columns.

A column holding identifiers a reader types back (skill ids, mechanism names, kernel names) is
a *key*: it is never cut or wrapped. Other columns wrap. When the terminal is too narrow, the
optional columns go first; when even that does not fit, the rows become a plain list (without
the optional columns), one entry per row: its keys on the first line, its short columns on the
second, each long column on lines of its own, indented and wrapped.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console, JustifyMethod
from rich.table import Table
from rich.text import Text

# Each rich column costs its padding (2) and a border (1); the table one more border.
_PER_COLUMN = 3


@dataclass(frozen=True)
class Column:
    """One column of a table."""

    header: str
    """The header, and the label of the value in the list form."""
    key: bool = False
    """Holds identifiers: never cut, never wrapped."""
    optional: bool = False
    """Dropped first when the terminal is too narrow for every column."""
    min_width: int = 12
    """The narrowest a wrapping column may get before the table gives up on it."""
    short: bool = False
    """A short value (a ratio, a status): not wrapped; in the list form it shares the second
    line."""
    justify: JustifyMethod = "left"
    """rich's justify for the table form."""

    @classmethod
    def figure(cls, header: str, *, optional: bool = False) -> Column:
        """A short number, right-aligned (a latency, a ratio, a count)."""
        return cls(header, short=True, optional=optional, justify="right")


Cell = str | Text


def _length(cell: Cell) -> int:
    return cell.cell_len if isinstance(cell, Text) else len(cell)


def _needed(columns: Sequence[Column], rows: Sequence[Sequence[Cell]]) -> int:
    width = 1
    for index, column in enumerate(columns):
        longest = max([len(column.header), *(_length(row[index]) for row in rows)])
        whole = column.key or column.short
        width += _PER_COLUMN + (longest if whole else min(longest, column.min_width))
    return width


def print_rows(
    console: Console,
    columns: Sequence[Column],
    rows: Sequence[Sequence[Cell]],
    title: str | None = None,
) -> None:
    """Print `rows` as a table that fits the console, or as a plain list when none does."""
    chosen = list(range(len(columns)))
    while True:
        picked = [columns[i] for i in chosen]
        cut = [[row[i] for i in chosen] for row in rows]
        if _needed(picked, cut) <= console.width:
            console.print(_table(picked, cut, title))
            return
        optional = [i for i in chosen if columns[i].optional]
        if not optional:
            break
        chosen.remove(optional[-1])
    _print_list(console, picked, cut, title)


def _table(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], title: str | None) -> Table:
    table = Table(title=title)
    for index, column in enumerate(columns):
        if column.key or column.short:
            longest = max([len(column.header), *(_length(row[index]) for row in rows)])
            table.add_column(column.header, no_wrap=True, min_width=longest, justify=column.justify)
        else:
            table.add_column(column.header, overflow="fold", justify=column.justify)
    for row in rows:
        table.add_row(*row)
    return table


def _print_list(
    console: Console,
    columns: Sequence[Column],
    rows: Sequence[Sequence[Cell]],
    title: str | None,
) -> None:
    width = max(40, console.width)
    if title:
        console.print(Text(title, style="bold"))
    for row in rows:
        cells = list(zip(columns, (_plain(cell) for cell in row), strict=True))
        keys = "  ".join(text for column, text in cells if column.key)
        console.print(Text(keys), soft_wrap=True)  # never broken, even when too long
        short = ", ".join(f"{c.header}: {text}" for c, text in cells if c.short and text)
        long = [f"{c.header}: {text}" for c, text in cells if not (c.key or c.short) and text]
        for line in [short, *long] if short else long:
            wrapped = textwrap.fill(
                line,
                width=width,
                initial_indent="    ",
                subsequent_indent="      ",
                break_long_words=False,
                break_on_hyphens=False,
            )
            console.print(Text(wrapped), soft_wrap=True)


def _plain(cell: Cell) -> str:
    return cell.plain if isinstance(cell, Text) else cell


_ANONYMOUS = ("(anonymous namespace)::", "<unnamed>::")


def short_kernel_names(names: Sequence[str]) -> list[str]:
    """Demangled kernel names without the return type, anonymous namespace and parameter list
    (`softmax_block<1024, 8>`); a name that would then clash with another stays whole."""
    short = [_short_kernel_name(name) for name in names]
    return [s if short.count(s) == 1 else name for s, name in zip(short, names, strict=True)]


def _short_kernel_name(name: str) -> str:
    text = name.strip()
    if text.endswith(")"):  # drop the parameter list: the last top-level ( ... )
        depth = 0
        for index in range(len(text) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(text[index], 0)
            if depth == 0:
                text = text[:index].rstrip()
                break
    if text.startswith("void "):
        text = text[len("void ") :]
    for prefix in _ANONYMOUS:
        text = text.replace(prefix, "")
    return text or name
