"""Markdown, written in one place: tables and the number formats every report shares, and the README
sections the tool owns (text between ``<!-- grpo-bench:NAME -->`` and ``<!-- /grpo-bench:NAME -->`` is
replaced whole; nothing else in the file is touched). It sits at the bottom beside ``io``: the harness,
the checks, the perf benches and the report all write markdown through it.
"""

from __future__ import annotations

import decimal
import math
import os
import re
import tomllib
from pathlib import Path
from typing import Any, Optional, Sequence

from benchmarks.errors import UsageError
from benchmarks.io import atomic_write_text


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table; a cell is ``str(value)`` with ``|`` escaped and newlines flattened, None is "-"."""

    def cell(v):
        return "-" if v is None else str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def na_text(seeds: int | None = None) -> str:
    """What stands where an interval (or a spread-based number) cannot be had: "n/a", with the reason when it
    is too few seeds ("n/a (1 seed)": one seed has no seed-to-seed spread, a bootstrap over it is zero-width)."""
    if not _too_few(seeds):
        return "n/a"
    seeds = int(seeds)
    return f"n/a ({seeds} seed{'' if seeds == 1 else 's'})"


def _missing(value) -> bool:
    try:
        return value is None or math.isnan(value)
    except TypeError:
        return False


def _too_few(seeds: int | None) -> bool:
    return seeds is not None and not _missing(seeds) and int(seeds) < 2


def lower_bound(value: float) -> str:
    """A positive lower bound to three decimals, or to two significant digits when it is below 0.001, so a
    bound that is above 0 never reads "0.000"; rounded toward zero (0.0055 reads 0.005, 0.00096 reads 0.00096), so
    that a bound a reader quotes never overstates."""
    if not math.isfinite(value):
        return f"{value}"
    exact = decimal.Decimal(repr(float(value)))  # the shortest decimal that round-trips: 0.006 stays 0.006
    if 0 < value < 0.001:
        step = decimal.Decimal(1).scaleb(exact.adjusted() - 1)  # two significant digits
        return f"{float(exact.quantize(step, rounding=decimal.ROUND_DOWN)):.2g}"
    return f"{exact.quantize(decimal.Decimal('0.001'), rounding=decimal.ROUND_DOWN):f}"


def plus_minus(mean: float, half: float, fmt: str = "{:.3f}", scale: float = 1.0, seeds: int | None = None) -> str:
    """``mean ± half``; "-" when the mean is nan; ``mean ± n/a`` when the half-width is nan, ``mean ± n/a (1 seed)``
    when ``seeds`` < 2 (the mean alone would read as exact)."""
    if _missing(mean):
        return "-"
    text = fmt.format(mean * scale)
    if _missing(half) or _too_few(seeds):
        return f"{text} ± {na_text(seeds)}"
    return f"{text} ± {fmt.format(half * scale)}"


def with_interval(point: float, low: float, high: float, fmt: str = "{:.3f}", seeds: int | None = None) -> str:
    """``point [low, high]``, as a bootstrap interval is written; ``point [n/a]`` when a bound is nan,
    ``point [n/a (1 seed)]`` when ``seeds`` < 2 (a bootstrap over one seed is zero-width, not certain); "-" when
    the point is nan."""
    if _missing(point):
        return "-"
    if _missing(low) or _missing(high) or _too_few(seeds):
        return f"{fmt.format(point)} [{na_text(seeds)}]"
    return f"{fmt.format(point)} [{fmt.format(low)}, {fmt.format(high)}]"


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- grpo-bench:{name} -->", f"<!-- /grpo-bench:{name} -->"


def marked_section(name: str, body: str) -> str:
    """``body`` between section ``name``'s markers, as ``update_section`` writes it (a page written whole can hold a
    section that ``update_section`` later rewrites alone)."""
    start, end = _markers(name)
    return f"{start}\n{body.rstrip()}\n{end}"


def update_section(path: Path | str, name: str, body: str) -> None:
    """Replace section ``name`` of ``path`` with ``body`` (appending the section if it is new). Markers that do
    not pair up are refused, the file untouched: guessing where the section ends would delete what follows."""
    path = Path(path)
    try:
        text = path.read_text() if path.exists() else ""
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read it as a markdown file ({getattr(exc, 'strerror', None) or exc})") from None
    start, end = _markers(name)
    block = marked_section(name, body)
    starts, ends = text.count(start), text.count(end)
    if not starts and not ends:
        text = text.rstrip() + "\n\n" + block + "\n"
    else:
        problem = (f"{start} without its end marker {end}" if not ends else
                   f"{end} without its start marker {start}" if not starts else
                   f"{start} appears {starts} times" if starts > 1 else
                   f"{end} appears {ends} times" if ends > 1 else
                   f"{end} comes before {start}" if text.index(end) < text.index(start) else None)
        if problem:
            raise UsageError(f"{path}: section {name} has malformed markers ({problem}); the file is left as it was, "
                             f"fix its markers by hand")
        head, rest = text.split(start)
        text = head + block + rest.split(end)[1]
    atomic_write_text(path, text)


def write_report(path: Path | str, body: str, *, title: str = "", readme: Optional[str] = None,
                 section: Optional[str] = None, section_body: Optional[str] = None) -> None:
    """A study's report: ``path`` gets ``# TITLE`` (when given) and ``body``; with ``readme`` (the ``--readme``
    page; None or '' for none) its section ``section`` gets ``section_body``, else the body without the title.
    Every study writes its report and README section through this, most of them by the lifecycle's ``Study.write``
    (benchmarks/study.py)."""
    atomic_write_text(Path(path), (f"# {title}\n\n" if title else "") + body)
    write_section(readme, section, body if section_body is None else section_body)


def write_section(readme: Optional[str], section: str, body: str) -> None:
    """``--readme``'s section ``section`` <- ``body``; nothing when no page is named (None or '')."""
    if readme:
        update_section(readme, section, body)


# The index of reports (``grpo-bench readme``) is data: results/reports.toml names each report, in the index's order,
# with what a report cannot say of itself; the report gives its headline and the command that wrote it.
REPORTS_INDEX = "results/reports.toml"


def indexed_reports(index: Path | str = REPORTS_INDEX) -> list[dict]:
    """The entries of ``index`` (its ``[[report]]`` tables: path, what, command, and for a report whose command was
    retired, ``retired``: the last commit that ran its code); an unreadable file or an entry without path, what and
    command is one UsageError line."""
    try:
        entries = tomllib.loads(Path(index).read_text()).get("report", [])
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{index}: not a readable index of reports ({exc})") from None
    for number, entry in enumerate(entries, 1):
        if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) and entry[k]
                                                  for k in ("path", "what", "command")):
            raise UsageError(f"{index}: report {number} needs a path, what and command (text)")
    return entries


def headline(report: Path) -> str:
    """A report's verdict in one line: its first bold line (every check and bench writes one), else its title."""
    lines = report.read_text().splitlines()
    bold = next((line for line in lines if line.startswith("**")), None)
    if bold:
        return bold.strip()
    title = next((line.lstrip("# ").strip() for line in lines if line.startswith("# ")), "")
    return title or "(see the report)"


_WRITTEN_BY = re.compile(r"(?:Written by|Regenerate:) `([^`]+)`")


def written_by(report: Path, default: str) -> str:
    """The command a report says wrote it (its "Written by `...`" or "Regenerate: `...`" line, the exact arguments
    of its last run), else ``default``: the index names what wrote the report as it stands, not what once did."""
    found = _WRITTEN_BY.search(report.read_text())
    return found.group(1) if found else default


def index_reports(readme: Path | str, section: str = "checks", index: Path | str = REPORTS_INDEX) -> list[str]:
    """Write README section ``section``: one row per written report of ``index``, its headline and a link; a report
    whose command was retired names the last commit that ran it."""
    readme = Path(readme)
    rows, lines = [], []
    for entry in indexed_reports(index):
        report = Path(entry["path"])
        if not report.exists():
            lines.append(f"{readme}: {entry['path']} not written yet, left out of section {section}")
            continue
        link = Path(os.path.relpath(report.resolve(), readme.resolve().parent)).as_posix()
        command = f"`{written_by(report, entry['command'])}`"
        if entry.get("retired"):
            command += f" (retired; last run at {entry['retired']})"
        rows.append([f"[{entry['what']}]({link})", headline(report), command])
    update_section(readme, section, markdown_table(["report", "headline", "written by"], rows))
    lines.append(f"{readme}: section {section} <- {len(rows)} reports")
    return lines
