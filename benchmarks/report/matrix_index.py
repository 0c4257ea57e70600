"""``grpo-bench readme``'s page of matrix files (results/matrices.md): every file under benchmarks/matrices/, what it is
for (the file's own description), the cells it plans, and each result store made from it with how far it has run.
Everything in the table is read from the files and the stores, so no status is typed and none goes stale.

The study parses the matrix files (benchmarks.matrix, which the report does not import) and hands their outline
here; this module finds the stores (a matrix.json under the results folder names the file it came from) and reads
their progress (``matrix.store_progress``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from benchmarks.io import atomic_write_text, read_json
from benchmarks.markdown import markdown_table, update_section
from benchmarks.report.matrix import store_progress

SECTION = "matrices"
INTRO = ("# The matrix files\n\nEvery file under benchmarks/matrices/: what it is for (its own description), the cells "
         "it plans, and each result store under results/ made from it (its matrix.json names the file) with how far "
         "it has run. The table is rewritten by `grpo-bench readme` from the files and the stores; the text around "
         "it is kept. Run one with `grpo-bench matrix FILE --out DIR` (`--resume` continues it); its report: "
         "`grpo-bench report DIR`.\n")


def stores_by_file(results: Path | str) -> dict[str, list[Path]]:
    """Every result store under ``results``, keyed by the matrix file its matrix.json names, in path order."""
    found: dict[str, list[Path]] = {}
    for meta_path in sorted(Path(results).rglob("matrix.json")):
        meta = read_json(meta_path) or {}
        if isinstance(meta.get("file"), str):
            found.setdefault(Path(meta["file"]).as_posix(), []).append(meta_path.parent)
    return found


def progress_text(progress: dict | None) -> str:
    """'48 of 48 cells complete', with the tuning stage's count where there is one; None: no cell stored yet."""
    if progress is None:
        return "no cell stored yet"
    parts = []
    if progress["tuning"]:
        parts.append(f"tuning {progress['tuning_complete']} of {progress['tuning']}")
    if progress["cells"] or not progress["tuning"]:
        parts.append(f"{progress['complete']} of {progress['cells']} cells complete")
    else:
        parts.append("evaluation cells not planned yet (the tuning stage chooses them)")
    return ", ".join(parts)


def matrix_rows(outlines: Sequence[dict], stores: dict[str, list[Path]], page: Path) -> list[list[str]]:
    """One row per matrix file outline ({"file", "name", "description", "cells", "tuning_cells"}): the file, what it
    is for, the cells it plans, and its stores (linked from ``page``) with their progress, or 'not run'."""
    rows = []
    for o in outlines:
        planned = (f"{o['cells']} cell{'s' * (o['cells'] != 1)}" if o["cells"] else "-") + (
            f" + {o['tuning_cells']} tuning cells" if o["tuning_cells"] else "")
        runs = []
        for store in stores.get(Path(o["file"]).as_posix(), []):
            link = Path(os.path.relpath(store.resolve(), page.resolve().parent)).as_posix()
            readme = f"{link}/README.md" if (store / "README.md").exists() else f"{link}/"
            runs.append(f"[{store.as_posix()}]({readme}): {progress_text(store_progress(store))}")
        rows.append([f"`{o['file']}`", o["description"] or o["name"], planned, "; ".join(runs) or "not run"])
    return rows


def index_matrices(outlines: Sequence[dict], page: Path | str, results: Path | str = "results") -> list[str]:
    """Write section ``matrices`` of ``page``: every matrix file's row (``matrix_rows``); the lines to print."""
    page = Path(page)
    if not page.exists():
        atomic_write_text(page, INTRO)
    rows = matrix_rows(outlines, stores_by_file(results), page)
    update_section(page, SECTION, markdown_table(["matrix file", "what it is for", "plans", "result stores"], rows))
    ran = sum(row[-1] != "not run" for row in rows)
    return [f"{page}: section {SECTION} <- {len(rows)} matrix files, {ran} with a result store"]
