"""Rows of the Markdown tables that reports and analyses write (report.md, the analyses' tables)."""

from __future__ import annotations

import re
from typing import Iterable


def markdown_cell(value: object) -> str:
    """`value` as one table cell's text: a `|` in it escaped (else it would end the cell: a run, stage or
    group name holding one gave a row more cells than its header), a line break a space."""
    return " ".join(str(value).splitlines()).replace("|", "\\|")


def markdown_row(cells: Iterable[object]) -> str:
    """`| a | b | c |`, each cell's text escaped (`markdown_cell`); an empty cell `| |`."""
    return "|" + "".join(f" {text} |" if text else " |" for text in map(markdown_cell, cells))


def markdown_cells(row: str) -> list[str]:
    """The cells of a table row that `markdown_row` wrote, as they were given (an escaped `|` is text)."""
    cells = re.split(r"(?<!\\)\|", row.strip().removeprefix("|").removesuffix("|"))
    return [cell.strip().replace("\\|", "|") for cell in cells]
