"""The summary table: one row per figure, with its target, its runs and whether it is met."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .common import RUNS, median


@dataclass(frozen=True, slots=True)
class Row:
    """One printed figure. ``met`` is ``None`` when the figure has no target of its own."""

    figure: str
    target: str
    value: str
    met: bool | None
    runs: str = ""
    peer: str = ""


def measured(
    figure: str,
    runs: Sequence[float],
    unit: str,
    target: str,
    check: Callable[[float], bool] | None,
    *,
    digits: int = 0,
    peer: str = "",
) -> Row:
    """A row whose value is the median of ``runs``, formatted with ``digits`` decimals."""
    value = median(runs)
    shown = ", ".join(f"{r:,.{digits}f}" for r in runs)
    return Row(
        figure,
        target,
        f"{value:,.{digits}f} {unit}".strip(),
        None if check is None else check(value),
        f"[{shown}]",
        peer,
    )


def render(rows: Sequence[Row], notes: Sequence[str]) -> str:
    """The table as text, then the notes."""
    header = Row("figure", "target", "median", None, f"{RUNS} runs", "peer (issue 2, 2026-11-29)")
    table = [header, *rows]
    widths = [
        max(len(r.figure) for r in table),
        max(len(r.target) for r in table),
        max(len(r.value) for r in table),
        4,
        max(len(r.runs) for r in table),
    ]
    lines = []
    for i, r in enumerate(table):
        met = "met" if i == 0 else {True: "yes", False: "NO", None: "-"}[r.met]
        cells = [r.figure, r.target, r.value, met, r.runs]
        lines.append(
            "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + "  " + r.peer
        )
        if i == 0:
            lines.append("-" * len(lines[0]))
    return "\n".join([*lines, "", *notes])
