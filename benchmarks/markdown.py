"""Markdown, written in one place: tables and the number formats every report shares, and the README
sections the tool owns (text between ``<!-- grpo-bench:NAME -->`` and ``<!-- /grpo-bench:NAME -->`` is
replaced whole; nothing else in the file is touched). It sits at the bottom beside ``io``: the harness,
the checks, the perf benches and the report all write markdown through it.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Sequence

from benchmarks.io import atomic_write_text


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


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- grpo-bench:{name} -->", f"<!-- /grpo-bench:{name} -->"


def update_section(path: Path | str, name: str, body: str) -> None:
    """Replace section ``name`` of ``path`` with ``body`` (appending the section if it is new)."""
    path = Path(path)
    text = path.read_text() if path.exists() else ""
    start, end = _markers(name)
    block = f"{start}\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    text = pattern.sub(lambda _: block, text, count=1) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    atomic_write_text(path, text)


# Sections of the top-level README that quote a results/ report whole, in README order:
# (section name, report file, heading). Reports are written by their own commands; this only copies.
REPORT_SECTIONS = (
    ("mu1", "results/mu1/report.md", "Why a GRPO loss reads 0 at mu = 1"),
    ("trl-check", "results/trl_check/report.md", "GRPO and DPO losses against TRL"),
    ("trl-train", "results/trl_train/report.md", "TRL's GRPOTrainer and ours, end to end on pizza"),
    ("ablation", "results/ablation/group_size.md", "Group-size ablation on the bandit"),
)


def _quote_report(report: Path, heading: str) -> str:
    """The report with its own title replaced by ``heading``, sub-headings demoted, links made repo-relative."""
    lines = report.read_text().splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    base = report.parent.as_posix()
    body = []
    for line in lines:
        if line.startswith("#"):
            line = "##" + line
        line = re.sub(r"(!?\[[^\]]*\]\()(?!https?:|/|results/)([^)]+\))", rf"\g<1>{base}/\g<2>", line)
        line = re.sub(r"`([\w.-]+\.(?:png|csv|json|md))`", rf"`{base}/\g<1>`", line)
        body.append(line)
    text = "\n".join(body).rstrip()
    for png in sorted(report.parent.glob("*.png")):
        if f"]({base}/{png.name})" not in text:
            text += f"\n\n![{png.stem}]({base}/{png.name})"
    return f"### {heading}\n" + text


def quote_reports(readme: str) -> list[str]:
    """Copy every written report of REPORT_SECTIONS into ``readme``; returns one line per section."""
    lines = []
    for name, path, heading in REPORT_SECTIONS:
        report = Path(path)
        if report.exists():
            update_section(readme, name, _quote_report(report, heading))
            lines.append(f"{readme}: section {name} <- {path}")
        else:
            lines.append(f"{readme}: section {name} left as it is ({path} not written yet)")
    return lines
