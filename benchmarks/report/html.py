"""A matrix's report as one HTML page, DIR/index.html, the front door a practitioner reads in two minutes: the
matrix's headline and verdict sentences, the verdict table per task, the verdict figure (each variant's gap to the
best of the others), the learning curves, pass@k before and after training (where the cells recorded it), the cost
per variant, the flags, and the whole markdown report folded in ``<details>``. And ``write_index``:
results/index.html, a page listing every matrix folder under a root with its one-line headline and a link to its
page.

Self-contained: no network, no CDN, no JavaScript; the figures are inline SVG from matplotlib's SVG backend. Why
that and not plotly or bokeh: matplotlib is already a dependency (the PNGs are drawn with it, so the page and the
PNGs show the same figure), it is well kept, its SVG is a standalone vector drawing written offline, and a page
stays small (tens of kB a figure, text kept as text); plotly and bokeh inline their JavaScript at megabytes a page,
and a page with no script has none to break. The markdown the report writes is turned into HTML here (a small
subset: headings, paragraphs, lists, tables, code, emphasis and links), so the page says what README.md says.
"""

from __future__ import annotations

import html
import math
import os
import re
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from benchmarks.io import atomic_write_text
from benchmarks.markdown import lower_bound, plus_minus

PAGE = "index.html"

STYLE = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 1180px; margin: 2em auto;
       padding: 0 1em; color: #1a1a1a; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.88em; }
th, td { border: 1px solid #d4d4d4; padding: 0.25em 0.55em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.best td { background: #eef5ff; } tr.best td.variant { font-weight: 600; } tr.other td { color: #555; }
code { background: #f4f4f4; padding: 0 0.2em; border-radius: 3px; }
.lede { font-size: 1.05em; color: #333; } .figure svg { max-width: 100%; height: auto; }
details { margin: 1em 0; } summary { cursor: pointer; font-weight: 600; }
.muted { color: #666; font-size: 0.9em; }
"""


# ------------------------------------------------------------------------------------------------
# Markdown (the subset the report writes) as HTML
# ------------------------------------------------------------------------------------------------

_INLINE = [(re.compile(r"\*\*(.+?)\*\*"), r"<strong>\1</strong>"),
           (re.compile(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])"), r"<em>\1</em>"),
           (re.compile(r"!?\[([^\]]+)\]\(([^)\s]+)\)"), r'<a href="\2">\1</a>')]


def inline(text: str) -> str:
    """One line of markdown as HTML: escaped, with `code`, **strong**, *em* and [links](url) (an image is linked)."""
    parts = re.split(r"(`[^`]*`)", text)
    out = []
    for part in parts:
        if len(part) >= 2 and part.startswith("`") and part.endswith("`"):
            out.append(f"<code>{html.escape(part[1:-1])}</code>")
            continue
        part = html.escape(part, quote=True)
        for pattern, replacement in _INLINE:
            part = pattern.sub(replacement, part)
        out.append(part)
    return "".join(out)


def _table_cells(line: str) -> list[str]:
    cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [c.strip().replace("\\|", "|") for c in cells]


def markdown_html(text: str) -> str:
    """The report's markdown as HTML: headings, paragraphs, bullet lists, pipe tables; inline as ``inline``."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.startswith("<!--"):
            i += 1
        elif line.startswith("#"):
            level = min(6, len(line) - len(line.lstrip("#")))
            out.append(f"<h{level}>{inline(line[level:].strip())}</h{level}>")
            i += 1
        elif line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(_table_cells(lines[i]))
                i += 1
            body = [r for r in rows[1:] if not all(re.fullmatch(r":?-+:?", c) for c in r)]
            out.append("<table><thead><tr>" + "".join(f"<th>{inline(c)}</th>" for c in rows[0]) + "</tr></thead><tbody>"
                       + "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in r) + "</tr>" for r in body)
                       + "</tbody></table>")
        elif line.startswith("- "):
            items = []
            while i < len(lines) and (lines[i].startswith("- ") or lines[i].startswith("  ")):
                if lines[i].startswith("- "):
                    items.append(lines[i][2:])
                else:
                    items[-1] += " " + lines[i].strip()
                i += 1
            out.append("<ul>" + "".join(f"<li>{inline(item)}</li>" for item in items) + "</ul>")
        else:
            para = []
            while i < len(lines) and lines[i].strip() and not lines[i].startswith(("#", "|", "- ", "<!--")):
                para.append(lines[i].strip())
                i += 1
            out.append(f"<p>{inline(' '.join(para))}</p>")
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------
# The matrix's page
# ------------------------------------------------------------------------------------------------


def _number(value, fmt: str = "{:.3f}") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt.format(value)


def verdict_table(tasks: pd.DataFrame) -> str:
    """Per task, its variants ranked by the primary metric: seeds, the metric, the gap's simultaneous interval,
    the mark, P(best) and the training cost; the could-be-best set's rows marked (class "best")."""
    if tasks is None or tasks.empty:
        return "<p>No complete cells with evaluations yet: nothing to rank.</p>"
    parts = []
    head = ["rank", "variant", "seeds", "primary metric", "gap to best of others [simultaneous 95%]", "mark",
            "P(best)", "training s", "peak MiB"]
    for task, frame in tasks.groupby("task", sort=False):
        note = " (ranks nothing: saturated)" if bool(frame["saturated"].iloc[0]) else ""
        rows = []
        ranked = frame.sort_values("primary_mean", ascending=False, kind="stable")
        for rank, r in enumerate(ranked.to_dict("records"), 1):
            gap = "-" if pd.isna(r["gap_low"]) else f"[{r['gap_low']:+.3f}, {r['gap_high']:+.3f}]"
            worse = r["mark"] == "worse" and pd.notna(r["worse_by"])
            mark = html.escape(str(r["mark"])) + (f" by &ge; {lower_bound(r['worse_by'])}" if worse else "")
            peak = r.get("peak_memory_bytes")
            cells = [(str(rank), "num"), (html.escape(str(r["variant"])), "variant"), (str(r["seeds"]), "num"),
                     (_number(r["primary_mean"]), "num"), (gap, "num"), (mark, "mark"),
                     (_number(r["p_best"], "{:.2f}"), "num"), (_number(r.get("wall_clock_s"), "{:.1f}"), "num"),
                     ("-" if peak is None or pd.isna(peak) else f"{peak / 2**20:.0f}", "num")]
            kind = "best" if r["in_best_set"] else "other"
            rows.append(f'<tr class="{kind}" data-variant="{html.escape(str(r["variant"]), quote=True)}">'
                        + "".join(f'<td class="{c}">{v}</td>' for v, c in cells) + "</tr>")
        parts.append(f"<h3><code>{html.escape(str(task))}</code>{note}</h3>"
                     f'<table class="verdicts" data-task="{html.escape(str(task), quote=True)}"><thead><tr>'
                     + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>" + "".join(rows)
                     + "</tbody></table>")
    return "\n".join(parts)


# (summary column, heading, format, scale) of the page's cost table: what a variant costs per cell
COST_COLUMNS = [("wall_clock_s", "training s", "{:.1f}", 1.0), ("time_per_step_s", "time/step (ms)", "{:.1f}", 1e3),
                ("peak_memory_bytes", "peak memory (MiB)", "{:.0f}", 2.0**-20),
                ("tokens_per_second", "generated tokens/s", "{:.0f}", 1.0)]


def cost_table(summary: pd.DataFrame) -> str:
    """Per task and variant the mean cost of a cell over its complete seeds, with 95% t-intervals."""
    if summary is None or summary.empty:
        return "<p>No complete cells.</p>"
    head = ["task", "variant", "seeds"] + [h for _, h, _, _ in COST_COLUMNS]
    rows = []
    for r in summary.to_dict("records"):
        seeds = int(r["seeds_complete"])
        values = [plus_minus(r.get(f"{c}_mean", math.nan), r.get(f"{c}_ci95", math.nan), fmt, scale, seeds=seeds)
                  for c, _, fmt, scale in COST_COLUMNS]
        rows.append("<tr>" + f"<td>{html.escape(str(r['task']))}</td><td>{html.escape(str(r['variant']))}</td>"
                    f"<td class=\"num\">{seeds}/{int(r['seeds_planned'])}</td>"
                    + "".join(f'<td class="num">{html.escape(v)}</td>' for v in values) + "</tr>")
    return ('<table class="cost"><thead><tr>' + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def _figure(svg: Optional[str], missing: str) -> str:
    return f'<div class="figure">{svg}</div>' if svg else f'<p class="muted">{missing}</p>'


def page(*, title: str, header_md: str, sentences: Sequence[str], tasks: pd.DataFrame, summary: pd.DataFrame,
         svgs: dict, flags_md: str, report_md: str, files: Sequence[str] = (), pass_at_k_md: str = "") -> str:
    """The whole page as HTML text. ``header_md``: the matrix's header lines (device, budget, wall-clock, cells);
    ``sentences``: the verdicts' guidance; ``tasks``: the verdict table (verdicts.analyse's "tasks"); ``svgs``:
    {PNG name: SVG text} (plots.plots's ``svg``); ``flags_md``: the Flags section; ``report_md``: the whole
    markdown report, folded; ``files``: the plots and tables beside the page, linked under it; ``pass_at_k_md``: the
    pass@k table per task (passk_table.markdown), a section of its own where the cells recorded pass@k."""
    verdict_svg = svgs.get("verdicts.png")
    curves_svg = svgs.get("accuracy_vs_completions.png")
    links = "".join(f'<li><a href="{html.escape(f, quote=True)}">{html.escape(f)}</a></li>' for f in files)
    body = [
        f"<h1>{inline(title)}</h1>",
        f'<section id="headline" class="lede">{markdown_html(header_md)}</section>',
        '<section id="sentences"><h2>Verdicts</h2><ul>' + "".join(f"<li>{inline(s)}</li>" for s in sentences)
        + "</ul>" + verdict_table(tasks) + "</section>",
        '<section id="verdict-figure"><h2>Gap to the best of the others</h2>'
        '<p class="muted">Each variant\'s simultaneous 95% interval of its gap to the best of the others: a variant '
        "whose interval reaches 0 could be the best (in colour); one below 0 is worse by at least the distance to 0 "
        "(grey); the shaded band is the margin of equivalence, where the matrix stated one.</p>"
        + _figure(verdict_svg, "No verdict figure (no plots written, or nothing to rank).") + "</section>",
        '<section id="curves"><h2>Learning curves</h2>'
        + _figure(curves_svg, "No learning curves (no plots written, or no evaluations).") + "</section>",
        *([f'<section id="pass-at-k"><h2>pass@k before and after training</h2>{markdown_html(pass_at_k_md)}</section>']
          if pass_at_k_md else []),
        f'<section id="cost"><h2>Cost per variant</h2>{cost_table(summary)}</section>',
        f'<section id="flags">{markdown_html(flags_md)}</section>',
        '<details id="details"><summary>The full report: methods, every measured number, the tables and plots'
        f"</summary>{markdown_html(report_md)}" + (f"<h4>Files</h4><ul>{links}</ul>" if links else "") + "</details>",
    ]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(_plain(title))}</title><style>{STYLE}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _plain(text: str) -> str:
    return re.sub(r"[`*]", "", text)


def write_page(path: Path | str, **parts) -> Path:
    """``page(**parts)`` written atomically to ``path``."""
    path = Path(path)
    atomic_write_text(path, page(**parts))
    return path


# ------------------------------------------------------------------------------------------------
# The index of matrix folders
# ------------------------------------------------------------------------------------------------


def headline(folder: Path) -> tuple[str, str]:
    """A matrix folder's title and one-line headline from its README.md: the "### Matrix" line, and its first
    verdict sentence about a task (the one after the primary-metric line); ("", "") without a README."""
    readme = folder / "README.md"
    if not readme.is_file():
        return "", ""
    lines = readme.read_text(errors="replace").splitlines()
    title = next((line[4:].strip() for line in lines if line.startswith("### Matrix")), "")
    try:
        start = lines.index("### Verdicts")
    except ValueError:
        return title, "not reported yet" if not title else "no verdicts yet"
    sentences = [line[2:] for line in lines[start:] if line.startswith("- ")]
    said = [s for s in sentences if not s.startswith(("Primary metric:", "A/A check:"))]
    return title, (said or sentences or [""])[0]


def write_index(root: Path | str, page_path: Path | str | None = None) -> list[str]:
    """Write ROOT/index.html (or ``page_path``): every matrix folder under ``root`` (a matrix.json in it), its
    title and headline (``headline``) and a link to its page (its index.html, else its README.md); the lines to
    print."""
    root = Path(root)
    target = Path(page_path) if page_path else root / PAGE
    rows = []
    for meta in sorted(root.rglob("matrix.json")):
        folder = meta.parent
        title, said = headline(folder)
        own = folder / PAGE if (folder / PAGE).is_file() else folder / "README.md"
        link = Path(os.path.relpath(own.resolve(), target.resolve().parent)).as_posix()
        name = folder.relative_to(root).as_posix()
        rows.append(f'<tr><td><a href="{html.escape(link, quote=True)}">{html.escape(name)}</a></td>'
                    f"<td>{inline(title) or '-'}</td><td>{inline(said) or '-'}</td></tr>")
    body = ('<h1>grpo-bench results</h1><p class="lede">Every matrix under this folder, its headline verdict and a '
            "link to its page (written by <code>grpo-bench report DIR</code>).</p>"
            '<table class="index"><thead><tr><th>folder</th><th>matrix</th><th>headline</th></tr></thead><tbody>'
            + "".join(rows) + "</tbody></table>")
    atomic_write_text(target, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>grpo-bench "
                              f"results</title><style>{STYLE}</style></head>\n<body>\n{body}\n</body></html>\n")
    return [f"{target}: {len(rows)} matrix folders"]
