"""``grpo-bench matrix FILE --out DIR``: every algorithm variant on every task and seed, at equal samples.

A matrix file (TOML) names tasks x algorithm variants x seeds and one budget in *generated
completions per cell*: a cell's step count is ``budget // completions_per_step`` of its algorithm's
config, so GRPO with mu = 2 or PPO with several epochs is compared with REINFORCE at equal samples
(wall-clock is measured beside it). A list value expands into one variant per element (lists in one
table form their product)::

    seeds = [0, 1, 2]
    budget = 2048            # generated completions per cell
    eval_every = 512         # completions between evaluations (0: before and after only)

    [tasks.pizza]            # keys: the task's options (as `grpo-bench run` takes them)
    [tasks.bandit]
    reward_mode = ["rm", "verifiable"]

    [algorithms.grpo]        # keys: fields of the algorithm's config
    level = ["token", "sequence"]
    mu = [1, 2]
    [algorithms.gspo]        # a named variant of a registered algorithm
    algo = "grpo"
    level = "sequence"

The whole file is validated before anything runs: an unknown key, task or algorithm, or an impossible
variant is one line ``FILE:LINE: ...`` and exit status 2. Each cell is a ``grpo-bench run`` in its own
process (its peak memory is its own) writing DIR/<task>/<variant>/seed<N>/; a cell is finished only
when its summary.json says "complete", so ``--resume`` re-runs a cell killed half-way (from its last
checkpoint if it has one) and skips finished ones. A failing cell is recorded as failed and the
matrix goes on.
"""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import typing
from pathlib import Path
from typing import Any, Optional

from tqdm.auto import tqdm

import benchmarks
from algorithms import ALGORITHMS
from benchmarks.harness import UsageError
from benchmarks.io import atomic_write_json
from tasks import TASKS

# Top-level keys (the run settings every cell shares), with their meaning for the docs and errors.
RUN_KEYS = {
    "name": "a name for the report",
    "description": "one line for the report",
    "seeds": "list of seeds, one cell per seed",
    "budget": "generated completions per cell",
    "eval_every": "completions between evaluations (0: before and after only)",
    "checkpoint_every": "completions between checkpoints (0: none; a killed cell restarts from scratch)",
    "device": "auto, cpu or cuda",
    "precision": "auto, fp32 or bf16",
    "timeout_s": "seconds before a cell is stopped and recorded as failed (0: none)",
    "tasks": "[tasks.NAME] tables",
    "algorithms": "[algorithms.NAME] tables",
}
TASK_RESERVED = {"budget": "override the budget for this task", "eval_every": "override eval_every for this task"}
CELL_COMPLETE = "complete"


class MatrixError(UsageError):
    """A matrix file that cannot run, reported as ``FILE:LINE: message`` (exit status 2)."""


# ------------------------------------------------------------------------------------------------
# Locating keys in the TOML text (tomllib keeps no line numbers)
# ------------------------------------------------------------------------------------------------

_HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_ASSIGN = re.compile(r"""^\s*((?:[A-Za-z0-9_\-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_\-]+|"[^"]*"|'[^']*'))*)\s*=""")


def _dotted(s: str) -> tuple[str, ...]:
    parts = re.findall(r"""\s*("[^"]*"|'[^']*'|[^.]+)\s*(?:\.|$)""", s)
    return tuple(p.strip().strip("\"'") for p in parts if p.strip())


def line_of(text: str, table: tuple[str, ...], key: Optional[str] = None) -> int:
    """1-based line of ``key`` in ``[table]`` (or of the table's header when key is None); 0 if not found."""
    current: tuple[str, ...] = ()
    header_line = 0
    for n, line in enumerate(text.splitlines(), 1):
        header = _HEADER.match(line)
        if header:
            current = _dotted(header.group(1))
            if current == table:
                header_line = header_line or n
                if key is None:
                    return n
            continue
        assign = _ASSIGN.match(line)
        if assign and key is not None:
            path = current + _dotted(assign.group(1))
            if path == table + (key,):
                return n
            if (table + (key,))[: len(path)] == path:  # an inline table holding the key: `grpo = { mu = 0 }`
                header_line = header_line or n
    return header_line


# ------------------------------------------------------------------------------------------------
# Parsing and validation
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Cell:
    """One run of the matrix: everything needed to start it and to recognise it finished."""

    task: str
    task_label: str
    task_options: dict
    algo: str
    variant: str
    algo_options: dict
    seed: int
    budget: int
    completions_per_step: int
    steps: int
    eval_every: int  # in steps
    checkpoint_every: int  # in steps
    device: str
    precision: str

    @property
    def relpath(self) -> str:
        return f"{_slug(self.task_label)}/{_slug(self.variant)}/seed{self.seed}"

    @property
    def name(self) -> str:
        return f"{self.task_label} {self.variant} seed {self.seed}"

    def spec(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Plan:
    path: str
    text: str
    name: str
    description: str
    cells: list[Cell]
    timeout_s: float


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=+-]+", "_", label).strip("_")


def _label(base: str, varying: dict) -> str:
    return base if not varying else base + "(" + ",".join(f"{k}={v}" for k, v in varying.items()) + ")"


def _expand(options: dict) -> list[tuple[dict, dict]]:
    """Lists expand into their product: [(all options, the options that vary)]."""
    keys = [k for k, v in options.items() if isinstance(v, list)]
    fixed = {k: v for k, v in options.items() if k not in keys}
    out = []
    for values in itertools.product(*(options[k] for k in keys)):
        varying = dict(zip(keys, values))
        out.append(({**fixed, **varying}, varying))
    return out


def _field_kind(cls, name: str):
    hint = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def _type_ok(value: Any, kind) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is str:
        return isinstance(value, str)
    return not isinstance(value, (dict, list))


class _Checker:
    def __init__(self, path: str, text: str):
        self.path, self.text = path, text

    def fail(self, table: tuple[str, ...], key: Optional[str], message: str) -> typing.NoReturn:
        line = line_of(self.text, table, key)
        raise MatrixError(f"{self.path}:{line or '?'}: {message}")

    def int_key(self, data: dict, key: str, default: int, minimum: int, table: tuple = ()) -> int:
        value = data.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            self.fail(table, key, f"{key} must be an integer >= {minimum}, got {value!r}")
        return value


def parse(path: str | Path) -> Plan:
    """Read and validate a matrix file; every problem is a MatrixError naming the file's line."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"no such matrix file: {path}")
    text = path.read_text()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise MatrixError(f"{path}: invalid TOML: {exc}") from None
    check = _Checker(str(path), text)

    for key in data:
        if key not in RUN_KEYS:
            check.fail((), key, f"unknown key {key!r}; a matrix file has: {', '.join(RUN_KEYS)}")
    seeds = data.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        check.fail((), "seeds", f"seeds must be a non-empty list of integers, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        check.fail((), "seeds", f"seeds has duplicates: {seeds}")
    budget = check.int_key(data, "budget", 1024, 1)
    eval_every = check.int_key(data, "eval_every", 0, 0)
    checkpoint_every = check.int_key(data, "checkpoint_every", 0, 0)
    timeout_s = data.get("timeout_s", 0)
    if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or timeout_s < 0:
        check.fail((), "timeout_s", f"timeout_s must be a number >= 0, got {timeout_s!r}")
    device, precision = data.get("device", "auto"), data.get("precision", "auto")
    if device not in ("auto", "cpu") and not str(device).startswith("cuda"):
        check.fail((), "device", f"device must be auto, cpu or cuda, got {device!r}")
    if precision not in ("auto", "fp32", "bf16"):
        check.fail((), "precision", f"precision must be auto, fp32 or bf16, got {precision!r}")

    tasks = _tasks(check, data)
    algos = _algorithms(check, data)
    cells = []
    for task_name, task_label, task_options, task_budget, task_eval in tasks:
        budget_t = task_budget or budget
        eval_t = eval_every if task_eval is None else task_eval
        for algo_name, variant, algo_options, cps, table in algos:
            steps = budget_t // cps
            if steps < 1:
                where = ("tasks", task_name) if task_budget else ()
                check.fail(where, "budget", f"budget {budget_t} completions is less than one step of {variant} "
                                            f"({cps} completions per step)")
            for seed in seeds:
                cells.append(Cell(
                    task=task_name, task_label=task_label, task_options=task_options, algo=algo_name,
                    variant=variant, algo_options=algo_options, seed=seed, budget=budget_t,
                    completions_per_step=cps, steps=steps,
                    eval_every=max(1, eval_t // cps) if eval_t else 0,
                    checkpoint_every=max(1, checkpoint_every // cps) if checkpoint_every else 0,
                    device=device, precision=precision,
                ))
    if not cells:
        check.fail((), None, "the matrix has no cells: add [tasks.NAME] and [algorithms.NAME] tables")
    return Plan(str(path), text, str(data.get("name", path.stem)), str(data.get("description", "")), cells, float(timeout_s))


def _tasks(check: _Checker, data: dict) -> list[tuple[str, str, dict, Optional[int], Optional[int]]]:
    from benchmarks.cli import _task_parameters

    tables = data.get("tasks", {})
    if not isinstance(tables, dict) or not tables:
        check.fail((), "tasks", "the matrix needs at least one [tasks.NAME] table")
    out = []
    for name, options in tables.items():
        where = ("tasks", name)
        if name not in TASKS:
            check.fail(where, None, f"unknown task {name!r}; registered tasks: {', '.join(sorted(TASKS))}")
        if not isinstance(options, dict):
            check.fail(("tasks",), name, f"tasks.{name} must be a table")
        options = dict(options)
        task_budget = check.int_key(options, "budget", 0, 1, where) if "budget" in options else None
        task_eval = check.int_key(options, "eval_every", 0, 0, where) if "eval_every" in options else None
        options.pop("budget", None), options.pop("eval_every", None)
        params = _task_parameters(TASKS[name])
        params.pop("reward_fn", None)
        for key, value in options.items():
            if key not in params:
                check.fail(where, key, f"unknown option {key!r} of task {name}; it takes: "
                                       f"{', '.join(list(params) + list(TASK_RESERVED))}")
            values = value if isinstance(value, list) else [value]
            if not values:
                check.fail(where, key, f"{key} is an empty list")
            default = params[key].default
            kind = type(default) if isinstance(default, (int, float, str, bool)) else None
            for v in values:
                if kind is not None and not _type_ok(v, kind) or isinstance(v, (dict, list)):
                    check.fail(where, key, f"{key} of task {name} must be {kind.__name__ if kind else 'a scalar'}, got {v!r}")
                if key == "reward_mode" and v not in TASKS[name].reward_modes:
                    check.fail(where, key, f"task {name} has no reward mode {v!r}; "
                                           f"choose from {', '.join(TASKS[name].reward_modes)}")
        for full, varying in _expand(options):
            out.append((name, _label(name, varying), full, task_budget, task_eval))
    return out


def _algorithms(check: _Checker, data: dict) -> list[tuple[str, str, dict, int, str]]:
    tables = data.get("algorithms", {})
    if not isinstance(tables, dict) or not tables:
        check.fail((), "algorithms", "the matrix needs at least one [algorithms.NAME] table")
    out = []
    for table_name, options in tables.items():
        where = ("algorithms", table_name)
        if not isinstance(options, dict):
            check.fail(("algorithms",), table_name, f"algorithms.{table_name} must be a table")
        options = dict(options)
        algo = options.pop("algo", table_name)
        if algo not in ALGORITHMS:
            key = "algo" if "algo" in tables[table_name] else None
            check.fail(where, key, f"unknown algorithm {algo!r}; registered algorithms: {', '.join(sorted(ALGORITHMS))}")
        config_cls = ALGORITHMS[algo].Config
        fields = {f.name for f in dataclasses.fields(config_cls)}
        for key, value in options.items():
            if key not in fields:
                check.fail(where, key, f"{key!r} is not an option of {algo}; its options: {', '.join(sorted(fields))}")
            kind = _field_kind(config_cls, key)
            for v in (value if isinstance(value, list) else [value]):
                if not _type_ok(v, kind):
                    check.fail(where, key, f"{key} of {algo} must be {getattr(kind, '__name__', kind)}, got {v!r}")
            if isinstance(value, list) and not value:
                check.fail(where, key, f"{key} is an empty list")
        for full, varying in _expand(options):
            variant = _label(table_name, varying)
            trial = {"learning_rate": 1.0, **full}  # None means the task's rate, known only at run time
            try:
                config = config_cls(**trial)
                config.validate()
            except (ValueError, TypeError) as exc:
                key = next((k for k in sorted(full, key=len, reverse=True) if k in str(exc)), None)
                check.fail(where, key, f"impossible variant {variant}: {exc}")
            out.append((algo, variant, full, config.completions_per_step(), table_name))
    labels = [v for _, v, _, _, _ in out]
    for label in labels:
        if labels.count(label) > 1:
            check.fail(("algorithms",), None, f"two algorithm variants are both called {label!r}")
    return out


# ------------------------------------------------------------------------------------------------
# Running
# ------------------------------------------------------------------------------------------------


def _flags(options: dict) -> list[str]:
    args = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + key.replace("_", "-"))
        else:
            args += [flag, str(value)]
    return args


def cell_command(cell: Cell, out: Path, resume: bool) -> list[str]:
    cmd = [sys.executable, "-m", "benchmarks.cli", "run", "--task", cell.task, "--algo", cell.algo,
           "--steps", str(cell.steps), "--seed", str(cell.seed), "--out", str(out),
           "--eval-every", str(cell.eval_every), "--checkpoint-every", str(cell.checkpoint_every),
           "--device", cell.device, "--precision", cell.precision]
    cmd += _flags(cell.algo_options) + _flags(cell.task_options)
    return cmd + (["--resume"] if resume else [])


def _read_json(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def is_complete(cell_dir: Path, cell: Cell) -> bool:
    """Finished means: the same cell (same spec) and a summary that says complete at the planned step."""
    summary = _read_json(cell_dir / "summary.json")
    return (_read_json(cell_dir / "cell.json") == cell.spec() and summary is not None
            and summary.get("status") == CELL_COMPLETE and summary.get("steps") == cell.steps)


def _die_with_parent() -> None:
    # A cell must not outlive a matrix killed with SIGKILL: it would race the resumed matrix for its directory.
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _last_error_line(log: Path) -> str:
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").replace("\r", "\n").splitlines()]
    except OSError:
        return ""
    lines = [ln for ln in lines if ln and "it/s" not in ln and "s/it" not in ln]
    return lines[-1] if lines else ""


def run_cell(cell: Cell, cell_dir: Path, *, resume: bool, timeout_s: float = 0) -> dict:
    """Run one cell in its own process; returns its summary (a 'failed' one written here when the run could not)."""
    if not (resume and _read_json(cell_dir / "cell.json") == cell.spec()):
        shutil.rmtree(cell_dir, ignore_errors=True)  # stale checkpoints of another spec must never be resumed
        resume = False
    cell_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(cell_dir / "cell.json", cell.spec())
    env = dict(os.environ)
    root = str(Path(benchmarks.__file__).absolute().parents[1])  # the child runs this very code
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    log_path = cell_dir / "log.txt"
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cell_command(cell, cell_dir, resume), stdout=log, stderr=subprocess.STDOUT, env=env,
                                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        try:
            returncode = proc.wait(timeout=timeout_s or None)
            error = None
        except subprocess.TimeoutExpired:
            proc.kill()
            returncode = proc.wait()
            error = f"timed out after {timeout_s:g} s"
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    process_s = time.perf_counter() - start
    summary = _read_json(cell_dir / "summary.json")
    if returncode == 0 and summary and summary.get("status") == CELL_COMPLETE:
        summary["process_wall_clock_s"] = process_s  # start-up and evaluation included
        atomic_write_json(cell_dir / "summary.json", summary)
        return summary
    if error is None:
        if returncode < 0:
            name = signal.Signals(-returncode).name
            error = f"killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
        else:
            error = (summary or {}).get("error") or _last_error_line(log_path) or f"exit status {returncode}"
    failed = {
        **{k: v for k, v in (summary or {}).items() if k != "status"},
        "task": cell.task, "algo": cell.algo, "seed": cell.seed, "status": "failed", "error": error,
        "returncode": returncode, "process_wall_clock_s": process_s, "log": str(log_path),
    }
    atomic_write_json(cell_dir / "summary.json", failed)
    return failed


def _cell_line(i: int, n: int, cell: Cell, s: dict) -> str:
    head = f"[{i}/{n}] {cell.name}:"
    if s.get("status") != CELL_COMPLETE:
        return f"{head} FAILED: {s.get('error')}"
    return (f"{head} accuracy {s['accuracy_before']:.3f} -> {s['accuracy_after']:.3f}, reward {s['reward_before']:.3f} -> "
            f"{s['reward_after']:.3f}, {s['steps']} steps / {s['completions_generated']:.0f} completions, "
            f"{s['wall_clock_s']:.1f} s training ({s['process_wall_clock_s']:.1f} s in all), "
            f"peak {s['peak_memory_bytes'] / 2**20:.0f} MiB")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def run_matrix(plan: Plan, out: Path, *, resume: bool = False, progress: bool = True) -> dict[str, int]:
    """Run (or resume) every cell; returns counts of complete, failed and skipped cells."""
    out.mkdir(parents=True, exist_ok=True)
    lock = open(out / ".matrix.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise UsageError(f"another grpo-bench matrix is running in {out}") from None
    previous = _read_json(out / "matrix.json") or {}
    sessions = previous.get("sessions", []) if resume else []
    session = {"started": _now(), "elapsed_s": 0.0, "cells_run": 0, "cells_skipped": 0, "resume": resume}
    sessions.append(session)
    meta = {"name": plan.name, "description": plan.description, "file": plan.path, "toml": plan.text,
            "unit": "generated completions per cell", "cells": [{"dir": c.relpath, **c.spec()} for c in plan.cells],
            "sessions": sessions}
    atomic_write_json(out / "matrix.json", meta)
    counts = {"complete": 0, "failed": 0, "skipped": 0}
    start = time.perf_counter()
    bar = tqdm(total=len(plan.cells), desc=f"matrix {plan.name}", unit="cell", disable=not progress, dynamic_ncols=True)
    try:
        for i, cell in enumerate(plan.cells, 1):
            cell_dir = out / cell.relpath
            if resume and is_complete(cell_dir, cell):
                counts["skipped"] += 1
                session["cells_skipped"] += 1
                tqdm.write(f"[{i}/{len(plan.cells)}] {cell.name}: complete, skipped")
            else:
                bar.set_postfix_str(cell.name)
                summary = run_cell(cell, cell_dir, resume=resume, timeout_s=plan.timeout_s)
                counts["complete" if summary.get("status") == CELL_COMPLETE else "failed"] += 1
                session["cells_run"] += 1
                tqdm.write(_cell_line(i, len(plan.cells), cell, summary))
            session["elapsed_s"] = time.perf_counter() - start
            atomic_write_json(out / "matrix.json", meta)
            bar.update(1)
    finally:
        bar.close()
        session["elapsed_s"] = time.perf_counter() - start
        session["finished"] = _now()
        atomic_write_json(out / "matrix.json", meta)
        lock.close()
    return counts


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------


def cmd_matrix(args) -> int:
    plan = parse(args.file)
    out = Path(args.out)
    budgets = sorted({(c.task_label, c.budget) for c in plan.cells})
    print(f"matrix {plan.name}: {len(plan.cells)} cells, budget "
          + ", ".join(f"{t} {b}" for t, b in budgets) + " generated completions per cell")
    if args.dry_run:
        for cell in plan.cells:
            print(f"  {cell.relpath}: {cell.steps} steps x {cell.completions_per_step} completions "
                  f"= {cell.steps * cell.completions_per_step}, eval every {cell.eval_every or '-'} steps")
        return 0
    counts = run_matrix(plan, out, resume=args.resume, progress=not args.no_progress)
    sessions = (_read_json(out / "matrix.json") or {}).get("sessions", [])
    print(f"matrix {plan.name}: {counts['complete']} run and complete, {counts['skipped']} already complete, "
          f"{counts['failed']} failed; {sessions[-1]['elapsed_s']:.0f} s this session, "
          f"{sum(s['elapsed_s'] for s in sessions):.0f} s in all -> {out} (then: grpo-bench report {out})")
    return 1 if counts["failed"] else 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("matrix", help="run every task x algorithm variant x seed of a matrix file, each cell in its own process")
    p.add_argument("file", help="matrix file (TOML), e.g. benchmarks/default.toml")
    p.add_argument("--out", required=True, help="results directory (one sub-directory per cell)")
    p.add_argument("--resume", action="store_true", help="skip finished cells; re-run unfinished ones (from a checkpoint if any)")
    p.add_argument("--dry-run", action="store_true", help="validate the file and list the cells without running them")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (the per-cell lines remain)")
    p.set_defaults(handler=cmd_matrix)
