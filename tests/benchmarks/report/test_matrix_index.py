"""``grpo-bench readme``'s page of matrix files (benchmarks/report/matrix_index.py), read from this checkout's own
matrix files and committed stores: every file has a row, each store says how far it ran, a file never run says so."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    import os

    from benchmarks.cli.main import main

    out = tmp_path_factory.mktemp("index")
    here = os.getcwd()
    os.chdir(ROOT)  # the stores are found under results/, as the command finds them
    try:
        assert main(["readme", "--readme", str(out / "checks.md"), "--matrices", str(out / "matrices.md"),
                     "--html", str(out / "index.html")]) == 0
    finally:
        os.chdir(here)
    return out / "matrices.md"


def _row(text: str, file: str) -> str:
    (row,) = [line for line in text.splitlines() if line.startswith(f"| `benchmarks/matrices/{file}` |")]
    return row


def test_every_matrix_file_has_a_row_and_each_store_its_progress(page):
    text = page.read_text()
    assert text.startswith("# The matrix files") and "<!-- grpo-bench:matrices -->" in text
    for path in sorted((ROOT / "benchmarks/matrices").glob("*.toml")):
        _row(text, path.name)
    ns = _row(text, "rg_verdict_number_sequence.toml")
    assert "| 48 cells + 54 tuning cells |" in ns and "tuning 54 of 54, 48 of 48 cells complete" in ns
    assert "(reasoning-gym/verdict-number-sequence/README.md)" not in ns  # linked from the page's own folder
    lc = _row(text, "rg_verdict_letter_counting.toml")  # stopped in its tuning stage
    assert "tuning 43 of 54, evaluation cells not planned yet" in lc
    assert _row(text, "gpu_verdict_chain_sum.toml").endswith("| 128 cells | not run |")
    assert "| - | not run |" in _row(text, "claims_cost.toml")  # a reading: no cells of its own
    # two stores of one file, the second's DPO tuning cells stored before count_pair_samples existed
    tuned = _row(text, "verdicts_tuned.toml")
    assert "77 of 77 cells complete" in tuned and "verdicts-tuned-v2" in tuned and "tuning 136 of 136, 120 of 120" in tuned


def test_the_page_keeps_its_text_and_a_store_without_cells_says_so(page, tmp_path):
    from benchmarks.report.matrix_index import index_matrices, progress_text

    page.write_text(page.read_text() + "\nA note kept.\n")
    store = tmp_path / "results" / "x"
    store.mkdir(parents=True)
    (store / "matrix.json").write_text('{"file": "benchmarks/matrices/x.toml", "cells": []}')
    outline = {"file": "benchmarks/matrices/x.toml", "name": "x", "description": "", "cells": 1, "tuning_cells": 0}
    (line,) = index_matrices([outline], page, results=tmp_path / "results")
    text = page.read_text()
    assert "A note kept." in text and line.endswith("1 matrix files, 1 with a result store")
    assert "| `benchmarks/matrices/x.toml` | x | 1 cell | [" in text and "): no cell stored yet |" in text
    assert progress_text({"cells": 6, "complete": 2, "tuning": 0, "tuning_complete": 0}) == "2 of 6 cells complete"


def test_a_bad_matrix_file_is_one_line_and_nothing_is_written(run_cli, tmp_path):
    pages = ["--readme", tmp_path / "checks.md", "--matrices", tmp_path / "matrices.md", "--html", tmp_path / "x.html"]
    code, out, _ = run_cli("readme", *pages, "--matrix-dir", tmp_path / "none")  # outside a checkout: said, not fatal
    assert code == 0 and f"{tmp_path / 'none'}: no matrix files (*.toml), {tmp_path / 'matrices.md'} not written" in out
    assert not (tmp_path / "matrices.md").exists()
    (tmp_path / "checks.md").unlink()
    (tmp_path / "x.html").unlink()  # the other pages are written
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "bad.toml").write_text("seeds = [\n")
    code, _, err = run_cli("readme", *pages, "--matrix-dir", tmp_path / "m")
    assert code == 2 and "bad.toml: invalid TOML" in err and len(err.strip().splitlines()) == 1
    assert not any((tmp_path / name).exists() for name in ("checks.md", "matrices.md", "x.html"))
