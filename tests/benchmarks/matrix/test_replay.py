"""grpo-bench replay: a stored cell run again from its spec at HEAD reproduces bit for bit; a planted change in the
stored metrics is found at its step and metric; a commit not in the history, or a cell recorded with uncommitted
changes, is reported as not run at its commit (nothing runs for it there); a clean cell's commit is run in a
temporary worktree that is removed afterwards; bad input is one line.

The store is a tiny matrix (pizza, two steps, one cell) run once for the module; its cell is copied within the store
under other names with the changes each test plants. Each replay that runs a cell costs about 10 s (a fresh process
importing torch and transformers)."""

import copy
import json
import math
import subprocess
import tempfile

import pytest

from benchmarks.matrix.replay import BIT, DIFFERS, NOT_RUN, WITHIN, choose, compare, run_spec
from benchmarks.store import ResultStore
from tests.conftest import ROOT

TINY = """\
seeds = [0]
budget = 64
num_cpus = 1
device = "cpu"

[tasks.pizza]
eval_samples = 8

[algorithms.grpo]
"""
CELL = "pizza/grpo/seed0"
ABSENT_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _head() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def _worktrees() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True).stdout


def _plant(store: ResultStore, name: str, *, code=None, metrics=None) -> None:
    """A copy of the tiny cell under ``name``: its recorded code (``code``) or its metrics rows (``metrics(rows)``)
    changed."""
    summary = copy.deepcopy(store.summary(CELL))
    rows = copy.deepcopy(store.metrics(CELL))
    if code is not None:
        summary["config"]["environment"]["code"] = code
    if metrics is not None:
        metrics(rows)
    store.put(name, store.spec(CELL), summary, rows)


def _add_to_loss_of_step_2(rows):
    (row,) = [r for r in rows if r["step"] == 2]
    row["loss"] += 0.5


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The tiny matrix's store, with its one cell and four planted copies."""
    from benchmarks.cli.main import build_parser, main

    tmp = tmp_path_factory.mktemp("replay")
    (tmp / "m.toml").write_text(TINY)
    args = ["matrix", str(tmp / "m.toml"), "--out", str(tmp / "out"), "--no-progress", "--no-report"]
    # a checkout with uncommitted changes may be refused by the matrix unless it is asked to go ahead
    matrix_help = build_parser()._subparsers._group_actions[0].parser_of("matrix").format_help()
    assert main(args + (["--allow-dirty"] if "--allow-dirty" in matrix_help else [])) == 0
    stored = ResultStore.open(tmp / "out")
    assert len(stored.metrics(CELL)) == 2  # two steps: a change planted at the second is not the first row
    _plant(stored, "planted-loss", metrics=_add_to_loss_of_step_2)
    _plant(stored, "absent-commit", code={"commit": ABSENT_COMMIT, "dirty": False})
    _plant(stored, "dirty", code={"commit": _head(), "dirty": True})
    _plant(stored, "clean-head", code={"commit": _head(), "dirty": False})
    return tmp / "out"


@pytest.fixture(scope="module")
def at_head(store, tmp_path_factory):
    """The tiny cell and its copy with a planted loss, replayed at HEAD: (exit status, stdout, the report)."""
    from benchmarks.cli.main import main
    import contextlib
    import io

    out = tmp_path_factory.mktemp("report") / "replay.md"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["replay", str(store), "--cell", CELL, "planted-loss", "--at", "head", "--out", str(out)])
    return code, printed.getvalue(), json.loads(out.with_suffix(".json").read_text()), out.read_text()


def _row(report, cell):
    (row,) = [r for r in report["rows"] if r["cell"] == cell]
    return row


def test_a_replayed_cell_reproduces_bit_for_bit_at_head(at_head):
    code, printed, report, page = at_head
    assert code == 0, printed
    row = _row(report, CELL)
    assert row["at_head"]["status"] == BIT, row
    assert row["at_head"]["first"] is None and row["at_head"]["values"] > 40  # two steps' metrics and the summary's
    assert row["at_commit"] is None and row["threads"] == 1 and row["threads_from"] == "recorded"
    # progress while it runs, and the page led by its headline
    assert f"[1/2] {CELL}" in printed and f"{CELL} at HEAD" in printed
    assert page.splitlines()[2] == ("**1 of 2 reproduced bit for bit at HEAD (1 differs).**")


def test_a_planted_change_in_the_stored_metrics_is_reported_at_its_step_and_metric(at_head):
    _, _, report, page = at_head
    outcome = _row(report, "planted-loss")["at_head"]
    assert outcome["status"] == DIFFERS
    assert (outcome["first"]["step"], outcome["first"]["metric"]) == (2, "loss")
    assert outcome["first"]["stored"] - outcome["first"]["replayed"] == pytest.approx(0.5)
    assert outcome["max_abs_diff"] == {"value": pytest.approx(0.5), "step": 2, "metric": "loss"}
    assert "differs from step 2, loss" in page


def test_a_commit_not_in_the_history_and_a_dirty_cell_are_not_run_at_their_commit(store, tmp_path, run_cli):
    out = tmp_path / "r.md"
    code, printed, err = run_cli("replay", store, "--cell", "absent-commit", "dirty", "--at", "recorded",
                                 "--out", out)
    assert code == 0, err
    report = json.loads(out.with_suffix(".json").read_text())
    absent, dirty = _row(report, "absent-commit")["at_commit"], _row(report, "dirty")["at_commit"]
    assert absent["status"] == dirty["status"] == NOT_RUN
    assert absent["why"] == f"commit {ABSENT_COMMIT[:10]} is not in this repository's history"
    assert dirty["why"].startswith("recorded with uncommitted changes")
    assert " at commit " not in printed  # nothing ran
    assert out.read_text().splitlines()[2] == ("**none ran at their commit (1 not run: commit not in this repository's "
                                               "history, 1 not run: recorded with uncommitted changes).**")


def test_a_clean_cell_is_run_at_its_commit_in_a_worktree_that_is_removed(store, tmp_path, run_cli, monkeypatch):
    temporary = tmp_path / "tmp"  # where this replay's worktree goes (other replays may add and remove their own)
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    out = tmp_path / "r.md"
    code, printed, err = run_cli("replay", store, "--cell", "clean-head", "--at", "recorded", "--out", out)
    assert code == 0, err
    outcome = _row(json.loads(out.with_suffix(".json").read_text()), "clean-head")["at_commit"]
    assert f"clean-head at commit {_head()[:10]}" in printed
    # the code of HEAD's commit ran: the same numbers, unless this checkout changes what a pizza cell computes
    assert outcome["status"] in (BIT, DIFFERS) and outcome["values"] > 40, outcome
    assert str(temporary) not in _worktrees() and not list(temporary.iterdir())


@pytest.mark.parametrize("args, fragment", [
    (["--cells", "6"], "holds 5 complete cells; ask for at most that many"),
    (["--cell", "no/such/cell"], "--cell no/such/cell: no such cell"),
    (["--cells", "2", "--cell", CELL], "give one of the two"),
    ([], "--cells K (at least 1) or --cell NAME"),
    (["--cells", "0"], "must be >= 1"),
    (["--at", "tomorrow", "--cells", "1"], "invalid choice: 'tomorrow'"),
], ids=["more-than-the-store", "unknown-cell", "both", "neither", "zero", "bad-at"])
def test_bad_input_is_one_line_and_writes_nothing(store, tmp_path, run_cli, args, fragment):
    out = tmp_path / "r.md"
    code, printed, err = run_cli("replay", store, *args, "--out", out)
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists() and not out.with_suffix(".json").exists()


@pytest.mark.parametrize("given, fragment", [("", "no result store"), ("missing", "no such folder"),
                                             ("file.txt", "a file, not a matrix directory")])
def test_a_path_without_a_store_is_one_line(tmp_path, run_cli, given, fragment):
    (tmp_path / "file.txt").write_text("")
    code, _, err = run_cli("replay", tmp_path / given, "--cells", "1", "--out", tmp_path / "r.md")
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err


def test_the_draw_is_seeded_in_the_store_order_and_only_of_complete_cells(tmp_path):
    cells = {f"c{i}": {"spec": {}, "summary": {"status": "complete" if i % 3 else "failed"}} for i in range(30)}
    store = ResultStore(tmp_path / "results.parquet", cells, {})
    drawn = choose(store, 5, None, seed=1)
    assert drawn == choose(store, 5, None, seed=1) and drawn != choose(store, 5, None, seed=2)
    assert drawn == sorted(drawn, key=list(cells).index)
    assert all(cells[c]["summary"]["status"] == "complete" for c in drawn) and len(set(drawn)) == 5


def _rows(changes=None):
    rows = [{"step": 1, "loss": 0.25, "reward/mean": 0.5, "time/wall": 1.0, "kl": math.nan},
            {"step": 2, "loss": -0.125, "reward/mean": 0.75, "time/wall": 2.0, "kl": 0.01}]
    for (step, metric), value in (changes or {}).items():
        rows[step - 1][metric] = value
    return rows


SUMMARY = {"accuracy_before": 0.25, "accuracy_after": 0.5, "wall_clock_s": 3.0, "status": "complete"}


def test_compare_ignores_wall_clock_and_holds_nan_equal_to_nan():
    replayed = [dict(r, **{"time/wall": r["time/wall"] * 7}) for r in _rows()]
    verdict = compare(_rows(), SUMMARY, replayed, dict(SUMMARY, wall_clock_s=99.0))
    assert verdict["status"] == BIT and verdict["values"] == 2 * 3 + 2  # loss, reward/mean, kl; two accuracies


def test_compare_finds_the_first_difference_and_the_largest():
    replayed = _rows({(1, "reward/mean"): 0.5 + 1e-12, (2, "loss"): 0.375})
    verdict = compare(_rows(), SUMMARY, replayed, SUMMARY)
    assert verdict["status"] == DIFFERS
    assert verdict["first"] == {"step": 1, "metric": "reward/mean", "stored": 0.5, "replayed": 0.5 + 1e-12}
    assert verdict["max_abs_diff"] == {"value": 0.5, "step": 2, "metric": "loss"}


def test_compare_within_tolerance_and_beyond_it():
    close = _rows({(2, "loss"): -0.125 * (1 + 1e-6)})
    assert compare(_rows(), SUMMARY, close, SUMMARY)["status"] == WITHIN
    assert compare(_rows(), SUMMARY, _rows(), dict(SUMMARY, accuracy_after=0.5 + 1e-3))["status"] == DIFFERS
    missing = [r for r in _rows() if r["step"] == 1]  # a step the replay never reached is no rounding
    verdict = compare(_rows(), SUMMARY, missing, SUMMARY)
    assert verdict["status"] == DIFFERS and verdict["first"]["step"] == 2 and verdict["first"]["replayed"] is None
    nan = compare(_rows(), SUMMARY, _rows({(2, "kl"): math.nan}), SUMMARY)
    assert nan["status"] == DIFFERS and nan["max_abs_diff"]["value"] == math.inf


def test_a_cell_killed_by_a_signal_is_reported_so_not_by_its_last_progress_line(tmp_path):
    """A cell killed by the kernel (out of memory) had been reported as failed with its log's last line, a progress
    line ("9/256 steps, ..."), which reads as if the run itself had stopped there."""
    code = tmp_path / "code"
    (code / "benchmarks" / "matrix").mkdir(parents=True)
    (code / "benchmarks" / "__init__.py").write_text("")
    (code / "benchmarks" / "matrix" / "__init__.py").write_text("")
    (code / "benchmarks" / "matrix" / "cell.py").write_text(
        "import os, signal\nprint('addition/grpo seed 0: 9/256 steps, 45 s', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n")
    (tmp_path / "work").mkdir()
    run = run_spec({"settings": {}}, code, 1, tmp_path / "work")
    assert run["returncode"] == -9 and run["error"] == "killed by SIGKILL (out of memory?)"


def test_a_cell_dies_with_a_replay_that_is_killed(tmp_path):
    """A replay killed with SIGKILL (the kernel's out-of-memory killer) had left its cell's process running on, its
    output read by nobody."""
    import os
    import signal
    import sys
    import time

    code = tmp_path / "code"
    (code / "benchmarks" / "matrix").mkdir(parents=True)
    (code / "benchmarks" / "__init__.py").write_text("")
    (code / "benchmarks" / "matrix" / "__init__.py").write_text("")
    pid_file = tmp_path / "cell.pid"
    (code / "benchmarks" / "matrix" / "cell.py").write_text(
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(120)\n")
    (tmp_path / "work").mkdir()
    driver = subprocess.Popen([sys.executable, "-c", "import sys; from pathlib import Path; "
                               "from benchmarks.matrix.replay import run_spec; "
                               "run_spec({'settings': {}}, Path(sys.argv[1]), 1, Path(sys.argv[2]))",
                               str(code), str(tmp_path / "work")], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    deadline = time.time() + 120
    while not (pid_file.exists() and pid_file.read_text()) and time.time() < deadline:
        time.sleep(0.2)
    cell = int(pid_file.read_text())
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    for _ in range(50):  # the kernel delivers the parent-death signal at once; reaping may take a moment
        try:
            os.kill(cell, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(cell, signal.SIGKILL)
        pytest.fail("the cell's process outlived the replay that started it")


def test_the_bf16_instructions_are_a_change_only_where_both_sides_record_them():
    from benchmarks.matrix.replay import environment_changes, host

    amx = {"device_name": "Xeon (1 threads)", "cpu_bf16": "AMX-BF16, AVX512-BF16",
           "rounding": {"cpu_capability": "AVX512"}}
    avx = {**amx, "cpu_bf16": "AVX512-BF16"}
    old = {k: v for k, v in amx.items() if k != "cpu_bf16"}  # a cell recorded before the harness read them
    assert environment_changes(amx, avx) == ["bf16 instructions AMX-BF16, AVX512-BF16 -> AVX512-BF16"]
    assert environment_changes(old, avx) == []
    assert host(amx) == "Xeon (1 threads), AVX512, bf16 AMX-BF16, AVX512-BF16"
