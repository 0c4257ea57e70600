"""Executors are registered by name and their options are flags: the built-ins, an unknown name, a plug-in
through the ``grpo_bench.executors`` entry-point group; and the subprocess executor with cells side by side."""

import dataclasses
import json
import threading
from importlib import metadata

import pytest

from benchmarks.io import read_jsonl
from benchmarks.matrix import executors
from benchmarks.matrix.execute import CellJob, finish_cell, prepare_cell_dir
from benchmarks.matrix.executors import RegisteredExecutor
from tests.conftest import strip_timing

# Two cells of two GRPO steps (64 completions = 2 x 4 prompts x G 8) on one thread each.
TINY = """\
seeds = [0]
budget = 64
num_cpus = 1
device = "cpu"

[tasks.pizza]
eval_samples = 16

[algorithms.grpo]
level = ["token", "sequence"]
"""


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


# ------------------------------------------------------------------------------------------------
# The registry
# ------------------------------------------------------------------------------------------------


def test_the_registry_holds_the_built_in_executors_and_takes_the_old_keywords():
    assert {"local", "subprocess", "ray", "slurm"} <= set(executors.EXECUTORS)
    assert all(dataclasses.is_dataclass(cls.Options) for cls in executors.EXECUTORS.values())
    # Every keyword make_executor took before the registry still works; another executor's are ignored.
    old = {"jobs": 3, "ray_address": None, "slurm_partition": "gpu", "slurm_time": 5, "slurm_gpus_per_cell": 1.0,
           "slurm_cluster": "local"}
    assert executors.make_executor("local", **old).options.jobs == 3
    assert executors.make_executor("subprocess", **old).options.jobs == 3
    with pytest.raises(TypeError, match="no executor declares: job"):
        executors.make_executor("local", job=2)
    with pytest.raises(ValueError, match="executor name 'local' is taken by benchmarks.matrix.executors.LocalExecutor"):
        executors.register_executor(RecordingExecutor, name="local")
    executors.register_executor(executors.LocalExecutor)  # the same class again is a no-op


@pytest.mark.integration  # the Slurm executor needs submitit (the integrations extra)
def test_the_slurm_executor_takes_the_old_keywords():
    old = {"jobs": 3, "ray_address": None, "slurm_partition": "gpu", "slurm_time": 5, "slurm_gpus_per_cell": 1.0,
           "slurm_cluster": "local"}
    slurm = executors.make_executor("slurm", **old).options
    assert (slurm.slurm_partition, slurm.slurm_time, slurm.slurm_cluster) == ("gpu", 5, "local")


def test_an_unknown_executor_is_one_line(tiny, tmp_path, run_cli):
    code, _, err = run_cli("matrix", tiny, "--out", tmp_path / "out", "--executor", "nope")
    assert code == 2
    assert err.strip() == "grpo-bench: error: unknown executor 'nope'; choose from local, ray, slurm, subprocess"
    assert not (tmp_path / "out").exists()


@dataclasses.dataclass
class LabelOptions:
    label: str = dataclasses.field(default="none", metadata={"help": "a word the recording executor writes"})


class RecordingExecutor(RegisteredExecutor):
    """Records each cell as failed without running it, with its label."""

    name = "recording"
    Options = LabelOptions

    def run(self, jobs, on_done):
        for job in jobs:
            job = prepare_cell_dir(job)
            on_done(job, finish_cell(job, 1, 0.0, f"not run, label {self.options.label}"))


@pytest.fixture
def plugin_executor(monkeypatch):
    """RecordingExecutor as an installed package would declare it: an entry point of ``grpo_bench.executors``."""
    import benchmarks.plugins as plugins

    entry = metadata.EntryPoint("recording", f"{__name__}:RecordingExecutor", "grpo_bench.executors")
    monkeypatch.setattr(plugins.metadata, "entry_points", lambda group: [entry] if group == "grpo_bench.executors" else [])
    monkeypatch.setattr(executors, "EXECUTORS", dict(executors.EXECUTORS))  # the plug-in leaves with the test
    assert executors.load_executor_plugins() == ["grpo_bench.executors:recording"]


def test_a_plugin_executor_is_usable_by_name_and_its_option_is_a_flag(plugin_executor, tiny, tmp_path, run_cli, capsys):
    with pytest.raises(SystemExit):
        run_cli("matrix", "--help")
    assert "--label LABEL" in capsys.readouterr().out
    out = tmp_path / "out"
    code, text, err = run_cli("matrix", tiny, "--out", out, "--executor", "recording", "--label", "seen",
                              "--no-report", "--no-progress", "--allow-dirty")
    assert code == 1, err  # the cells it was handed are recorded as failed, by design
    assert text.count("FAILED: not run, label seen") == 2
    assert json.loads((out / "matrix.json").read_text())["sessions"][-1]["executor"] == "recording"


@pytest.mark.parametrize("executor_name, native, said", [("local", False, 1), ("subprocess", False, 1),
                                                         ("local", True, 0), ("ray", False, 0)])
def test_a_bf16_matrix_on_a_cpu_that_emulates_bf16_says_so_once(tmp_path, monkeypatch, capsys, executor_name, native,
                                                                  said):
    """Its cells would each say it in their own log; the one running the matrix hears it once, before they run.
    Not where the cells run elsewhere (ray, slurm): this machine's CPU says nothing of theirs."""
    from benchmarks.harness import measure
    from benchmarks.matrix import parse
    from benchmarks.matrix.execute import run_matrix

    path = tmp_path / "bf16.toml"
    path.write_text(TINY.replace('device = "cpu"\n', 'device = "cpu"\nprecision = "bf16"\n'))
    monkeypatch.setattr(measure, "cpu_bf16_native", lambda: native)
    executor = type("Here", (RecordingExecutor,), {"name": executor_name})()
    counts = run_matrix(parse(path), tmp_path / "out", executor=executor, progress=False, allow_dirty=True)
    assert counts["failed"] == 2  # both cells were handed over (and recorded as not run)
    assert capsys.readouterr().err.count("torch emulates bf16 products") == said


# ------------------------------------------------------------------------------------------------
# subprocess --jobs N
# ------------------------------------------------------------------------------------------------


def test_fresh_processes_side_by_side_each_get_their_share_of_the_cores(tmp_path, monkeypatch):
    from benchmarks.matrix import parse

    monkeypatch.setattr(executors, "cpu_count", lambda: 8)
    path = tmp_path / "no_num_cpus.toml"
    path.write_text(TINY.replace("num_cpus = 1\n", ""))
    plan = parse(path)
    jobs = [CellJob(c, tmp_path / c.relpath, resume=False) for c in plan.cells]
    both_running = threading.Barrier(2, timeout=30)
    threads = []

    def run_one(job):
        both_running.wait()  # returns only when the other cell is in flight too
        threads.append(job.threads)
        return {"status": "complete"}

    monkeypatch.setattr(executors.FreshProcessExecutor, "run_one", staticmethod(run_one))
    done = []
    executor = executors.make_executor("subprocess", jobs=2)
    executor.run(jobs, lambda job, summary: done.append(job.cell.relpath))
    assert threads == [4, 4] and executor.jobs == 2 and sorted(done) == sorted(c.relpath for c in plan.cells)

    def one_at_a_time(job):
        threads.append(job.threads)
        return {"status": "complete"}

    monkeypatch.setattr(executors.FreshProcessExecutor, "run_one", staticmethod(one_at_a_time))
    threads.clear()
    executors.make_executor("subprocess").run(jobs, lambda job, summary: None)
    assert threads == [0, 0]  # one at a time: the process's default threads, as the baseline always ran


@pytest.mark.slow  # two fresh processes side by side: about 20 s
def test_subprocess_jobs_2_writes_the_rows_of_jobs_1(tiny, tmp_path, run_cli):
    for jobs in ("1", "2"):
        code, _, err = run_cli("matrix", tiny, "--out", tmp_path / jobs, "--executor", "subprocess", "--jobs", jobs,
                               "--no-report", "--no-progress", "--allow-dirty")
        assert code == 0, err
    assert json.loads((tmp_path / "2" / "matrix.json").read_text())["sessions"][-1]["jobs"] == 2
    for cell in ("pizza/grpo_level=token/seed0", "pizza/grpo_level=sequence/seed0"):
        rows = [strip_timing(read_jsonl(tmp_path / jobs / cell / "metrics.jsonl")) for jobs in ("1", "2")]
        assert rows[0] and rows[0] == rows[1], cell
