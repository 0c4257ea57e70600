"""Adversary finds: README markers that do not pair up are refused, the result store detects a flipped bit, a
malformed store is one line, and every atomic write keeps an existing file's mode (a new one follows the umask)."""

from __future__ import annotations

import json
import os
import random
import shutil
import stat

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.cli.main import main
from benchmarks.errors import UsageError
from benchmarks.io import atomic_write_json, atomic_write_text
from benchmarks.markdown import update_section
from benchmarks.store import FORMAT, STORE_FILE, ResultStore
from tests.benchmarks.cli.test_main import assert_one_line_error
from tests.benchmarks.report.test_matrix import _curves, _write_cell

MATRIX_TOML = 'seeds = [0]\nbudget = 64\n[tasks.pizza]\neval_samples = 8\n[algorithms.grpo]\n'


def _matrix(out):
    """A small matrix directory holding only its store and plan (no training), as
    tests/benchmarks/report/test_matrix.py builds."""
    cells = [_write_cell(out, "hard", variant, seed, cps, _curves("hard", variant, seed), seconds, {"entropy": 1.0})
             for variant, cps, seconds in (("fast", 16, 1.0), ("slow", 8, 2.0)) for seed in range(2)]
    (out / "matrix.json").write_text(json.dumps({"name": "t", "cells": cells, "sessions": []}))
    store = ResultStore.open(out)
    for cell in cells:
        cell_dir = out / cell["dir"]
        store.put(cell["dir"], {k: v for k, v in cell.items() if k != "dir"}, json.loads((cell_dir / "summary.json").read_text()),
                  [json.loads(line) for line in (cell_dir / "metrics.jsonl").read_text().splitlines()])
    shutil.rmtree(out / "hard")
    return out


@pytest.fixture(scope="module")
def matrix_dir(tmp_path_factory):
    return _matrix(tmp_path_factory.mktemp("adversary") / "mt")


def _values(store: ResultStore):
    return json.dumps([store.cells, store.steps], sort_keys=True)  # NaN as NaN, every float exactly


def _run(capsys, *args):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ------------------------------------------------------------------------------------------------
# 4. README section markers
# ------------------------------------------------------------------------------------------------

S, E = "<!-- grpo-bench:matrix-mt -->", "<!-- /grpo-bench:matrix-mt -->"


@pytest.mark.parametrize("text, marker", [
    (f"# Notes\n\n{S}\nhand-written notes\n", S),  # start without end: the README
    (f"# Notes\n\nhand-written notes\n{E}\nmore\n", E),  # end without start
    (f"{S}\nold\n{E}\n\n{S}\nnotes\n", S),  # the start twice
    (f"{S}\nold\n{E}\nnotes\n{E}\n", E),  # the end twice
    (f"# Notes\n{E}\nnotes\n{S}\nmore notes\n", E),  # end before start
])
def test_malformed_section_markers_are_refused_and_the_file_left_unchanged(tmp_path, text, marker):
    readme = tmp_path / "README.md"
    readme.write_text(text)
    with pytest.raises(UsageError) as error:
        update_section(readme, "matrix-mt", "new body")
    message = str(error.value)
    assert str(readme) in message and marker in message and len(message.splitlines()) == 1
    assert readme.read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md"]


def test_a_readme_that_cannot_be_read_is_one_line(tmp_path):
    (tmp_path / "binary.md").write_bytes(b"\xff\xfe notes")
    for path in (tmp_path, tmp_path / "binary.md"):
        with pytest.raises(UsageError, match="cannot read it as a markdown file"):
            update_section(path, "matrix-mt", "new body")
    assert (tmp_path / "binary.md").read_bytes() == b"\xff\xfe notes"


def test_a_well_formed_section_is_replaced_and_the_rest_kept(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# Notes\n\n{S}\nold\n{E}\n\nhand-written notes\n<!-- grpo-bench:matrix-mt-verdicts -->\nv\n"
                      "<!-- /grpo-bench:matrix-mt-verdicts -->\n")
    update_section(readme, "matrix-mt", "new")
    assert readme.read_text() == (f"# Notes\n\n{S}\nnew\n{E}\n\nhand-written notes\n<!-- grpo-bench:matrix-mt-verdicts -->\n"
                                  "v\n<!-- /grpo-bench:matrix-mt-verdicts -->\n")
    update_section(readme, "other", "x")
    assert readme.read_text().endswith("<!-- /grpo-bench:matrix-mt-verdicts -->\n\n"
                                       "<!-- grpo-bench:other -->\nx\n<!-- /grpo-bench:other -->\n")


def test_report_refuses_a_readme_whose_section_has_no_end_marker(matrix_dir, tmp_path, capsys):
    """The issue: the first report appended a second section after the notes, the second deleted them."""
    readme = tmp_path / "README.md"
    text = f"# Notes\n\n{S}\nhand-written notes\nmore notes\n"
    readme.write_text(text)
    for _ in range(2):
        assert_one_line_error(_run(capsys, "report", matrix_dir, "--readme", readme, "--no-plots"), str(readme), S, E)
        assert readme.read_text() == text


# ------------------------------------------------------------------------------------------------
# 5. Checksums: a flipped bit is detected or changes nothing
# ------------------------------------------------------------------------------------------------


def _flip(data: bytes, position: int, bit: int) -> bytes:
    flipped = bytearray(data)
    flipped[position] ^= 1 << bit
    return bytes(flipped)


def _page_ranges(path):
    """(first byte, end) of each column chunk's pages, and where the footer starts."""
    meta = pq.ParquetFile(path).metadata
    chunks = [meta.row_group(0).column(i) for i in range(meta.num_columns)]
    ranges = [(min(o for o in (c.dictionary_page_offset, c.data_page_offset) if o), 0) for c in chunks]
    ranges = [(start, start + c.total_compressed_size) for (start, _), c in zip(ranges, chunks)]
    return ranges, path.stat().st_size - 8 - meta.serialized_size


def test_every_flipped_bit_is_detected_or_changes_nothing(matrix_dir, tmp_path):
    """The issue: 30 of 61 flips in the data pages read back as other numbers (grad_norm 8.36 -> -8.5e+236)."""
    good = ResultStore.open(matrix_dir)
    data = (matrix_dir / STORE_FILE).read_bytes()
    ranges, footer = _page_ranges(matrix_dir / STORE_FILE)
    rng = random.Random(0)
    in_pages = [p for start, end in ranges for p in rng.sample(range(start, end), min(12, end - start))]
    positions = in_pages + rng.sample(range(footer, len(data)), 120)  # the footer: names, types, the digest
    outcomes = {"detected": 0, "unchanged": 0}
    for position in positions:
        (tmp_path / STORE_FILE).write_bytes(_flip(data, position, rng.randrange(8)))
        try:
            store = ResultStore.open(tmp_path)
        except UsageError as exc:
            assert len(str(exc).splitlines()) == 1
            outcomes["detected"] += 1
            continue
        assert _values(store) == _values(good), f"a flip at byte {position} changed a value silently"
        outcomes["unchanged"] += 1
    assert outcomes["detected"] > len(positions) // 2, outcomes


def test_a_corrupted_store_is_one_line_and_exit_2_in_report_and_resume(matrix_dir, tmp_path, capsys):
    data = (matrix_dir / STORE_FILE).read_bytes()
    ranges, _ = _page_ranges(matrix_dir / STORE_FILE)
    start, end = max(ranges, key=lambda r: r[1] - r[0])
    shutil.copy(matrix_dir / "matrix.json", tmp_path)
    (tmp_path / STORE_FILE).write_bytes(_flip(data, end - 3, 0))  # inside the last page's values
    assert_one_line_error(_run(capsys, "report", tmp_path), f"the result store {tmp_path / STORE_FILE} is corrupted")
    (tmp_path / "m.toml").write_text(MATRIX_TOML)
    assert_one_line_error(_run(capsys, "matrix", tmp_path / "m.toml", "--out", tmp_path, "--resume", "--no-report",
                               "--allow-dirty"),
                          "is corrupted")


def test_a_value_changed_behind_the_checksum_is_detected(matrix_dir, tmp_path):
    """A page rewritten with its own valid CRC (or none) still fails the digest the store was written with."""
    table = pq.read_table(matrix_dir / STORE_FILE)
    column = table.column_names.index("reward/mean")
    values = table.column(column).to_pylist()
    values[-1] += 1e-12
    pq.write_table(table.set_column(column, table.field(column), pa.array(values, pa.float64())), tmp_path / STORE_FILE)
    with pytest.raises(UsageError, match="is corrupted: its values do not match"):
        ResultStore.open(tmp_path)


def test_a_store_written_without_checksums_still_reads(tmp_path):
    """Stores committed before the checksums: no page CRCs, no digest in the format tag."""
    store = ResultStore.open(tmp_path / "new")
    store.put("a", {"task": "pizza"}, {"status": "complete"}, [{"step": 1, "loss": 0.5}, {"step": 2, "loss": float("nan")}])
    table = pq.read_table(store.path).replace_schema_metadata({"grpo_bench": json.dumps(FORMAT)})
    (tmp_path / "old").mkdir()
    pq.write_table(table, tmp_path / "old" / STORE_FILE, compression="zstd")
    assert _values(ResultStore.open(tmp_path / "old")) == _values(store)


# ------------------------------------------------------------------------------------------------
# 6. A malformed store
# ------------------------------------------------------------------------------------------------


def _rewrite(table, name, values):
    return table.set_column(table.column_names.index(name), name, pa.array(values, table.schema.field(name).type))


def _cells_only(values, new):
    return [new if v is not None else None for v in values]


@pytest.mark.parametrize("change, words", [
    (lambda t: _rewrite(t, "summary", _cells_only(t["summary"].to_pylist(), "{not json")), "summary of cell"),
    (lambda t: t.drop_columns(["spec"]), "no spec column"),
    (lambda t: _rewrite(t, "summary", _cells_only(t["summary"].to_pylist(), "[1, 2]")), "not a JSON object"),
    (lambda t: _rewrite(t, "spec", [None] * t.num_rows), "spec of cell"),
    (lambda t: _rewrite(t, "step", [None] * t.num_rows), "without its step number"),
])
def test_a_malformed_store_is_one_line_and_exit_2(matrix_dir, tmp_path, capsys, change, words):
    """Written by another tool (no digest): the format tag is right, what it holds is not."""
    table = change(pq.read_table(matrix_dir / STORE_FILE)).replace_schema_metadata({"grpo_bench": json.dumps(FORMAT)})
    pq.write_table(table, tmp_path / STORE_FILE)
    shutil.copy(matrix_dir / "matrix.json", tmp_path)
    assert_one_line_error(_run(capsys, "report", tmp_path), str(tmp_path / STORE_FILE), words)
    (tmp_path / "m.toml").write_text(MATRIX_TOML)
    assert_one_line_error(_run(capsys, "matrix", tmp_path / "m.toml", "--out", tmp_path, "--resume", "--no-report",
                               "--allow-dirty"),
                          str(tmp_path / STORE_FILE), words)


@pytest.mark.parametrize("spec, summary, words", [
    ({"task": "pizza"}, {"status": "complete"}, "no 'task_label'"),  # no matrix.json: the plan is the stored specs
    ({"task": "pizza", "task_label": "pizza", "variant": "grpo", "algo": "grpo", "seed": 0}, {"status": "complete"},
     "no 'completions_generated'"),
])
def test_a_stored_cell_without_what_the_report_needs_is_one_line(tmp_path, capsys, spec, summary, words):
    ResultStore.open(tmp_path).put("pizza/grpo/seed0", spec, summary, [{"step": 1, "loss": 0.5}])
    assert_one_line_error(_run(capsys, "report", tmp_path), f"the result store {tmp_path / STORE_FILE}", "pizza/grpo/seed0",
                          words)


# ------------------------------------------------------------------------------------------------
# 13. File modes
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def umask():
    previous = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(previous)


def _mode(path):
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077])
def test_a_new_file_follows_the_umask(tmp_path, umask, mask):
    umask(mask)
    atomic_write_text(tmp_path / "a.txt", "a")
    atomic_write_json(tmp_path / "config.json", {"a": 1})
    update_section(tmp_path / "README.md", "s", "body")
    ResultStore.open(tmp_path / "m").put("a", {"task": "pizza"}, {"status": "complete"}, [{"step": 1, "loss": 0.5}])
    for path in (tmp_path / "a.txt", tmp_path / "config.json", tmp_path / "README.md", tmp_path / "m" / STORE_FILE):
        assert _mode(path) == 0o666 & ~mask, path


def test_an_existing_file_keeps_its_mode(tmp_path, umask):
    umask(0o077)  # the mode the file has, not the umask, decides
    readme, store = tmp_path / "README.md", tmp_path / STORE_FILE
    readme.write_text(f"{S}\nold\n{E}\n")
    os.chmod(readme, 0o644)
    update_section(readme, "matrix-mt", "new")
    assert _mode(readme) == 0o644 and "new" in readme.read_text()
    os.chmod(readme, 0o604)
    atomic_write_text(readme, "x")
    assert _mode(readme) == 0o604
    ResultStore.open(tmp_path).put("a", {"task": "pizza"}, {"status": "complete"}, [])
    os.chmod(store, 0o664)
    ResultStore.open(tmp_path).put("b", {"task": "pizza"}, {"status": "complete"}, [])
    assert _mode(store) == 0o664


def test_report_keeps_a_shared_readmes_mode_and_writes_readable_tables(matrix_dir, tmp_path, umask, capsys):
    """The issue: report --readme turned a 0644 README into 0600, and wrote every table 0600."""
    out = tmp_path / "mt"
    shutil.copytree(matrix_dir, out)
    readme = tmp_path / "README.md"
    readme.write_text("# Notes\n")
    os.chmod(readme, 0o644)
    assert main(["report", str(out), "--readme", str(readme), "--no-plots"]) == 0
    assert _mode(readme) == 0o644 and S in readme.read_text()
    assert _mode(out / "README.md") == 0o644 and _mode(out / "tables" / "summary.csv") == 0o644
