"""Markdown tables and the number formats the reports share (the one home of ``markdown_table``)."""

from __future__ import annotations

import math
from typing import Any, Sequence


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table; a cell is ``str(value)`` with ``|`` escaped and newlines flattened, None is "-"."""

    def cell(v):
        return "-" if v is None else str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def plus_minus(mean: float, half: float, fmt: str = "{:.3f}", scale: float = 1.0) -> str:
    """``mean ± half`` (``mean`` alone when the half-width is nan, "-" when the mean is)."""
    if mean is None or math.isnan(mean):
        return "-"
    text = fmt.format(mean * scale)
    return text if half is None or math.isnan(half) else f"{text} ± {fmt.format(half * scale)}"


def with_interval(point: float, low: float, high: float, fmt: str = "{:.3f}") -> str:
    """``point [low, high]``, as a bootstrap interval is written."""
    if point is None or math.isnan(point):
        return "-"
    return f"{fmt.format(point)} [{fmt.format(low)}, {fmt.format(high)}]"
