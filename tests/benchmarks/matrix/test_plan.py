"""grpo-bench matrix and report: validation with line numbers, atomic files, SIGKILL then --resume, failures, partial reports."""

import math
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from benchmarks.cli.main import main
from benchmarks.errors import UsageError
from benchmarks.io import atomic_write, atomic_write_json, append_jsonl, read_jsonl
from benchmarks.matrix import line_of, parse
from benchmarks.store import ResultStore
from tests.conftest import ROOT


GOOD = """\
seeds = [0]
budget = 64

[tasks.pizza]
eval_samples = 16

[algorithms.grpo]
level = ["token", "sequence"]
"""


def _env():
    # the task models' cache the rest of the suite (and the main job) fills: built once per machine
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))


def _matrix(args, **kw):
    return subprocess.Popen([sys.executable, "-m", "benchmarks.cli.main", "matrix", *args, "--no-progress",
                             "--allow-dirty"], cwd=ROOT,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


# ------------------------------------------------------------------------------------------------
# Validation: one line naming the key and its line, exit 2, nothing run
# ------------------------------------------------------------------------------------------------


def test_order_seed_runs_each_seeds_variants_in_turn_tuning_and_chosen_cells_too(tmp_path):
    """``order = "seed"``: the cells of a seed side by side (a cost ratio's two cells run at the same time of the
    session), each task's in turn, the variants in the file's order; the default keeps each variant's seeds
    together. With [tuning] the tuning cells and the chosen evaluation cells follow the same order."""
    two_tasks = GOOD.replace("seeds = [0]", "seeds = [0, 1]") + "\n[tasks.bandit]\n[algorithms.rloo]\n"
    path = tmp_path / "m.toml"
    path.write_text(two_tasks)
    assert [c.relpath for c in parse(path).cells][:3] == [
        "pizza/grpo_level=token/seed0", "pizza/grpo_level=token/seed1", "pizza/grpo_level=sequence/seed0"]
    path.write_text('order = "seed"\n' + two_tasks)
    assert [(c.task_label, c.variant, c.seed) for c in parse(path).cells] == [
        (task, variant, seed) for task in ("pizza", "bandit") for seed in (0, 1)
        for variant in ("grpo(level=token)", "grpo(level=sequence)", "rloo")]
    path.write_text('order = "seed"\n' + two_tasks.replace('level = ["token", "sequence"]', "")
                    + "\n[tuning]\nseeds = [10, 11]\nlearning_rate = [1e-5, 1e-3]\n")
    plan = parse(path)
    assert [(c.task_label, c.seed, c.variant) for c in plan.tuning_cells()][:4] == [
        ("pizza", 10, "grpo"), ("pizza", 10, "grpo"), ("pizza", 10, "rloo"), ("pizza", 10, "rloo")]
    chosen = plan.choose([1, 0, 0, 1])  # per tuning group (task x variant) its grid point
    assert [(c.task_label, c.seed, c.variant) for c in chosen.cells] == [
        (task, seed, variant) for task in ("pizza", "bandit") for seed in (0, 1) for variant in ("grpo", "rloo")]
    assert [c.algo_options["learning_rate"] for c in chosen.cells[:2]] == [1e-3, 1e-5]


@pytest.mark.parametrize("text, line, words", [
    ("bogus = 1\n" + GOOD, 1, ["unknown key 'bogus'"]),
    (GOOD.replace("[tasks.pizza]", "[tasks.pizzza]"), 4, ["unknown task 'pizzza'"]),
    (GOOD + "\n[algorithms.grpoo]\nmu = 2\n", 10, ["unknown algorithm 'grpoo'"]),
    (GOOD + "\n[algorithms.gspo]\nalgo = \"sgd\"\n", 11, ["unknown algorithm 'sgd'"]),
    (GOOD + "ppo_epochs = 4\n", 9, ["'ppo_epochs' is not an option of grpo"]),
    (GOOD + "group_size = [8, 1]\n", 9, ["impossible variant grpo(level=token,group_size=1)", "group_size must be >= 2"]),
    (GOOD + "mu = 0\n", 9, ["impossible variant", "mu must be >= 1"]),
    (GOOD + "mu = 1.5\n", 9, ["mu of grpo must be int"]),
    (GOOD.replace("eval_samples = 16", "eval_samples = 16\ntemperature = 2"), 6, ["unknown option 'temperature' of task pizza"]),
    (GOOD.replace("eval_samples = 16", "reward_mode = \"dense\""), 5, ["task pizza has no reward mode 'dense'"]),
    (GOOD.replace("budget = 64", "budget = 16"), 2, ["budget 16 completions is less than one step", "32 completions per step"]),
    (GOOD.replace("seeds = [0]", "seeds = [0, 0]"), 1, ["seeds has duplicates"]),
    ('order = "seeds"\n' + GOOD, 1, ["order must be variant or seed, got 'seeds'"]),
    (GOOD + "\n[tasks.pizza.algorithms.ppo]\nepochs = 2\n", 10, ["no [algorithms.ppo] table"]),
    (GOOD + "\n[tasks.pizza.algorithms.grpo]\nepochs = 2\n", 11, ["'epochs' is not an option of grpo"]),
    (GOOD + "\n[tasks.pizza.algorithms.grpo]\nmu = [1, 2]\n", 11, ["mu of grpo on pizza must be one int"]),
    (GOOD + "\n[tasks.pizza.algorithms.grpo]\nmu = 0\n", 11, ["impossible variant", "mu must be >= 1"]),
    (GOOD.replace("[tasks.pizza]", "[tasks.short]\ntask = \"pizzza\""), 5, ["unknown task 'pizzza'"]),
])
def test_bad_matrix_file_is_one_line_naming_the_key_and_line(tmp_path, capsys, text, line, words):
    path = tmp_path / "m.toml"
    path.write_text(text)
    assert main(["matrix", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"grpo-bench: error: {path}:{line}: "), err
    for w in words:
        assert w in err
    assert not (tmp_path / "out").exists()  # rejected before anything ran


def test_invalid_toml_and_missing_file(tmp_path, capsys):
    path = tmp_path / "m.toml"
    path.write_text("seeds = [0\n")
    assert main(["matrix", str(path), "--out", str(tmp_path / "o")]) == 2
    assert "invalid TOML" in capsys.readouterr().err
    assert main(["matrix", str(tmp_path / "nope.toml"), "--out", str(tmp_path / "o")]) == 2
    assert "no such matrix file" in capsys.readouterr().err


def test_line_of_handles_quoted_and_dotted_keys():
    text = '# c\nseeds = [0]\n[tasks."pizza"]  # comment\n  eval_samples = 3\n[algorithms]\ngrpo.mu = 2\n'
    assert line_of(text, ("tasks", "pizza")) == 3
    assert line_of(text, ("tasks", "pizza"), "eval_samples") == 4
    assert line_of(text, ("algorithms", "grpo"), "mu") == 6
    assert line_of(text, (), "seeds") == 2
    assert line_of(text + "inline = { mu = 0 }\n", ("algorithms", "inline"), "mu") == 7


def test_expansion_and_equal_sample_budgets(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(GOOD.replace("budget = 64", "budget = 200").replace("seeds = [0]", "seeds = [3, 4]")
                    + "mu = [1, 2]\n[algorithms.small]\nalgo = \"grpo\"\ngroup_size = 2\n")
    plan = parse(path)
    variants = sorted({c.variant for c in plan.cells})
    assert variants == ["grpo(level=sequence,mu=1)", "grpo(level=sequence,mu=2)", "grpo(level=token,mu=1)",
                        "grpo(level=token,mu=2)", "small"]
    assert len(plan.cells) == 10 and {c.seed for c in plan.cells} == {3, 4}
    steps = {c.variant: (c.steps, c.completions_per_step) for c in plan.cells}
    assert steps["grpo(level=token,mu=2)"] == (6, 32)  # 200 // (4 prompts x G 8); mu does not buy samples
    assert steps["small"] == (25, 8)  # 200 // (4 x 2)


def test_an_algorithm_option_set_on_one_task_changes_that_task_only(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(GOOD.replace("[tasks.pizza]", "[tasks.bandit]\n[tasks.pizza]")
                    + "\n[tasks.bandit.algorithms.grpo]\noverlong_buffer_len = 0\n"
                    + "\n[algorithms.dapo]\nalgo = \"grpo\"\noverlong_buffer_len = 4\n"
                    + "\n[tasks.bandit.algorithms.dapo]\noverlong_buffer_len = 0\n")
    plan = parse(path)
    buffers = {(c.task, c.variant): c.settings["overlong_buffer_len"] for c in plan.cells}
    assert buffers == {("bandit", "grpo(level=token)"): 0, ("bandit", "grpo(level=sequence)"): 0, ("bandit", "dapo"): 0,
                       ("pizza", "grpo(level=token)"): 0, ("pizza", "grpo(level=sequence)"): 0, ("pizza", "dapo"): 4}
    assert {c.variant for c in plan.cells if c.task == "bandit"} == {c.variant for c in plan.cells if c.task == "pizza"}


def test_one_task_under_two_names_with_its_own_settings_each(tmp_path):
    # [tasks.NAME] task = "registered" (as algo = for [algorithms.NAME]): two settings of one task, each named
    path = tmp_path / "m.toml"
    path.write_text(GOOD.replace("[tasks.pizza]\neval_samples = 16",
                                 "[tasks.few]\ntask = \"pizza\"\neval_samples = 16\n"
                                 "[tasks.many]\ntask = \"pizza\"\neval_samples = 32\n"
                                 "[tasks.many.algorithms.grpo]\nepsilon = 0.1\n"))
    plan = parse(path)
    by_label = {}
    for c in plan.cells:
        by_label.setdefault(c.task_label, set()).add((c.task, c.task_options["eval_samples"], c.settings["epsilon"]))
    assert by_label == {"few": {("pizza", 16, 0.2)}, "many": {("pizza", 32, 0.1)}}
    assert {c.relpath.split("/")[0] for c in plan.cells} == {"few", "many"}


# ------------------------------------------------------------------------------------------------
# Atomic files
# ------------------------------------------------------------------------------------------------


def test_atomic_write_keeps_the_old_file_when_the_writer_dies(tmp_path):
    path = tmp_path / "summary.json"
    atomic_write_json(path, {"status": "complete", "x": 1})

    def half_then_crash(tmp):
        tmp.write_text('{"status": "comp')
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        atomic_write(path, half_then_crash)
    assert json.loads(path.read_text()) == {"status": "complete", "x": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]  # no temporary left behind


def test_jsonl_reader_drops_a_line_cut_short(tmp_path):
    path = tmp_path / "metrics.jsonl"
    append_jsonl(path, {"step": 1})
    append_jsonl(path, {"step": 2})
    with open(path, "a") as f:
        f.write('{"step": 3, "los')
    assert read_jsonl(path) == [{"step": 1}, {"step": 2}]


# ------------------------------------------------------------------------------------------------
# SIGKILL mid-cell, then --resume
# ------------------------------------------------------------------------------------------------

RESUMABLE = """\
seeds = [0, 1]
budget = 640             # 20 GRPO steps
checkpoint_every = 160   # every 5 steps
device = "cpu"

[tasks.pizza]
eval_samples = 16

[algorithms.grpo]
"""


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    path, out = tmp / "m.toml", tmp / "out"
    path.write_text(RESUMABLE)
    first, second = out / "pizza/grpo/seed0", out / "pizza/grpo/seed1"
    proc = _matrix([str(path), "--out", str(out), "--jobs", "1", "--no-report"])  # one cell after the other: seed0 ends first
    deadline = time.time() + 120
    while time.time() < deadline and len(read_jsonl(second / "metrics.jsonl")) < 7:  # past the step-5 checkpoint
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_rows = len(read_jsonl(second / "metrics.jsonl"))
    time.sleep(1.5)  # a cell that outlived its matrix would finish and write its summary now
    info = {
        "out": out, "first": first, "second": second, "killed_rows": killed_rows,
        "orphan_summary": (second / "summary.json").exists(),
        "first_summary": (first / "summary.json").read_text(),
        "first_mtime": (first / "summary.json").stat().st_mtime_ns,
        "checkpoints_at_kill": sorted(p.name for p in (second / "checkpoints").glob("*.pt")),
    }
    resumed = _matrix([str(path), "--out", str(out), "--resume", "--jobs", "1", "--no-report"])
    info["resume_output"], _ = resumed.communicate(timeout=180)
    info["resume_rc"] = resumed.returncode
    return info


@pytest.mark.slow  # a matrix killed mid-cell and resumed: about 30 s of the fast tier's 300
def test_sigkill_mid_cell_then_resume_skips_finished_cells_and_completes(killed_and_resumed):
    r = killed_and_resumed
    assert 7 <= r["killed_rows"] < 20, "the kill must land mid-cell"
    assert not r["orphan_summary"], "the cell process must die with its matrix"
    assert r["checkpoints_at_kill"], "the test means to exercise resuming from a checkpoint"
    assert r["resume_rc"] == 0, r["resume_output"]
    assert "[1/2] pizza grpo seed 0: complete, skipped" in r["resume_output"]
    # The finished cell was not re-run: its summary is byte-for-byte the one written before the kill.
    assert (r["first"] / "summary.json").read_text() == r["first_summary"]
    assert (r["first"] / "summary.json").stat().st_mtime_ns == r["first_mtime"]
    # The killed cell is complete and counted once: every step exactly once, as many samples as the budget.
    summary = json.loads((r["second"] / "summary.json").read_text())
    rows = read_jsonl(r["second"] / "metrics.jsonl")
    assert summary["status"] == "complete" and summary["steps"] == 20
    assert [row["step"] for row in rows] == list(range(1, 21))
    assert summary["completions_generated"] == 640
    meta = json.loads((r["out"] / "matrix.json").read_text())
    # The killed session last recorded its first cell; the resumed one ran one cell and skipped one.
    assert [(s["cells_run"], s["cells_skipped"]) for s in meta["sessions"]] == [(1, 0), (1, 1)]


@pytest.mark.slow  # shares the killed matrix above
def test_report_on_a_partial_directory_names_what_is_missing(killed_and_resumed, tmp_path, capsys):
    out = tmp_path / "results" / "cpu"
    shutil.copytree(killed_and_resumed["out"], out)
    meta = json.loads((out / "matrix.json").read_text())
    store = ResultStore.open(out)
    store.put("pizza/grpo/seed1", store.spec("pizza/grpo/seed1"), {"status": "failed", "error": "out of memory (boom)"}, [])
    for cell in meta["cells"]:
        shutil.rmtree(out / cell["dir"])  # the report reads the store alone, never a cell's folder
    meta["cells"].append({**meta["cells"][0], "seed": 9, "dir": "pizza/grpo/seed9"})
    atomic_write_json(out / "matrix.json", meta)
    assert main(["report", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "3 cells: 1 complete, 1 failed, 1 missing" in printed
    assert "failed: pizza grpo seed 1: out of memory (boom)" in printed and "missing: pizza grpo seed 9" in printed
    readme = (out / "README.md").read_text()
    assert "| pizza | grpo | 1/3 (1 failed) | 20 = 640 |" in readme
    assert "out of memory (boom)" in readme and "pizza grpo seed 9 (missing)" in readme
    assert (out / "plots" / "reward_vs_samples.png").stat().st_size > 1000
    # Under results/: results/README.md gets a section whose link points into results/cpu/.
    section = (tmp_path / "results" / "README.md").read_text()
    assert "<!-- grpo-bench:matrix-cpu -->" in section and "](cpu/README.md)" in section
    import pandas as pd

    cells = pd.read_csv(out / "tables" / "cells.csv")
    done = cells[cells["status"] == "complete"].iloc[0]
    assert done["peak_memory_bytes"] > 0 and done["wall_clock_s"] > 0 and done["param_bytes"] > 0
    evals = pd.read_csv(out / "tables" / "evals.csv")
    assert list(evals["phase"]) == ["before", "after"] and list(evals["samples"]) == [0, 640]  # eval_every 0


def test_report_on_an_empty_directory_is_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "nothing to report" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "absent")]) == 2


FAKE_CELLS = {
    # What a cell's process may do, played by a one-line child instead of a real run (fast).
    0: "import sys; print('RuntimeError: CUDA out of memory. Tried to allocate 2 GiB', file=sys.stderr); sys.exit(1)",
    1: "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
    2: ("import json, sys; open(sys.argv[1] + '/summary.json', 'w').write(json.dumps({'status': 'complete', 'steps': 2, "
        "'accuracy_before': 0.1, 'accuracy_after': 0.9, 'reward_before': 0.4, 'reward_after': 3.6, "
        "'completions_generated': 64, 'wall_clock_s': 1.0, 'peak_memory_bytes': 2**20}))"),
}


def test_failing_cells_are_recorded_and_the_matrix_goes_on(tmp_path, monkeypatch, capsys):
    from benchmarks.matrix import execute

    path = tmp_path / "m.toml"
    path.write_text(GOOD.replace("seeds = [0]", "seeds = [0, 1, 2]").replace('level = ["token", "sequence"]', ""))
    plan = parse(path)
    seeds = {str(tmp_path / "out" / c.relpath): c.seed for c in plan.cells}
    monkeypatch.setattr(execute, "cell_command", lambda cell_dir, resume: [sys.executable, "-c", FAKE_CELLS[seeds[str(cell_dir)]], str(cell_dir)])
    counts = execute.run_matrix(plan, tmp_path / "out", progress=False, allow_dirty=True)
    assert counts == {"complete": 1, "failed": 2, "skipped": 0}
    summaries = [json.loads((tmp_path / "out" / c.relpath / "summary.json").read_text()) for c in plan.cells]
    assert [s["status"] for s in summaries] == ["failed", "failed", "complete"]
    assert summaries[0]["error"] == "RuntimeError: CUDA out of memory. Tried to allocate 2 GiB" and summaries[0]["returncode"] == 1
    assert summaries[1]["error"] == "killed by SIGKILL (out of memory?)" and summaries[1]["returncode"] == -9
    assert summaries[2]["process_wall_clock_s"] > 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "[1/3] pizza grpo seed 0: FAILED: RuntimeError: CUDA out of memory. Tried to allocate 2 GiB"
    assert lines[2].startswith("[3/3] pizza grpo seed 2: accuracy 0.100 -> 0.900")
    # --resume re-runs the failed cells only.
    monkeypatch.setitem(FAKE_CELLS, 0, FAKE_CELLS[2])
    counts = execute.run_matrix(plan, tmp_path / "out", resume=True, progress=False, allow_dirty=True)
    assert counts == {"complete": 1, "failed": 1, "skipped": 1}


def test_verdicts_matrix_is_every_algorithm_on_every_toy_task_at_equal_samples():
    from algorithms import ALGORITHMS
    from tasks import TASKS

    needed = {"reinforce", "ppo", "dpo", "grpo", "rloo", "reinforce_pp"} - set(ALGORITHMS), {"pizza", "bandit", "addition"} - set(TASKS)
    if any(needed):
        pytest.skip(f"not registered yet: {sorted(needed[0] | needed[1])}")
    plan = parse(ROOT / "benchmarks" / "matrices" / "verdicts.toml")
    assert len(plan.cells) == 4 * 13 * 5  # (pizza, bandit rm, bandit verifiable, addition) x 13 variants x 5 seeds
    assert {c.algo for c in plan.cells} == {"reinforce", "ppo", "dpo", "grpo", "rloo", "reinforce_pp"}
    assert {c.task_label for c in plan.cells} == {"pizza", "bandit(reward_mode=rm)", "bandit(reward_mode=verifiable)", "addition"}
    for cell in plan.cells:
        assert cell.steps * cell.completions_per_step == cell.budget, cell.name


def test_default_matrix_is_a_demonstration_of_every_variant_on_every_task():
    """The newcomer's main job covers what the science matrix covers, with 3 seeds and smaller budgets."""
    demo = parse(ROOT / "benchmarks" / "matrices" / "default.toml")
    science = parse(ROOT / "benchmarks" / "matrices" / "verdicts.toml")
    assert {(c.task_label, c.variant) for c in demo.cells} == {(c.task_label, c.variant) for c in science.cells}
    assert {c.seed for c in demo.cells} == {0, 1, 2} and len(demo.cells) == 4 * 13 * 3
    assert all(c.budget < s.budget for c in demo.cells for s in science.cells if (s.task_label, s.variant) == (c.task_label, c.variant))
    assert "demonstration" in demo.description


TWO_TASKS = GOOD.replace('level = ["token", "sequence"]', "") + "\n[tasks.bandit]\n"


def test_tasks_runs_a_subset_now_and_resume_the_rest_later(tmp_path, monkeypatch):
    from benchmarks.matrix import execute

    path = tmp_path / "m.toml"
    path.write_text(TWO_TASKS)
    plan = parse(path)
    monkeypatch.setattr(execute, "cell_command", lambda cell_dir, resume: [sys.executable, "-c", FAKE_CELLS[2], str(cell_dir)])
    out = tmp_path / "out"
    counts = execute.run_matrix(plan, out, progress=False, tasks=["bandit"], allow_dirty=True)
    assert counts == {"complete": 1, "failed": 0, "skipped": 0}
    store = ResultStore.open(out)
    assert sorted(store.cells) == ["bandit/grpo/seed0"]
    assert [c["dir"] for c in json.loads((out / "matrix.json").read_text())["cells"]] == ["pizza/grpo/seed0", "bandit/grpo/seed0"]
    # the other task later: the first one's cell is kept, not run again
    assert execute.run_matrix(plan, out, resume=True,
                              progress=False, allow_dirty=True) == {"complete": 1, "failed": 0, "skipped": 1}
    assert sorted(ResultStore.open(out).cells) == ["bandit/grpo/seed0", "pizza/grpo/seed0"]
    # --overwrite --tasks runs that task again and keeps the other's finished cell
    counts = execute.run_matrix(plan, out, overwrite=True, progress=False, tasks=["pizza"], allow_dirty=True)
    assert counts == {"complete": 1, "failed": 0, "skipped": 0}
    assert sorted(ResultStore.open(out).cells) == ["bandit/grpo/seed0", "pizza/grpo/seed0"]


def test_rerun_runs_the_named_cells_again_and_keeps_the_rest(tmp_path, monkeypatch, capsys):
    from benchmarks.matrix import execute

    path = tmp_path / "m.toml"
    path.write_text(TWO_TASKS)
    plan = parse(path)
    ran = tmp_path / "ran.txt"  # each cell process appends its directory: who actually ran
    child = FAKE_CELLS[2] + f"; open({str(ran)!r}, 'a').write(sys.argv[1] + chr(10))"
    monkeypatch.setattr(execute, "cell_command", lambda cell_dir, resume: [sys.executable, "-c", child, str(cell_dir)])
    out = tmp_path / "out"
    assert execute.run_matrix(plan, out, progress=False, allow_dirty=True)["complete"] == 2
    (out / "pizza/grpo/seed0/stale.txt").write_text("from the first run")
    ran.write_text("")
    counts = execute.run_matrix(plan, out, resume=True, progress=False, rerun=["pizza/*"], allow_dirty=True)
    assert counts == {"complete": 1, "failed": 0, "skipped": 1}
    assert [Path(p).relative_to(out).as_posix() for p in ran.read_text().split()] == ["pizza/grpo/seed0"]
    assert not (out / "pizza/grpo/seed0/stale.txt").exists()  # run from step 0 in a cleared directory
    assert sorted(ResultStore.open(out).cells) == ["bandit/grpo/seed0", "pizza/grpo/seed0"]
    # asked wrongly: one line, exit status 2
    assert main(["matrix", str(path), "--out", str(out), "--rerun", "pizza/*"]) == 2
    assert "--rerun goes with --resume" in capsys.readouterr().err
    assert main(["matrix", str(path), "--out", str(out), "--resume", "--rerun", "tune/*"]) == 2
    err = capsys.readouterr().err
    assert "--rerun 'tune/*' matches no cell of m" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("tasks, message", [
    ("addition", "--tasks: addition is not a task of m (its tasks: bandit, pizza)"),
    (",", "--tasks names no task (the tasks of m: bandit, pizza)"),
])
def test_tasks_that_the_matrix_lacks_are_one_line(tmp_path, capsys, tasks, message):
    path = tmp_path / "m.toml"
    path.write_text(TWO_TASKS)
    assert main(["matrix", str(path), "--out", str(tmp_path / "out"), "--tasks", tasks]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_checkpointing_added_later_keeps_the_finished_cells(tmp_path, monkeypatch):
    """How often a cell checkpoints is not the experiment: a matrix that starts checkpointing (a long cell that
    must survive the end of a session) keeps its finished cells and resumes the rest."""
    from benchmarks.matrix import execute

    path = tmp_path / "m.toml"
    path.write_text(TWO_TASKS)
    monkeypatch.setattr(execute, "cell_command", lambda cell_dir, resume: [sys.executable, "-c", FAKE_CELLS[2], str(cell_dir)])
    out = tmp_path / "out"
    assert execute.run_matrix(parse(path), out, progress=False, tasks=["pizza"], allow_dirty=True)["complete"] == 1
    path.write_text(TWO_TASKS.replace("budget = 64", "budget = 64\ncheckpoint_every = 32"))
    later = parse(path)
    assert later.cells[0].checkpoint_every > 0
    assert execute.run_matrix(later, out, resume=True,
                              progress=False, allow_dirty=True) == {"complete": 1, "failed": 0, "skipped": 1}
    from benchmarks.report.matrix import collect  # the report counts the cell that ran without checkpoints too

    assert sorted(collect(out)["cells"]["status"]) == ["complete", "complete"]
    # ...but a change to what a cell computes still makes its stored result stale: replaced when asked to
    path.write_text(TWO_TASKS.replace("budget = 64", "budget = 64\ncheckpoint_every = 32").replace("eval_samples = 16", "eval_samples = 32"))
    with pytest.raises(UsageError, match="would replace 1 finished cell"):
        execute.run_matrix(parse(path), out, resume=True, progress=False, allow_dirty=True)
    assert execute.run_matrix(parse(path), out, resume=True, overwrite=True, progress=False,
                              allow_dirty=True) == {"complete": 1, "failed": 0, "skipped": 1}


def test_a_finished_cell_keeps_no_checkpoints(tmp_path, monkeypatch):
    """A finished cell is stored and never resumed: its checkpoints (gigabytes on a 135M model) are removed;
    an unfinished one keeps them for --resume."""
    from benchmarks.matrix import execute

    path = tmp_path / "m.toml"
    path.write_text(TWO_TASKS)
    plan = parse(path)
    fakes = {"pizza": FAKE_CELLS[2], "bandit": FAKE_CELLS[0]}  # pizza finishes, bandit fails

    def command(cell_dir, resume):
        (Path(cell_dir) / "checkpoints").mkdir(exist_ok=True)
        (Path(cell_dir) / "checkpoints" / "step_0000001.pt").write_bytes(b"state")
        return [sys.executable, "-c", fakes[Path(cell_dir).parts[-3]], str(cell_dir)]

    monkeypatch.setattr(execute, "cell_command", command)
    assert execute.run_matrix(plan, tmp_path / "out",
                              progress=False, allow_dirty=True) == {"complete": 1, "failed": 1, "skipped": 0}
    assert not list((tmp_path / "out" / "pizza/grpo/seed0/checkpoints").glob("*.pt"))
    assert (tmp_path / "out" / "bandit/grpo/seed0/checkpoints/step_0000001.pt").exists()


def test_a_resumed_cell_counts_the_process_time_of_every_attempt(tmp_path, capsys):
    """Training time continues from the checkpoint, so the process time must add the killed attempt's too:
    start-up + evaluation (process minus training) is then never negative."""
    from benchmarks.matrix.execute import CellJob, cell_line, finish_cell, prepare_cell_dir
    from benchmarks.report.matrix import phase_markdown

    path = tmp_path / "m.toml"
    path.write_text(GOOD.replace('level = ["token", "sequence"]', ""))
    cell = parse(path).cells[0]
    job = prepare_cell_dir(CellJob(cell, tmp_path / "cell", resume=False))
    killed = finish_cell(job, -9, 300.0)
    assert killed["status"] == "failed" and killed["process_wall_clock_s"] == 300.0 and killed["attempts"] == 1
    job = prepare_cell_dir(CellJob(cell, tmp_path / "cell", resume=True))
    (job.cell_dir / "summary.json").write_text(json.dumps({  # the resumed run: 250 s of training in all
        "status": "complete", "steps": 2, "accuracy_before": 0.1, "accuracy_after": 0.9, "reward_before": 0.4,
        "reward_after": 3.6, "completions_generated": 64, "wall_clock_s": 250.0, "peak_memory_bytes": 2**20}))
    done = finish_cell(job, 0, 100.0)
    assert done["process_wall_clock_s"] == 400.0 and done["attempts"] == 2
    assert "250.0 s training (400.0 s in 2 attempts)" in cell_line(1, 1, cell, done)
    # a fresh (not resumed) run of the cell starts counting again
    job = prepare_cell_dir(CellJob(cell, tmp_path / "cell", resume=False))
    assert finish_cell(job, 1, 7.0)["process_wall_clock_s"] == 7.0
    # A cell whose earlier processes went unrecorded (its driver was stopped): unknown, not negative
    cells = pd.DataFrame([{"task": "pizza", "variant": "grpo", "status": "complete", "wall_clock_s": 250.0,
                           "process_wall_clock_s": 100.0},
                          {"task": "pizza", "variant": "grpo", "status": "complete", "wall_clock_s": 10.0,
                           "process_wall_clock_s": 14.0},
                          {"task": "bandit", "variant": "grpo", "status": "complete", "wall_clock_s": 250.0,
                           "process_wall_clock_s": 100.0}])
    table = phase_markdown(cells)
    assert "| pizza | grpo | 0.00 | 0.00 | 0.00 | 0.00 | 130.00 | - | 4.00 | 134.00 | - | 1.00 |" in table
    assert "| bandit | grpo | 0.00 | 0.00 | 0.00 | 0.00 | 250.00 | - | - | - | - | - |" in table
    # Evaluation apart from start-up, the cell in all, its threads, and the ratio to the task's first variant
    cells = pd.DataFrame([{"task": "t", "variant": v, "status": "complete", "wall_clock_s": w, "eval_s": e,
                           "process_wall_clock_s": p, "threads": 1, "time_generate_s": g, "time_update_s": w - g}
                          for v, w, e, p, g in [("grpo", 100.0, 20.0, 125.0, 40.0), ("ppo", 300.0, 20.0, 325.0, 60.0),
                                                ("ppo", 310.0, 30.0, 345.0, 70.0)]])
    table = phase_markdown(cells)
    assert "| t | grpo | 40.00 | 0.00 | 0.00 | 60.00 | 100.00 | 20.00 | 5.00 | 125.00 | 1 | 1.00 |" in table
    assert "| t | ppo | 65.00 | 0.00 | 0.00 | 240.00 | 305.00 | 25.00 | 5.00 | 335.00 | 1 | 2.68 |" in table
    assert "critic" not in table  # no cell timed a critic: no column for one
    # PPO's critic, timed inside its update, is shown as the update's part; the variant without one reads "-"
    cells.loc[cells["variant"] == "ppo", "time_critic_s"] = [100.0, 120.0]
    table = phase_markdown(cells)
    assert "| update | of the update, the critic | training total |" in table
    assert "| t | grpo | 40.00 | 0.00 | 0.00 | 60.00 | - | 100.00 | 20.00 | 5.00 | 125.00 | 1 | 1.00 |" in table
    assert "| t | ppo | 65.00 | 0.00 | 0.00 | 240.00 | 110.00 | 305.00 | 25.00 | 5.00 | 335.00 | 1 | 2.68 |" in table
    assert "CPU" not in table  # no cell recorded its CPU seconds: no column for them
    # Cells that recorded their steps' CPU seconds: a column after training's wall clock, "-" where one did not
    cells["training_cpu_s"] = [90.0, 200.0, math.nan]
    table = phase_markdown(cells)
    assert "| training total | training CPU s | evaluation |" in table
    assert "| t | ppo | 65.00 | 0.00 | 0.00 | 240.00 | 110.00 | 305.00 | 200.00 | 25.00 | 5.00 | 335.00 | 1 | 2.68 |" in table


def test_the_report_says_when_dpo_built_its_pairs_outside_the_budget():
    from benchmarks.report.matrix import pair_sample_lines

    budgets = pd.DataFrame({"task": ["t"], "budget": [320]})
    rows = [{"task": "t", "variant": v, "seed": s, "step": step, "completions": 8.0 + (extra if step == 1 else 0),
             "pairs/samples": 96.0} for v, extra in (("dpo", 0.0), ("dpo_counted", 96.0)) for s in (0, 1)
            for step in (1, 2, 3)]
    rows.append({"task": "t", "variant": "grpo", "seed": 0, "step": 1, "completions": 32.0})
    lines = pair_sample_lines(pd.DataFrame(rows), budgets)
    assert len(lines) == 2
    assert lines[0].startswith("`dpo` on t built its preference pairs from 96 samples") and "not counted" in lines[0]
    assert "30% more generated completions than the budget of 320" in lines[0]
    assert "`dpo_counted`" in lines[1] and "counted against the budget (count_pair_samples)" in lines[1]
    assert pair_sample_lines(pd.DataFrame(rows[-1:]), budgets) == []
