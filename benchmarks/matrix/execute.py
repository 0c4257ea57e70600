"""Running a planned matrix: which cells still need to run, an executor to run them, and the record.

Planning (``plan.parse``) turns the TOML into cells; this module decides what runs and keeps
DIR/matrix.json; an *executor* runs cells. Each cell is described by DIR/<cell>/cell.json, the full
resolved spec, and its run by ``python -m benchmarks.matrix.cell CELL_DIR`` (``cell.py``), which reads
that file. A cell is finished only when its summary.json says "complete" at the planned step count,
so ``--resume`` re-runs a cell killed half-way (from its last checkpoint if it has one) and skips the
finished ones. A failing cell is recorded as failed and the matrix goes on.

An executor is any object with ``run(jobs, on_done)`` that runs every ``CellJob`` and calls
``on_done(job, summary)`` in the driver's process as each one ends. ``SubprocessExecutor`` (one cell
after another, each in a fresh process) is here; ``benchmarks.matrix.executors`` has the parallel ones
(``local``: warm worker processes on this machine, the default; ``ray``; ``slurm`` through submitit).

Every cell's summary.json gets the executor's record beside the run's own numbers: ``executor``,
``process_wall_clock_s`` (dispatch to result), ``startup_s`` (process start and imports this cell paid
for), ``build_s``, ``eval_s``, ``reset_s`` (from the cell's timing.json), ``queue_wait_s`` (session start
to dispatch); ``wall_clock_s`` is the training alone. matrix.json's session entry carries the session's totals under
``timing`` (benchmarks/matrix/timing.py).
"""

from __future__ import annotations

import dataclasses
import datetime
import fnmatch
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Protocol, Sequence

from tqdm.auto import tqdm

from benchmarks.errors import UsageError
from benchmarks.git import CODE_PATHS, code_state
from benchmarks.harness import measure
from benchmarks.harness.config import flat_settings, resolve
from benchmarks.harness.loop import discard_checkpoints
from benchmarks.progress import progress as progress_bar
from benchmarks.io import (atomic_write_json, check_output_dir, locked_directory, read_json, read_jsonl,
                           write_errors)
from benchmarks.matrix import tuning
from benchmarks.matrix.plan import CELL_COMPLETE, Cell, Plan
from benchmarks.matrix.timing import SESSION_KEYS, cell_timing
from benchmarks.store import STORE_FILE, ResultStore, experiment, same_experiment_spec

# The project's checkout: the code every cell runs, whose commit (and any uncommitted change) each cell records.
CODE_ROOT = Path(__file__).absolute().parents[2]
LOCK_FILE = ".matrix.lock"


@dataclasses.dataclass
class CellJob:
    """One cell to run: where, whether to resume it, and how long it may take."""

    cell: Cell
    cell_dir: Path
    resume: bool
    timeout_s: float = 0
    threads: int = 0  # torch threads for the cell (0: the process's default)
    queued_at: float = dataclasses.field(default_factory=time.perf_counter)  # when the session queued it
    out_dir: Optional[Path] = None  # the matrix directory


class Executor(Protocol):
    def run(self, jobs: list[CellJob], on_done: Callable[[CellJob, dict], None]) -> None: ...


def is_complete(cell_dir: Path, cell: Cell) -> bool:
    """Finished on disk means: the same cell (same spec) and a summary that says complete at the planned step
    count, or at the budget (a step that re-samples, as DAPO's dynamic sampling, spends it sooner)."""
    return same_experiment_spec(read_json(cell_dir / "cell.json"), cell.spec()) and finished(read_json(cell_dir / "summary.json"), cell)


def finished(summary: Optional[dict], cell: Cell) -> bool:
    """A summary that says ``cell`` ran to the end: complete at its planned steps or its budget."""
    if summary is None or summary.get("status") != CELL_COMPLETE:
        return False
    return summary.get("steps") == cell.steps or summary.get("completions_generated", 0) >= cell.budget


def stored_complete(store: ResultStore, cell: Cell) -> bool:
    """The store holds ``cell`` (the same experiment), finished."""
    stored = store.spec(cell.relpath)
    return stored is not None and same_experiment(stored, cell) and finished(store.summary(cell.relpath), cell)


def still_planned(cells: Sequence[Cell]) -> Callable[[str, dict], bool]:
    """Whether a stored cell (its path and spec) is one of ``cells``. A path may be planned more than once: before
    a tuned matrix has chosen, each evaluation cell's path is a candidate at every grid point, and a stored cell
    at any of them is kept."""
    planned: dict[str, list[Cell]] = {}
    for cell in cells:
        planned.setdefault(cell.relpath, []).append(cell)
    return lambda relpath, spec: any(same_experiment(spec, c) for c in planned.get(relpath, ()))


def same_experiment(stored: dict, cell: Cell) -> bool:
    """A stored cell is ``cell`` when its spec is the same (how often it checkpoints aside), or when the only
    difference is settings that did not exist when it ran and that ``cell`` leaves at their defaults: a new
    option whose default keeps the old behaviour (a new loss, a new estimator) must not invalidate every
    finished cell of a matrix."""
    if same_experiment_spec(stored, cell.spec()):
        return True
    stored, planned = experiment(stored), experiment(cell.spec())
    added = set(planned["settings"]) - set(stored.get("settings", {}))
    if not added:
        return False
    defaults = flat_settings(*resolve({"task": cell.task, "algo": cell.algo, **cell.task_options}))
    if any(planned["settings"][k] != defaults.get(k, ...) for k in added):
        return False
    return stored == {**planned, "settings": {k: v for k, v in planned["settings"].items() if k not in added}}


def store_cell(store: ResultStore, cell: Cell, cell_dir: Path, summary: dict) -> None:
    """Keep a cell that ended (complete or failed) in the matrix's store: its spec, summary and metrics rows."""
    store.put(cell.relpath, cell.spec(), summary, read_jsonl(cell_dir / "metrics.jsonl"))


def prepare_cell_dir(job: CellJob) -> CellJob:
    """Write cell.json; a directory holding another spec is cleared first (its checkpoints must never be resumed)."""
    resume = job.resume and same_experiment_spec(read_json(job.cell_dir / "cell.json"), job.cell.spec())
    if not resume:
        shutil.rmtree(job.cell_dir, ignore_errors=True)
    job.cell_dir.mkdir(parents=True, exist_ok=True)
    # Working space (checkpoints, log, metrics before the store has them): never committed with the results.
    (job.cell_dir / ".gitignore").write_text("*\n")
    atomic_write_json(job.cell_dir / "cell.json", job.cell.spec())
    return dataclasses.replace(job, resume=resume)


def cell_process_command() -> list[str]:
    """``python -m benchmarks.matrix.cell``: a cell's process, its module named by the module itself."""
    # Imported here, not at the top: this package's __init__ imports this module, so a module-level import would
    # load cell.py a second time in every cell's process (``-m`` imports the package, then runs cell as __main__).
    from benchmarks.matrix import cell

    return [sys.executable, "-m", cell.__name__]


def cell_command(cell_dir: Path, resume: bool, threads: int = 0) -> list[str]:
    return (cell_process_command() + [str(cell_dir)] + (["--resume"] if resume else [])
            + (["--threads", str(threads)] if threads else []))


def thread_env(threads: int) -> dict:
    """Environment pinning a process's native thread pools to ``threads`` (nothing for 0)."""
    return {k: str(threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")} if threads else {}


def _child_env(threads: int = 0) -> dict:
    env = dict(os.environ)
    root = str(Path(__file__).absolute().parents[2])  # the child runs this very code
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["GRPO_BENCH_SPAWNED_AT"] = repr(time.time())  # the child's start-up is measured from here
    return {**env, **thread_env(threads)}


def _die_with_parent() -> None:
    # A cell must not outlive a matrix killed with SIGKILL: it would race the resumed matrix for its directory.
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def last_error_line(log: Path) -> str:
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").replace("\r", "\n").splitlines()]
    except OSError:
        return ""
    lines = [ln for ln in lines if ln and "it/s" not in ln and "s/it" not in ln]
    return lines[-1] if lines else ""


ATTEMPTS_FILE = "attempts.json"  # process seconds of each attempt at the cell that ended under a driver
TIMING_KEYS = ("startup_s", "reset_s", "build_s", "eval_s", "cell_s", "peak_rss_method", "threads", "pid")


def finish_cell(job: CellJob, returncode: int, process_s: float, error: Optional[str] = None,
                record: Optional[dict] = None) -> dict:
    """The cell's summary after its process ended: the run's own when complete, else a 'failed' one written
    here; either way with the executor's ``record`` and the cell's timing.json merged in."""
    summary = read_json(job.cell_dir / "summary.json")
    log_path = job.cell_dir / "log.txt"
    timing = {k: v for k, v in (read_json(job.cell_dir / "timing.json") or {}).items() if k in TIMING_KEYS}
    # A resumed cell's training time continues its checkpoint's, so its process time must add up every attempt
    # too (a killed attempt's work after its last checkpoint is lost time, not nothing); an attempt whose driver
    # was stopped with it never reaches here and is not counted.
    attempts = (read_json(job.cell_dir / ATTEMPTS_FILE) or []) + [process_s]
    atomic_write_json(job.cell_dir / ATTEMPTS_FILE, attempts)
    record = {**timing, **(record or {}), "process_wall_clock_s": sum(attempts),  # start-up and evaluation included
              "attempts": len(attempts)}
    if returncode == 0 and summary and summary.get("status") == CELL_COMPLETE:
        summary.update(record)
        atomic_write_json(job.cell_dir / "summary.json", summary)
        return summary
    if error is None:
        if returncode < 0:
            name = signal.Signals(-returncode).name
            error = f"killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
        else:
            error = (summary or {}).get("error") or last_error_line(log_path) or f"exit status {returncode}"
    cell = job.cell
    failed = {
        **{k: v for k, v in (summary or {}).items() if k != "status"},
        "task": cell.task, "algo": cell.algo, "seed": cell.seed, "status": "failed", "error": error,
        "returncode": returncode, "log": str(log_path), **record,
    }
    atomic_write_json(job.cell_dir / "summary.json", failed)
    return failed


class SubprocessExecutor:
    """One cell after another, each in a fresh ``python -m benchmarks.matrix.cell`` process: the baseline,
    paying process start-up and imports once per cell (``--executor subprocess``)."""

    name = "subprocess"
    jobs = 1

    def run(self, jobs: list[CellJob], on_done: Callable[[CellJob, dict], None]) -> None:
        for job in jobs:
            on_done(job, self.run_one(job))

    @staticmethod
    def run_one(job: CellJob) -> dict:
        job = prepare_cell_dir(job)
        start = time.perf_counter()
        record = {"executor": "subprocess", "queue_wait_s": start - job.queued_at}
        threads = job.threads or job.cell.resources.get("num_cpus", 0)
        with open(job.cell_dir / "log.txt", "w") as log:
            # the thread count travels in OMP_NUM_THREADS, which torch reads at import
            proc = subprocess.Popen(cell_command(job.cell_dir, job.resume), stdout=log,
                                    stderr=subprocess.STDOUT, env=_child_env(threads),
                                    preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
            error = None
            try:
                returncode = proc.wait(timeout=job.timeout_s or None)
            except subprocess.TimeoutExpired:
                proc.kill()
                returncode = proc.wait()
                error = f"timed out after {job.timeout_s:g} s"
            except BaseException:
                proc.kill()
                proc.wait()
                raise
        return finish_cell(job, returncode, time.perf_counter() - start, error, record)


def cell_line(i: int, n: int, cell: Cell, s: dict) -> str:
    head = f"[{i}/{n}] {cell.name}:"
    if s.get("status") != CELL_COMPLETE:
        return f"{head} FAILED: {s.get('error')}"
    return (f"{head} accuracy {s['accuracy_before']:.3f} -> {s['accuracy_after']:.3f}, reward {s['reward_before']:.3f} -> "
            f"{s['reward_after']:.3f}, {s['steps']} steps / {s['completions_generated']:.0f} completions, "
            f"{s['wall_clock_s']:.1f} s training ({s['process_wall_clock_s']:.1f} s in "
            + (f"{s['attempts']} attempts), " if s.get("attempts", 1) > 1 else "all), ")
            + 
            f"peak {s['peak_memory_bytes'] / 2**20:.0f} MiB")


def first_cell_of_each_task_first(jobs: list[CellJob]) -> list[CellJob]:
    """The order cells are handed out in: one cell of every task, then the rest in plan order. A task's first
    cell may build its starting policy (addition pretrains for minutes on a cold cache); started early, that
    build runs beside the other tasks' cells instead of holding up cells that wait for it."""
    seen: set[str] = set()
    firsts = [job for job in jobs if not (job.cell.task_label in seen or seen.add(job.cell.task_label))]
    return firsts + [job for job in jobs if not any(job is first for first in firsts)]


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _refuse_overwrite(out: Path, cells: list[Cell], store: ResultStore) -> None:
    done = [c for c in cells if stored_complete(store, c) or is_complete(out / c.relpath, c)]
    if done:
        raise UsageError(f"{out} holds {len(done)} finished cell(s) of this matrix: --resume keeps them and "
                         f"runs the rest, --overwrite runs every cell again")


def run_matrix(plan: Plan, out: Path | str, *, resume: bool = False, overwrite: bool = False, progress: bool = True,
               executor: Optional[Executor] = None, tasks: Optional[Sequence[str]] = None,
               rerun: Optional[Sequence[str]] = None, allow_dirty: bool = False,
               procedure: Optional[str] = None) -> dict[str, int]:
    """Run (or resume) every cell through ``executor``; returns counts of complete, failed and skipped cells.

    With ``[tuning]``: the tuning cells first, then each variant's evaluation cells at its chosen grid point
    (benchmarks/matrix/tuning.py). ``tasks`` (task labels) runs only those tasks' cells now: the others
    stay planned, their finished cells stay in the store, and a later ``resume`` runs them. ``rerun`` (with
    ``resume``: shell patterns of cell paths, as ``tune/chain_sum/dapo/*``) runs the matching cells again from
    step 0, finished or not, replacing them: a cell that ran under a fixed fault, asked for by name.

    The store is the record of what finished: a resume keeps the stored cells the file no longer plans, and
    replaces finished cells whose settings the file changed only with ``overwrite`` as well (``--resume
    --overwrite``). The cells run from the checkout's committed code; ``allow_dirty`` runs uncommitted code (or
    code outside a git checkout), each cell marked ``dirty`` with the diff's hash. ``out`` must be a folder the
    tool may write (``benchmarks.io.check_output_dir``). A disk that fills is one UsageError line saying what
    was kept. ``procedure`` names the verdicts' procedure the matrix's [analysis] is stated for (recorded with it).
    """
    out = check_output_dir(out, records=("matrix.json", STORE_FILE), ours=(LOCK_FILE,), checkout=CODE_ROOT)
    again = _rerun_cells(plan, rerun, resume) if rerun is not None else set()
    if tasks is not None:
        known = sorted({c.task_label for c in plan.cells + plan.tuning_cells()})
        unknown = [t for t in tasks if t not in known]
        if not tasks:
            raise UsageError(f"--tasks names no task (the tasks of {plan.name}: {', '.join(known)})")
        if unknown:
            raise UsageError(f"--tasks: {', '.join(unknown)} is not a task of {plan.name} (its tasks: {', '.join(known)})")
        if plan.tuning:
            raise UsageError("--tasks runs a subset of the cells; a matrix with [tuning] decides over all "
                             "of them: run it whole")
    every_cell = plan.cells + plan.tuning_cells() + plan.candidate_cells()
    code = code_record(allow_dirty)
    with locked_directory(out, LOCK_FILE, what="matrix directory", busy="another grpo-bench matrix is running in"), \
            write_errors(out, lambda: _kept(out)):
        store = ResultStore.open(out)  # a corrupt or foreign store stops here, before any work
        if not resume and not overwrite:
            _refuse_overwrite(out, every_cell, store)
        if resume:
            _resume_store(plan, out, store, every_cell, again, overwrite)
            _say_mixed_versions(store, code)
        elif overwrite and tasks is not None:
            # --overwrite --tasks runs those tasks' cells again and keeps the other tasks' finished cells.
            store.keep_only(still_planned([c for c in every_cell if c.task_label not in tasks]))
        else:
            store = ResultStore(store.path, {}, {})
            store.write()  # --overwrite: the previous cells are gone from the store now, not when a cell ends
        return _run_stages(plan, out, store, executor or SubprocessExecutor(), resume=resume, overwrite=overwrite,
                           progress=progress, tasks=tasks, again=again, code=code, procedure=procedure)


def _run_stages(plan: Plan, out: Path, store: ResultStore, executor: Executor, *, resume: bool, overwrite: bool,
                progress: bool, tasks: Optional[Sequence[str]], again: set, code: dict,
                procedure: Optional[str]) -> dict[str, int]:
    """run_matrix's work in the locked directory: the tuning stage (with [tuning]), then the evaluation cells."""
    counts, tuned, stages_run = {"complete": 0, "failed": 0, "skipped": 0}, None, 0
    staged = bool(plan.tuning)

    def run_stage(cells: list[Cell], stage: str) -> None:
        nonlocal stages_run
        if tasks is not None:
            cells = [c for c in cells if c.task_label in tasks]
        more = _run_locked(plan, cells, out, store, resume=resume, progress=progress, executor=executor,
                           stage=stage, tuned=tuned, staged=staged, same_invocation=stages_run > 0, again=again,
                           overwrite=overwrite, code=code, procedure=procedure)
        stages_run += 1
        for key in counts:
            counts[key] += more[key]

    if plan.tuning:
        tuned = {"seeds": plan.tuning_seeds, "cells": [{"dir": c.relpath, **c.spec()} for c in plan.tuning_cells()],
                 "table": None}
        run_stage(plan.tuning_cells(), "tuning")
        chosen, tuned["table"] = tuning.choose(plan, store)
        plan = plan.choose(chosen)
        for group in tuned["table"]:
            point = group["points"][group["chosen"]]
            tqdm.write(f"tuning: {group['task']} {group['variant']}: {point['point']} ({point['primary_metric']} "
                       f"{point['primary']:.3f} over {point['seeds']} tuning seed(s), on validation problems)")
    run_stage(plan.cells, "evaluation")
    return counts


def code_record(allow_dirty: bool) -> dict:
    """What every cell of this session records of its code: ``commit``, ``dirty`` and ``diff_hash``
    (``benchmarks.git.code_state``). Uncommitted code, or code outside a git checkout, is one UsageError line unless
    ``allow_dirty``; outside a checkout the cells are then marked dirty with no commit."""
    state = code_state(CODE_ROOT)
    if state is None:
        if not allow_dirty:
            raise UsageError(f"{CODE_ROOT} is not a git checkout: no commit to check out for the code the cells run; "
                             "--allow-dirty runs them and marks every cell dirty")
        return {"commit": "", "dirty": True, "diff_hash": ""}
    if state["dirty"] and not allow_dirty:
        raise UsageError(f"the checkout {CODE_ROOT} has uncommitted changes to its code ({', '.join(CODE_PATHS)}): "
                         "a matrix runs committed code; commit them, or --allow-dirty runs the cells and marks each "
                         "dirty with the diff's sha256")
    return state


def _kept(out: Path) -> str:
    """What a matrix stopped by a write error has kept: its store's finished cells, as far as it can be read."""
    try:
        store = ResultStore.read(out)
    except (UsageError, OSError):
        return f"its store {out / STORE_FILE} could not be read back"
    done = len(store.finished()) if store else 0
    return f"kept {done} finished cell(s) in {out / STORE_FILE}; free space, then --resume runs the rest"


def _listed(relpaths: Sequence[str], most: int = 4) -> str:
    return ", ".join(relpaths[:most]) + (f" and {len(relpaths) - most} more" if len(relpaths) > most else "")


def _resume_store(plan: Plan, out: Path, store: ResultStore, every_cell: list[Cell], again: set,
                  overwrite: bool) -> None:
    """The store before a resume: the cells asked to run again (``again``) and the unfinished cells whose settings
    the file changed are dropped; finished cells whose settings it changed are dropped only with ``overwrite``, else
    one UsageError line names them; stored cells the file no longer plans are kept (a line says how many)."""
    planned = still_planned(every_cell)
    paths = {c.relpath for c in every_cell}
    changed = sorted(r for r, entry in store.cells.items()
                     if r in paths and r not in again and not planned(r, entry["spec"]))
    finished = set(store.finished())
    replaced = [r for r in changed if r in finished]
    if replaced and not overwrite:
        raise UsageError(f"--resume would replace {len(replaced)} finished cell(s) whose settings {plan.path} changed "
                         f"({_listed(replaced)}): --resume --overwrite runs them again under the new settings (the "
                         "other finished cells are kept); or use a new --out")
    unplanned = sorted(r for r in finished if r not in paths)
    if unplanned:
        tqdm.write(f"{len(unplanned)} finished cell(s) of the store are not planned by {plan.path} "
                   f"({_listed(unplanned)}): kept in the store, not in this matrix's report")
    store.drop(changed + sorted(again))
    for relpath in sorted(again):  # gone from disk as from the store now: an interrupted rerun resumes
        shutil.rmtree(out / relpath, ignore_errors=True)  # the new run, never brings the old one back


def _version(summary: dict) -> tuple:
    """(commit, diff hash) a stored cell ran at; a cell stored before the driver recorded it: the commit its own
    process measured, its diff unknown (None)."""
    if "commit" in summary:
        return summary["commit"], summary.get("diff_hash") or ""
    return ((summary.get("environment") or {}).get("code") or {}).get("commit"), None


def _say_mixed_versions(store: ResultStore, code: dict) -> None:
    """One line when the finished cells of a resumed matrix ran at other code than this session's (not refused:
    the report flags the cells)."""
    versions = {}
    for relpath in store.finished():
        commit, diff = _version(store.summary(relpath))
        if commit and (commit != code["commit"] or (diff is not None and diff != code["diff_hash"])):
            versions.setdefault(commit[:12] + ("+" + diff[:8] if diff else ""), []).append(relpath)
    if versions:
        here = (code["commit"][:12] or "no commit") + ("+" + code["diff_hash"][:8] if code["diff_hash"] else "")
        tqdm.write(f"the matrix now mixes code versions: this session runs at {here}, "
                   + "; ".join(f"{len(cells)} finished cell(s) ran at {v}" for v, cells in sorted(versions.items())))


def _rerun_cells(plan: Plan, patterns: Sequence[str], resume: bool) -> set[str]:
    """The paths of the cells ``patterns`` (shell patterns of cell paths) name, each pattern naming at least one."""
    if not resume:
        raise UsageError("--rerun goes with --resume: it runs the named cells again and keeps the others")
    if not patterns:
        raise UsageError("--rerun names no cell (give cell paths or patterns, as tune/TASK/VARIANT/*)")
    # with [tuning], the evaluation cells are the grid points' candidates until the tuning has chosen
    paths = [c.relpath for c in plan.cells + plan.tuning_cells() + plan.candidate_cells()]
    again = set()
    for pattern in patterns:
        matched = {p for p in paths if fnmatch.fnmatchcase(p, pattern)}
        if not matched:
            raise UsageError(f"--rerun {pattern!r} matches no cell of {plan.name} (its cells' paths are like "
                             f"{paths[0]})")
        again |= matched
    return again


# What an analysis record holds beside the analysis itself: when it was stated and under which verdict procedure.
ANALYSIS_RECORD_KEYS = ("stated_at", "procedure", "restated_at")


def _stated_analysis(plan: Plan, previous: dict, sessions: list[dict], amend: bool = False,
                     procedure: Optional[str] = None) -> Optional[dict]:
    """The matrix's ``[analysis]`` with when it was first stated (the start of the first session that ran under
    it): ``previous["analysis"]`` is the analysis recorded before the first cell, ``sessions`` the sessions that
    ran. Pre-registration: a resumed matrix whose cells ran under another primary metric or margin is refused, a
    change after seeing results being a new experiment; with ``amend`` (--resume --overwrite) the change is
    recorded as stated now, after cells ran: not pre-registered. ``procedure``: the version name of the verdicts'
    procedure it is stated for (the caller's to name: the matrix sits below the report)."""
    stated = plan.analysis.as_dict() if plan.analysis is not None else None
    before = previous.get("analysis") if sessions else None
    claim = None if before is None else {k: v for k, v in before.items() if k not in ANALYSIS_RECORD_KEYS}
    if before is not None and claim != stated:
        if not amend:
            change = (f"the matrix in {plan.path} drops the [analysis] its first session stated ({claim})"
                      if stated is None else f"[analysis] changed since the first session of this matrix stated it "
                                             f"({claim} -> {stated})")
            raise UsageError(f"{change}: a change of the primary metric or the margin after cells ran is a new "
                             "experiment: use a new --out (--resume --overwrite records it as not pre-registered)")
        return None if stated is None else {**stated, "stated_at": None, "procedure": procedure,
                                            "restated_at": _now()}
    if before is not None:
        return before
    if stated is None:
        return None
    if any(s.get("cells_run") for s in sessions):
        # added to a matrix that had already run: not pre-registered
        return {**stated, "stated_at": None, "procedure": procedure}
    return {**stated, "stated_at": _now(), "procedure": procedure}


def _run_locked(plan: Plan, cells: list[Cell], out: Path, store: ResultStore, *, resume: bool, progress: bool,
                executor: Executor, stage: str = "evaluation", tuned: Optional[dict] = None, staged: bool = False,
                same_invocation: bool = False, again: frozenset = frozenset(), overwrite: bool = False,
                code: Optional[dict] = None, procedure: Optional[str] = None) -> dict[str, int]:
    """One session of ``cells`` (one stage: tuning or evaluation) in the locked matrix directory: matrix.json opened
    with the session, the finished cells skipped with --resume, the rest run through ``executor``, each recorded in
    the store and matrix.json as it ends. Returns the session's counts of complete, failed and skipped cells."""
    code = code if code is not None else code_record(allow_dirty=True)
    meta = _open_session(plan, out, store, executor, resume=resume, continues=resume or same_invocation,
                         stage=stage if staged else None, tuned=tuned, amend=resume and overwrite, code=code,
                         procedure=procedure)
    # on a terminal a bar; in a file the per-cell lines say it all
    bar = progress_bar(len(cells), desc=f"matrix {plan.name}" + (f" ({stage})" if staged else ""), unit="cell",
                       enabled=progress and sys.stderr.isatty())
    session = _Session(meta, cells, out, store, executor, bar, code)
    jobs = []
    for cell in cells:
        cell_dir = out / cell.relpath
        if cell.relpath in again:  # asked to run again: from step 0, its directory cleared (prepare_cell_dir)
            jobs.append(CellJob(cell, cell_dir, False, plan.timeout_s, queued_at=session.start, out_dir=out))
            continue
        if resume and not stored_complete(store, cell) and is_complete(cell_dir, cell):
            store_cell(store, cell, cell_dir, read_json(cell_dir / "summary.json"))  # finished before the store knew
        if resume and stored_complete(store, cell):
            session.skipped(cell)
        else:
            jobs.append(CellJob(cell, cell_dir, resume, plan.timeout_s, queued_at=session.start, out_dir=out))
    if getattr(executor, "name", "") in ("local", "subprocess"):  # cells on this machine: say it once, here
        notices = {measure.emulated_bf16_notice(job.cell.precision, measure.resolve_device(job.cell.device))
                   for job in jobs if job.cell.precision == "bf16" and not job.cell.device.startswith("cuda")}
        for notice in sorted(filter(None, notices)):
            tqdm.write(f"grpo-bench: {notice}", file=sys.stderr)
    try:
        executor.run(first_cell_of_each_task_first(jobs), session.cell_done)
    finally:
        session.close()
    return session.counts


def _open_session(plan: Plan, out: Path, store: ResultStore, executor: Executor, *, resume: bool, continues: bool,
                  stage: Optional[str], tuned: Optional[dict], amend: bool = False, code: Optional[dict] = None,
                  procedure: Optional[str] = None) -> dict:
    """matrix.json's record with a new session entry (the last in ``sessions``), written at once: the sessions
    before it where this one ``continues`` them, the stated analysis, the cells and, with [tuning], the tuning.

    The store keeps its own copy of the record (``ResultStore.record``: the analysis as stated before the first
    cell, the sessions), written here before any cell of the session runs. The analysis recorded there is the
    one a resume is held to, whatever matrix.json says; a lost matrix.json is rebuilt from it (``"rebuilt":
    true``), and where the store has no record of its own, the rebuilt record claims no pre-registration."""
    previous = read_json(out / "matrix.json")
    rebuilt = previous is None and bool(store.cells or store.record)
    previous = previous or {}
    if "sessions" in store.record and (rebuilt or "sessions" not in previous):
        previous = {**previous, "sessions": store.record["sessions"]}
    if "analysis" in store.record:  # stated before the first cell: matrix.json may have been edited or lost since
        previous = {**previous, "analysis": store.record["analysis"]}
    elif rebuilt:
        previous = {**previous, "analysis": None}
    sessions = previous.get("sessions", []) if continues else []
    ran = sessions + ([{"cells_run": len(store.cells)}] if continues and store.cells else [])
    session = {"started": _now(), "elapsed_s": 0.0, "cells_run": 0, "cells_skipped": 0, "resume": resume,
               "executor": getattr(executor, "name", type(executor).__name__), "jobs": getattr(executor, "jobs", None),
               "timing": dict.fromkeys(SESSION_KEYS, 0.0)}
    if code is not None:
        session["code"] = code
    if stage is not None:
        session["stage"] = stage
    analysis = _stated_analysis(plan, previous, ran, amend, procedure)
    sessions.append(session)
    meta = {"name": plan.name, "description": plan.description, "file": plan.path, "toml": plan.text,
            "unit": "generated completions per cell", "cells": [{"dir": c.relpath, **c.spec()} for c in plan.cells],
            "sessions": sessions}
    if rebuilt or (continues and previous.get("rebuilt")):
        meta["rebuilt"] = True
    if analysis:
        meta["analysis"] = analysis
    if tuned is not None:
        meta["tuning"] = tuned
    store.record.update(analysis=analysis, sessions=sessions)
    store.write()
    atomic_write_json(out / "matrix.json", meta)
    return meta


class _Session:
    """A session's running record: its counts, its entry in matrix.json (``meta``'s last session), the progress
    bar and a line per cell, numbered in the session's order."""

    def __init__(self, meta: dict, cells: list[Cell], out: Path, store: ResultStore, executor: Executor, bar,
                 code: dict):
        self.meta, self.entry, self.code = meta, meta["sessions"][-1], code
        self.out, self.store, self.executor, self.bar = out, store, executor, bar
        self.counts = {"complete": 0, "failed": 0, "skipped": 0}
        self.start = time.perf_counter()
        self.n = len(cells)
        self.index = {c.relpath: i for i, c in enumerate(cells, 1)}

    def skipped(self, cell: Cell) -> None:
        """A cell the store holds finished: counted, and not run."""
        self.counts["skipped"] += 1
        self.entry["cells_skipped"] += 1
        tqdm.write(f"[{self.index[cell.relpath]}/{self.n}] {cell.name}: complete, skipped")
        self.bar.update(1)

    def cell_done(self, job: CellJob, summary: dict) -> None:
        """The executor's ``on_done``: the cell stored (a finished one without its checkpoints), the session's
        counts and timing updated, its line written and matrix.json rewritten."""
        self.counts["complete" if summary.get("status") == CELL_COMPLETE else "failed"] += 1
        # which session made the cell: the report's wall-clock counts the sessions whose cells it shows
        # and the code it ran: commit, dirty and diff_hash (code_record)
        summary = {**summary, "matrix_session": len(self.meta["sessions"]) - 1, "finished_at": _now(), **self.code}
        self.entry["elapsed_s"] = time.perf_counter() - self.start
        self.store.record["sessions"] = self.meta["sessions"]
        store_cell(self.store, job.cell, job.cell_dir, summary)
        if summary.get("status") == CELL_COMPLETE:  # stored and finished: never resumed, only rerun from scratch
            discard_checkpoints(job.cell_dir)
        self.entry["cells_run"] += 1
        # resolved by run() (0: what fits the cores)
        self.entry["jobs"] = getattr(self.executor, "jobs", None) or self.entry["jobs"]
        for key, value in cell_timing(summary).items():
            self.entry["timing"][key] += value
        tqdm.write(cell_line(self.index[job.cell.relpath], self.n, job.cell, summary))
        atomic_write_json(self.out / "matrix.json", self.meta)
        self.bar.update(1)

    def close(self) -> None:
        """The session's end: the bar closed, its time and end recorded in matrix.json."""
        self.bar.close()
        self.entry["elapsed_s"] = time.perf_counter() - self.start
        self.entry["finished"] = _now()
        self.store.record["sessions"] = self.meta["sessions"]
        self.store.write()
        atomic_write_json(self.out / "matrix.json", self.meta)
