"""Matrix executors: the same cell gives the same metrics under subprocess, local (warm workers), ray and slurm
(submitit's local cluster); SIGKILL to the driver then --resume loses and repeats no finished cell; SIGKILL
to a Ray worker retries the cell; a missing extra is one line; per-cell and per-session timing.

The fast tier keeps one case of each behaviour: the warm local worker against the fresh process, and the
local driver killed and resumed. The other executors (ray, slurm, two local workers) and the Ray kills are
``slow`` (``pytest tests -m slow``); the Ray tests that do not kill their driver share one Ray instance."""

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from benchmarks.io import read_jsonl
from tests.conftest import ROOT, strip_timing


# Two different cells on one thread each: a warm worker with --jobs 1 runs the second after the first.
SMALL = """\
seeds = [0]
budget = 64
num_cpus = 1
device = "cpu"

[tasks.pizza]
eval_samples = 16

[algorithms.grpo]
[algorithms.reinforce]
"""
CELLS = ("pizza/grpo/seed0", "pizza/reinforce/seed0")


def _env():
    # The task models' cache is the one the rest of the suite (and the README's main job) fills: ~/.cache/grpo-bench
    # unless $GRPO_BENCH_CACHE says otherwise.
    return dict(os.environ, PYTHONPATH=str(ROOT))


def _matrix(args, **kw):
    # --no-report: the report (tables, plots, verdicts) is tested elsewhere; here only the cells matter.
    return subprocess.Popen([sys.executable, "-m", "benchmarks.cli.main", "matrix", *map(str, args), "--no-progress",
                             "--no-report", "--allow-dirty"],
                            cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def _run_matrix(args, timeout=400):
    proc = _matrix(args)
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    return out


def _run_matrix_here(args) -> str:
    """`grpo-bench matrix` with this process as the driver, for a driver that is not killed: its cells still run
    in their own processes (fresh, warm workers), and no second process imports torch and transformers to drive them."""
    from benchmarks.cli.main import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = main(["matrix", *map(str, args), "--no-progress", "--no-report", "--allow-dirty"])
    assert code == 0, printed.getvalue()
    return printed.getvalue()


def _rows(cell_dir: Path):
    return strip_timing(read_jsonl(cell_dir / "metrics.jsonl"))


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """The small matrix under the fresh-process-per-cell executor."""
    tmp = tmp_path_factory.mktemp("baseline")
    (tmp / "m.toml").write_text(SMALL)
    _run_matrix_here([tmp / "m.toml", "--out", tmp / "out", "--executor", "subprocess"])
    return tmp / "m.toml", tmp / "out"


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray instance, started by this process and shared by the Ray tests that do not kill their driver
    (a killed driver takes the instance it started with it, so that test starts its own, as a user's run does).
    A matrix driven from this process uses it as it is; a driver in another process joins it with --ray-address
    (yielded). Its workers inherit this process's environment, with the checkout on PYTHONPATH."""
    ray = pytest.importorskip("ray")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


EXECUTOR_ARGS = {
    "local-jobs1": ["--executor", "local", "--jobs", "1"],  # warm: the second cell runs after the first in one worker
    "local-jobs2": ["--executor", "local", "--jobs", "2"],
    "ray": ["--executor", "ray"],  # driven from this process, on the shared instance (ray_cluster)
    "slurm-local": ["--executor", "slurm", "--slurm-cluster", "local"],
}
# The fast tier keeps the warm worker against the fresh process; the other executors run under -m slow.
FAST_EXECUTORS = ("local-jobs1",)


# Ray and Slurm (submitit) come with the integrations extra.
@pytest.mark.parametrize("name", [n if n in FAST_EXECUTORS else pytest.param(n, marks=(
    pytest.mark.slow, *([pytest.mark.integration] if n.startswith(("ray", "slurm")) else []))) for n in EXECUTOR_ARGS])
def test_same_cell_same_metrics_under_every_executor(baseline, tmp_path, request, name):
    path, reference = baseline
    if name.startswith("ray"):
        request.getfixturevalue("ray_cluster")
    if name.startswith("slurm"):
        pytest.importorskip("submitit")
    out = tmp_path / "out"
    _run_matrix_here([path, "--out", out, *EXECUTOR_ARGS[name]])
    for cell in CELLS:
        assert _rows(out / cell) == _rows(reference / cell), f"{name}: {cell} differs from its fresh-process run"
        fresh = json.loads((reference / cell / "summary.json").read_text())
        summary = json.loads((out / cell / "summary.json").read_text())
        assert summary["status"] == "complete" and summary["threads"] == 1
        for key in ("accuracy_after", "reward_after", "steps", "completions_generated"):
            assert summary[key] == fresh[key], key
        for key in ("process_wall_clock_s", "startup_s", "build_s", "eval_s", "wall_clock_s", "queue_wait_s"):
            assert summary[key] >= 0, key
        # A cell's peak is its own: a warm worker's second cell does not inherit the first one's peak. (A Ray
        # worker's process also holds Ray's own runtime, about 80 MiB more.)
        slack = 0.25 if name == "ray" else 0.15
        assert abs(summary["peak_memory_bytes"] - fresh["peak_memory_bytes"]) < slack * fresh["peak_memory_bytes"]
    first, second = (json.loads((out / c / "summary.json").read_text()) for c in CELLS)
    if name == "local-jobs1":
        assert first["worker_pid"] == second["worker_pid"] and second["worker_cell_index"] == 1
        assert first["startup_s"] > 0 and second["startup_s"] == 0.0  # the import is paid once
        assert first["peak_rss_method"].startswith("VmHWM")
    executor = EXECUTOR_ARGS[name][1]
    session = json.loads((out / "matrix.json").read_text())["sessions"][-1]
    assert session["executor"] == executor and session["cells_run"] == 2 and session["elapsed_s"] > 0
    # the session's sums are its cells' seconds
    assert session["timing"]["train_s"] == pytest.approx(first["wall_clock_s"] + second["wall_clock_s"])
    assert session["timing"]["startup_s"] == pytest.approx(first["startup_s"] + second["startup_s"])
    if executor == "local":  # the resolved parallelism, which the idle time is computed from
        assert session["jobs"] == int(EXECUTOR_ARGS[name][3])


# ------------------------------------------------------------------------------------------------
# SIGKILL to the driver, then --resume
# ------------------------------------------------------------------------------------------------

RESUMABLE = """\
seeds = [0, 1, 2]
budget = 320             # 10 GRPO steps
checkpoint_every = 96    # every 3 steps
num_cpus = 1
device = "cpu"

[tasks.pizza]
eval_samples = 16

[algorithms.grpo]
"""
RESUMABLE_STEPS = 10


# Both drivers' kills are slow-tier tests (local about 20 s; Ray starts and tears down its own instance).
@pytest.mark.slow
@pytest.mark.parametrize("executor", ["local", pytest.param("ray", marks=pytest.mark.integration)])
def test_sigkill_driver_then_resume_keeps_and_skips_finished_cells(tmp_path, executor):
    if executor == "ray":
        pytest.importorskip("ray")
    path, out = tmp_path / "m.toml", tmp_path / "out"
    path.write_text(RESUMABLE)
    cells = [out / f"pizza/grpo/seed{s}" for s in range(3)]
    proc = _matrix([path, "--out", out, "--executor", executor, *(["--jobs", "1"] if executor == "local" else [])],
                   start_new_session=True)
    deadline, finished = time.time() + 300, []
    while time.time() < deadline and not finished:
        finished = [c for c in cells if '"status": "complete"' in _text(c / "summary.json")]
        time.sleep(0.02)
    assert finished, "no cell finished in time"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # Counted again once the driver is dead: it may have written another cell's summary after the poll above.
    finished = [c for c in cells if '"status": "complete"' in _text(c / "summary.json")]
    kept = {c: ((c / "summary.json").read_text(), (c / "summary.json").stat().st_mtime_ns) for c in finished}
    assert len(kept) < 3, "the kill must land before the last cell finished"
    time.sleep(2)  # a worker that outlived its driver would write now
    out_text = _run_matrix_here([path, "--out", out, "--resume", "--executor", executor])
    for c in finished:  # not lost, not re-run: byte for byte the summary written before the kill
        assert ((c / "summary.json").read_text(), (c / "summary.json").stat().st_mtime_ns) == kept[c]
        assert f"{c.name.replace('seed', 'seed ')}: complete, skipped" in out_text
    for c in cells:
        summary = json.loads((c / "summary.json").read_text())
        assert summary["status"] == "complete" and summary["steps"] == RESUMABLE_STEPS
        assert [r["step"] for r in read_jsonl(c / "metrics.jsonl")] == list(range(1, RESUMABLE_STEPS + 1))
    sessions = json.loads((out / "matrix.json").read_text())["sessions"]
    assert sessions[-1]["cells_skipped"] == len(finished) and sessions[-1]["cells_run"] == 3 - len(finished)
    if executor == "ray":  # the killed driver's local Ray instance went with it
        assert not _ray_processes_of(proc.pid, kinds=("ray::cell", "ray::IDLE", "raylet", "gcs_server"))
        # Ray's two agents exit after one last (60 s) attempt to tell the dead GCS that the raylet died: one
        # still alive must have seen the raylet go (waiting the minute out would double this test's time).
        logs = next(Path(tempfile.gettempdir(), "ray").glob(f"session_*_{proc.pid}")) / "logs"
        for agent in ("DashboardAgent", "RuntimeEnvAgent"):
            if _ray_processes_of(proc.pid, kinds=(f"ray::{agent}",)):
                log = logs / ("dashboard_agent.log" if agent == "DashboardAgent" else "runtime_env_agent.log")
                assert "The parent is dead" in log.read_text(), agent


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _ray_processes_of(session_leader: int, kinds: tuple[str, ...] = ("ray",)) -> list[int]:
    """Live (not zombie: a dead child the container's init has not reaped yet) Ray processes of a session."""
    out = subprocess.run(["ps", "-eo", "pid,sess,stat,args"], capture_output=True, text=True).stdout.splitlines()[1:]
    rows = [line.split(None, 3) for line in out]
    return [int(pid) for pid, sess, stat, args in rows
            if sess == str(session_leader) and not stat.startswith("Z") and any(k in args for k in kinds)]


# ------------------------------------------------------------------------------------------------
# SIGKILL to a Ray worker: the cell is retried (from its newest checkpoint) and completes
# ------------------------------------------------------------------------------------------------

ONE_CELL = """\
seeds = [0]
budget = 512             # 16 GRPO steps
checkpoint_every = 64    # every 2 steps
num_cpus = 1
device = "cpu"

[tasks.pizza]
eval_samples = 16

[algorithms.grpo]
"""


def _ray_task_pids() -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if cmdline.startswith("ray::") and "cell" in cmdline:
            pids.append(int(proc.name))
    return pids


def _ray_cell_checkpoints() -> list[Path]:
    """Checkpoints in the temporary directories where Ray workers run their cells."""
    return list(Path(tempfile.gettempdir()).glob("grpo-bench-cell-*/cell/checkpoints/step_*.pt"))


@pytest.mark.slow
@pytest.mark.integration
def test_sigkill_to_a_ray_worker_retries_the_cell(tmp_path, ray_cluster):
    path = tmp_path / "m.toml"
    path.write_text(ONE_CELL)
    reference = tmp_path / "ref"
    _run_matrix_here([path, "--out", reference, "--executor", "local", "--jobs", "1"])
    out = tmp_path / "out"
    before = set(_ray_cell_checkpoints())
    proc = _matrix([path, "--out", out, "--executor", "ray", "--ray-address", ray_cluster])
    deadline, pids = time.time() + 300, []
    while time.time() < deadline and not (pids and set(_ray_cell_checkpoints()) - before):
        pids = _ray_task_pids()
        time.sleep(0.05)
    assert pids, "no Ray worker ran the cell"
    assert set(_ray_cell_checkpoints()) - before, "the worker wrote no checkpoint in time"
    os.kill(pids[0], signal.SIGKILL)  # at its first checkpoint: 14 of 16 steps to go
    text, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, text
    summary = json.loads((out / "pizza/grpo/seed0/summary.json").read_text())
    assert summary["status"] == "complete" and summary["worker_pid"] != pids[0]
    assert _rows(out / "pizza/grpo/seed0") == _rows(reference / "pizza/grpo/seed0")  # a resumed run reproduces it
    print(f"retried_from_checkpoint={summary['retried_from_checkpoint']}")


# ------------------------------------------------------------------------------------------------
# Missing extras, resource keys
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("executor, module, extra", [("ray", "ray", "ray"), ("slurm", "submitit", "slurm")])
def test_missing_extra_is_one_line_naming_the_pip_command(tmp_path, run_cli, monkeypatch, executor, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    path = tmp_path / "m.toml"
    path.write_text(SMALL)
    code, out, err = run_cli("matrix", path, "--out", tmp_path / "out", "--executor", executor)
    assert code == 2
    assert err.strip() == (f"grpo-bench: error: --executor {executor} needs {module}, which is not installed: "
                           f"pip install -e \".[{extra}]\"")
    assert not (tmp_path / "out").exists()


def test_resource_keys_per_table(tmp_path, run_cli):
    from benchmarks.matrix import parse

    path = tmp_path / "m.toml"
    path.write_text(SMALL.replace("[algorithms.grpo]", "[algorithms.grpo]\nnum_cpus = 2\nnum_gpus = 0.5"))
    cells = {c.algo: c for c in parse(path).cells}
    assert cells["grpo"].resources == {"num_cpus": 2, "num_gpus": 0.5}
    assert cells["reinforce"].resources == {"num_cpus": 1}
    assert "resources" not in cells["grpo"].spec()  # not part of the cell's identity: --resume still matches
    path.write_text(SMALL.replace("num_cpus = 1", "num_cpus = 0"))
    code, _, err = run_cli("matrix", path, "--out", tmp_path / "out")
    assert code == 2 and f"{path}:3: num_cpus must be an integer >= 1" in err


# ------------------------------------------------------------------------------------------------
# A cell's files travel as an archive (Ray): unpacking it is interruptible without losing rows
# ------------------------------------------------------------------------------------------------


def test_unpack_interrupted_leaves_whole_files_and_no_summary_ahead_of_its_metrics(tmp_path, monkeypatch):
    from benchmarks.matrix import executors

    finished = tmp_path / "finished"
    (finished / "checkpoints").mkdir(parents=True)
    (finished / "checkpoints" / "step_0000009.pt").write_bytes(b"x" * 1000)
    (finished / "metrics.jsonl").write_text("".join(f'{{"step": {s}}}\n' for s in range(1, 11)))
    (finished / "summary.json").write_text('{"status": "complete"}')
    (finished / ".run.lock").write_text("")
    data = executors.pack_dir(finished)
    cell = tmp_path / "cell"
    cell.mkdir()
    (cell / "metrics.jsonl").write_text('{"step": 1}\n')
    replaced, real_replace = [], os.replace

    def killed_after_two(src, dst):  # the driver dies after renaming two files into place
        if len(replaced) == 2:
            raise KeyboardInterrupt
        replaced.append(Path(dst).name)
        real_replace(src, dst)

    monkeypatch.setattr(executors.os, "replace", killed_after_two)
    with pytest.raises(KeyboardInterrupt):
        executors.unpack_dir(data, cell)
    assert replaced == ["step_0000009.pt", "metrics.jsonl"]
    assert not (cell / "summary.json").exists()  # summary.json is renamed in last
    assert (cell / "metrics.jsonl").read_text().count("\n") == 10  # whole, never cut short
    assert sorted(p.name for p in cell.iterdir()) == ["checkpoints", "metrics.jsonl"]  # no staging left behind
    monkeypatch.setattr(executors.os, "replace", real_replace)
    executors.unpack_dir(data, cell)
    assert (cell / "summary.json").read_text() == '{"status": "complete"}' and not (cell / ".run.lock").exists()
    assert executors.pack_dir(cell) == data  # and a cell packs back to the same archive
