"""The result store (benchmarks/store.py): an exact round trip, a corrupt or foreign file refused in one
line, a kill mid-write that leaves the previous store, and a matrix that resumes from the store alone."""

from __future__ import annotations

import json
import math
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.cli.main import main
from benchmarks.store import STORE_FILE, ResultStore

SPEC = {"task": "pizza", "task_label": "pizza", "algo": "grpo", "variant": "grpo", "seed": 0, "steps": 3}
ROWS = [
    {"step": 1, "reward/mean": 0.1, "loss": -1e-9, "completions": 32.0, "time/step": 0.25},
    {"step": 2, "reward/mean": 0.2, "length/correct": float("nan"), "completions": 32, "eval/accuracy": 0.5},
    {"step": 3, "reward/mean": 1 / 3, "skipped_update": 1.0},
]
SUMMARY = {"status": "complete", "steps": 3, "accuracy_after": 0.75, "phase_seconds": {"generate": 1.5}, "error": None}


def same_rows(a: list[dict], b: list[dict]) -> bool:
    """Rows equal value for value, NaN equal to NaN (what a store round trip must preserve)."""

    def same(x, y):
        return x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))

    return len(a) == len(b) and all(r.keys() == s.keys() and all(same(r[k], s[k]) for k in r) for r, s in zip(a, b))


def test_round_trip_is_exact(tmp_path):
    store = ResultStore.open(tmp_path)
    store.put("pizza/grpo/seed0", SPEC, SUMMARY, ROWS)
    store.put("pizza/grpo/seed1", {**SPEC, "seed": 1}, {**SUMMARY, "status": "failed"}, ROWS[:1])
    again = ResultStore.open(tmp_path)
    assert list(again.cells) == ["pizza/grpo/seed0", "pizza/grpo/seed1"]
    assert again.spec("pizza/grpo/seed0") == SPEC and again.summary("pizza/grpo/seed0") == SUMMARY
    rows = again.metrics("pizza/grpo/seed0")
    # a key absent from a row stays absent, NaN stays NaN, every number is the same float
    assert same_rows(rows, ROWS) and "length/correct" not in rows[0] and math.isnan(rows[1]["length/correct"])
    assert rows[2]["reward/mean"] == 1 / 3 and isinstance(rows[0]["step"], int)
    assert again.metrics("pizza/grpo/seed1") == ROWS[:1]
    # replacing a cell keeps one copy of it
    again.put("pizza/grpo/seed0", SPEC, SUMMARY, ROWS[:2])
    assert len(ResultStore.open(tmp_path).metrics("pizza/grpo/seed0")) == 2
    table = pq.read_table(tmp_path / STORE_FILE)
    assert table.schema.field("reward/mean").type == pa.float64()
    metadata = pq.ParquetFile(tmp_path / STORE_FILE).metadata.row_group(0)
    columns = {metadata.column(i).path_in_schema: metadata.column(i) for i in range(metadata.num_columns)}
    assert {c.compression for c in columns.values()} == {"ZSTD"}
    # the metrics split by byte stream, the names and specs dictionary-encoded
    assert "BYTE_STREAM_SPLIT" in columns["reward/mean"].encodings and "BYTE_STREAM_SPLIT" in columns["loss"].encodings
    assert "BYTE_STREAM_SPLIT" not in columns["cell"].encodings and "RLE_DICTIONARY" in columns["cell"].encodings
    assert "BYTE_STREAM_SPLIT" not in columns["step"].encodings  # an integer column


def test_same_rows_can_fail():
    assert not same_rows(ROWS, ROWS[:2])
    assert not same_rows([{"step": 1, "x": 0.1}], [{"step": 1, "x": 0.1 + 1e-16 * 1e3}])
    assert not same_rows([{"step": 1, "x": 0.1}], [{"step": 1, "y": 0.1}])


def test_keep_only_drops_cells_of_another_plan(tmp_path):
    store = ResultStore.open(tmp_path)
    store.put("a", SPEC, SUMMARY, ROWS)
    store.put("b", {**SPEC, "seed": 1}, SUMMARY, ROWS)
    planned = {"a": SPEC, "b": {**SPEC, "seed": 1, "steps": 4}}  # b's spec changed: its result is stale
    store.keep_only(lambda relpath, spec: planned.get(relpath) == spec)
    assert list(ResultStore.open(tmp_path).cells) == ["a"]


@pytest.mark.parametrize("content, words", [
    (b"not parquet at all", "not a readable result store"),
    (None, "not a grpo-bench result store"),  # a Parquet file of someone else's
])
def test_a_corrupt_or_foreign_store_is_one_line_and_exit_2(tmp_path, capsys, content, words):
    path = tmp_path / STORE_FILE
    if content is None:
        pq.write_table(pa.table({"x": [1, 2]}), path)
    else:
        path.write_bytes(content)
    with pytest.raises(Exception, match=words):
        ResultStore.open(tmp_path)
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1 and "Traceback" not in err
    matrix = tmp_path / "m.toml"
    matrix.write_text('seeds = [0]\nbudget = 64\n[tasks.pizza]\neval_samples = 8\n[algorithms.grpo]\n')
    assert main(["matrix", str(matrix), "--out", str(tmp_path), "--resume", "--no-report",
                 "--allow-dirty"]) == 2  # before any work
    assert words in capsys.readouterr().err


def test_a_writer_killed_mid_write_leaves_the_previous_store(tmp_path, monkeypatch):
    store = ResultStore.open(tmp_path)
    store.put("a", SPEC, SUMMARY, ROWS)
    before = (tmp_path / STORE_FILE).read_bytes()

    def dies(table, where, **kwargs):
        open(where, "wb").write(b"half a file")
        raise KeyboardInterrupt  # what a kill looks like from inside the write

    monkeypatch.setattr(pq, "write_table", dies)
    with pytest.raises(KeyboardInterrupt):
        store.put("b", SPEC, SUMMARY, ROWS)
    assert (tmp_path / STORE_FILE).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [STORE_FILE]  # no temporary left behind


def test_a_matrix_resumes_from_its_store_alone_and_reports_it(tmp_path, capsys):
    """Committed results hold the store, not the cells' folders: --resume on them runs nothing and the report
    is the same as the one written beside the cells."""
    matrix = tmp_path / "m.toml"
    matrix.write_text('seeds = [0, 1]\nbudget = 64\ndevice = "cpu"\n[tasks.pizza]\neval_samples = 8\n[algorithms.grpo]\n')
    out = tmp_path / "out"
    assert main(["matrix", str(matrix), "--out", str(out), "--jobs", "1", "--no-progress", "--allow-dirty"]) == 0
    first = (out / "tables" / "summary.csv").read_text()
    store = ResultStore.open(out)
    for relpath in store.cells:
        cell_dir = out / relpath
        assert (cell_dir / ".gitignore").read_text() == "*\n"  # working space, never committed
        rows = [json.loads(line) for line in (cell_dir / "metrics.jsonl").read_text().splitlines()]
        assert same_rows(store.metrics(relpath), rows)
        # the store's copy adds which session ran the cell, when it ended and the code it ran
        code = {k: store.summary(relpath)[k] for k in ("commit", "dirty", "diff_hash")}
        assert store.summary(relpath) == {**json.loads((cell_dir / "summary.json").read_text()), **code,
                                          "matrix_session": 0, "finished_at": store.summary(relpath)["finished_at"]}
        shutil.rmtree(cell_dir)
    capsys.readouterr()
    assert main(["matrix", str(matrix), "--out", str(out), "--resume", "--jobs", "1", "--no-progress",
                 "--allow-dirty"]) == 0
    printed = capsys.readouterr().out
    assert "0 run and complete, 2 already complete" in printed
    assert (out / "tables" / "summary.csv").read_text() == first
    assert not any((out / relpath).exists() for relpath in store.cells)  # nothing was re-run


def test_a_new_option_at_its_default_keeps_finished_cells(tmp_path):
    """A stored cell that predates an option (its spec lacks the setting) is the same experiment while the
    plan leaves that option at its default, and a different one once the plan sets it."""
    from benchmarks.matrix import parse
    from benchmarks.matrix.execute import same_experiment

    path = tmp_path / "m.toml"
    path.write_text('seeds = [0]\nbudget = 64\n[tasks.pizza]\n[algorithms.grpo]\n')
    cell = parse(path).cells[0]
    old = cell.spec()
    old["settings"] = {k: v for k, v in old["settings"].items() if k != "loss_type"}  # "ran before loss_type existed"
    assert same_experiment(cell.spec(), cell) and same_experiment(old, cell)
    path.write_text('seeds = [0]\nbudget = 64\n[tasks.pizza]\n[algorithms.grpo]\nloss_type = "dapo"\n')
    changed = parse(path).cells[0]
    assert not same_experiment(old, changed)
    assert not same_experiment({**old, "seed": 1}, cell)


def test_a_dpo_cell_stored_before_count_pair_samples_is_held_by_its_store(tmp_path):
    """verdicts-tuned-v2's DPO tuning cells ran before count_pair_samples existed (pairs built outside the budget, the
    option's default): the store holds them for a plan at that default, not for one that counts the pair samples."""
    from benchmarks.matrix import parse
    from benchmarks.store import same_experiment_spec

    path = tmp_path / "m.toml"
    path.write_text('seeds = [0]\nbudget = 64\n[tasks.pizza]\n[algorithms.dpo]\n')
    planned = parse(path).cells[0].spec()
    assert planned["settings"]["count_pair_samples"] is False
    old = {**planned, "settings": {k: v for k, v in planned["settings"].items() if k != "count_pair_samples"}}
    assert same_experiment_spec(old, planned)
    path.write_text('seeds = [0]\nbudget = 64\n[tasks.pizza]\n[algorithms.dpo]\ncount_pair_samples = true\n')
    assert not same_experiment_spec(old, parse(path).cells[0].spec())
