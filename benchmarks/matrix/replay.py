"""Replay: does a stored cell reproduce? ``grpo-bench replay STORE --cells K`` picks K complete cells of a result
store (benchmarks/store.py) at random, seeded, or the ones named, and runs each again from its stored spec in a fresh
``python -m benchmarks.matrix.cell`` process (benchmarks/matrix/cell.py), at the thread count the cell recorded
(1 where it recorded none), twice:

- at its recorded commit: a temporary ``git worktree add --detach`` of that commit, the process started there with
  PYTHONPATH pointing at it, the worktree removed afterwards. A commit this repository does not have, a cell that
  recorded no commit, and a cell recorded with uncommitted changes ("dirty": the code that ran is not that commit)
  are not run there, and the page says which.
- at HEAD: this checkout's code (with its uncommitted changes, if any: the page says so). A clean cell whose commit
  is HEAD's, in a clean checkout, is run once and counts for both.

The replay is compared with the stored cell value for value: every metric of every step, the wall-clock ones
(``time/...``, measurements of the machine, not results) aside, and the summary's before/after evaluation results
(accuracy, reward, format, ...). The verdict is "bit for bit" (every value equal, NaN equal to NaN); else "within
tolerance" (every number within ``TOLERANCE``, everything else equal) with the reason, what differs between the
host and libraries the cell recorded and this run's; else "differs", with the first differing step and metric and
the largest absolute difference; or "failed" (the run's last error line).

Each replayed cell's row goes to the page (markdown, led by a one-line headline) and its JSON beside it as soon as
it is done: a replay cut off keeps the cells it finished."""

from __future__ import annotations

import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

from benchmarks.errors import UsageError
from benchmarks.git import git, resolve
from benchmarks.io import atomic_write_json, atomic_write_text, read_json, read_jsonl
from benchmarks.markdown import markdown_table
from benchmarks.matrix.execute import _die_with_parent, last_error_line, thread_env
from benchmarks.store import ResultStore
from benchmarks.store import environment_changes as setting_changes

ROOT = Path(__file__).resolve().parents[2]  # this checkout: HEAD's code, and the git history commits are looked up in
AT = ("recorded", "head", "both")
# Wall-clock measurements: they differ between identical runs, so they are no part of what must reproduce.
TIME_PREFIX = "time/"
# "within tolerance": |stored - replayed| <= ATOL + RTOL * max(|stored|, |replayed|) for every number.
RTOL, ATOL = 1e-4, 1e-6
TOLERANCE = f"|a - b| <= {ATOL:g} + {RTOL:g} * max(|a|, |b|)"
BIT, WITHIN, DIFFERS, FAILED, NOT_RUN = "bit for bit", "within tolerance", "differs", "failed", "not run"


# ------------------------------------------------------------------------------------------------
# What a cell recorded
# ------------------------------------------------------------------------------------------------


def recorded_environment(summary: dict) -> dict:
    """The environment a cell's summary recorded (``config.environment``: code, device, versions, rounding)."""
    return ((summary.get("config") or {}).get("environment") or {}) if isinstance(summary, dict) else {}


def host(environment: dict) -> str:
    """One line for a recorded environment: device, vector capability, bf16 instructions (where recorded), torch."""
    if not environment:
        return "not recorded"
    capability = (environment.get("rounding") or {}).get("cpu_capability")
    bf16 = environment.get("cpu_bf16")
    torch_version = (environment.get("versions") or {}).get("torch")
    parts = (environment.get("device_name"), capability, bf16 and f"bf16 {bf16}",
             torch_version and f"torch {torch_version}")
    return ", ".join(str(x) for x in parts if x)


def environment_changes(before: dict, after: dict) -> list[str]:
    """What differs between the environment a cell recorded and the replay's among what changes rounding: the
    device, its bf16 instructions (where both record them), the CPU's vector capability and the thread settings,
    and each library's version."""
    changes = []
    if before.get("device_name") != after.get("device_name"):
        changes.append(f"device {before.get('device_name')} -> {after.get('device_name')}")
    if "cpu_bf16" in before and "cpu_bf16" in after and before["cpu_bf16"] != after["cpu_bf16"]:
        changes.append(f"bf16 instructions {before['cpu_bf16']} -> {after['cpu_bf16']}")
    return changes + setting_changes(before, after, ("rounding", "versions"))


def summary_results(summary: dict) -> dict:
    """The summary's before/after evaluation results (accuracy_after, reward_before, ...): the numbers a cell's
    verdicts are computed from."""
    return {k: v for k, v in sorted(summary.items()) if k.endswith(("_before", "_after"))
            and isinstance(v, (int, float)) and not isinstance(v, bool)}


# ------------------------------------------------------------------------------------------------
# Comparing a replay with the stored cell
# ------------------------------------------------------------------------------------------------


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def compare(stored_rows: list[dict], stored_summary: dict, rows: list[dict], summary: dict) -> dict:
    """The verdict on a replay (its metrics ``rows`` and ``summary``) against the stored cell: ``status`` (BIT,
    WITHIN or DIFFERS), ``values`` compared, the ``first`` difference (step, metric, stored, replayed; step
    "summary" for the summary's results) and the ``max_abs_diff`` over the numbers both hold (with its step and
    metric). A row, metric or result only one side has is a difference beyond any tolerance."""
    stored = {r["step"]: r for r in stored_rows}
    replayed = {r["step"]: r for r in rows}
    pairs = []  # (step, metric, stored value, replayed value); None: missing on that side
    for step in sorted(set(stored) | set(replayed)):
        a, b = stored.get(step, {}), replayed.get(step, {})
        for metric in sorted((set(a) | set(b)) - {"step"}):
            if not metric.startswith(TIME_PREFIX):
                pairs.append((step, metric, a.get(metric), b.get(metric)))
    a, b = summary_results(stored_summary), summary_results(summary)
    pairs += [("summary", key, a.get(key), b.get(key)) for key in sorted(set(a) | set(b))]
    first, within, largest = None, True, None
    for step, metric, x, y in pairs:
        if _same(x, y):
            continue
        first = first or {"step": step, "metric": metric, "stored": x, "replayed": y}
        if _number(x) and _number(y):
            diff = abs(float(x) - float(y))
            diff = math.inf if math.isnan(diff) else diff
            if largest is None or diff > largest["value"]:
                largest = {"value": diff, "step": step, "metric": metric}
            within = within and diff <= ATOL + RTOL * max(abs(float(x)), abs(float(y)))
        else:
            within = False
    status = BIT if first is None else WITHIN if within else DIFFERS
    return {"status": status, "values": len(pairs), "steps": len(stored), "first": first,
            "max_abs_diff": largest}


# ------------------------------------------------------------------------------------------------
# Running a stored spec
# ------------------------------------------------------------------------------------------------


def run_spec(spec: dict, code: Path, threads: int, work: Path) -> dict:
    """Run the cell ``spec`` with the code at ``code`` (PYTHONPATH and working folder) in a fresh process, in a cell
    folder under ``work``: its returncode, metrics rows, summary, seconds and, when it failed, its last error line."""
    cell_dir = work / "cell"
    cell_dir.mkdir(parents=True)
    atomic_write_json(cell_dir / "cell.json", spec)
    # The code at ``code`` first and this checkout not at all: an old commit must not import today's modules.
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and Path(p).resolve() not in (ROOT, Path(code).resolve())]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), *rest]), **thread_env(threads)}
    env.pop("GRPO_BENCH_REVISION", None)  # the code's own git checkout says what ran
    start = time.perf_counter()
    with open(cell_dir / "log.txt", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks.matrix.cell", str(cell_dir), "--threads",
                                 str(threads)], cwd=code, env=env, stdout=log, stderr=subprocess.STDOUT,
                                # a replay killed (out of memory) must not leave its cell running unseen for minutes
                                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        try:
            returncode = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    summary = read_json(cell_dir / "summary.json") or {}
    done = returncode == 0 and summary.get("status") == "complete"
    return {"returncode": returncode, "seconds": time.perf_counter() - start, "summary": summary,
            "rows": read_jsonl(cell_dir / "metrics.jsonl") if (cell_dir / "metrics.jsonl").exists() else [],
            "error": None if done else failure(returncode, summary, cell_dir / "log.txt")}


def failure(returncode: int, summary: dict, log: Path) -> str:
    """Why a cell's process did not finish it: the signal that killed it (its log's last line is then whatever it
    was printing, a progress line), else the error its summary or its log's last line names."""
    if returncode < 0:
        name = signal.Signals(-returncode).name
        return f"killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
    return summary.get("error") or last_error_line(log) or f"exit status {returncode}"


@contextmanager
def checkout(commit: str, repo: Path = ROOT) -> Iterator[Path]:
    """A temporary detached worktree of ``commit`` (``git worktree add --detach``), removed on leaving."""
    parent = Path(tempfile.mkdtemp(prefix="grpo-bench-replay-"))
    path = parent / "code"
    git(str(repo), "worktree", "add", "--detach", "--quiet", str(path), commit)
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(path)], capture_output=True)
        shutil.rmtree(parent, ignore_errors=True)
        subprocess.run(["git", "-C", str(repo), "worktree", "prune"], capture_output=True)


def head_revision(repo: Path = ROOT) -> dict:
    """HEAD's commit and whether the checkout's code (algorithms, tasks, benchmarks) has uncommitted changes, as a
    cell records its own (benchmarks/harness/measure.py's ``code_revision``)."""
    from benchmarks.harness.measure import code_revision  # heavy: torch

    return code_revision() or {"commit": None, "dirty": None}


def in_history(commit: Optional[str], repo: Path = ROOT) -> bool:
    if not commit:
        return False
    try:
        resolve(str(repo), commit)
    except UsageError:
        return False
    return True


# ------------------------------------------------------------------------------------------------
# Choosing the cells
# ------------------------------------------------------------------------------------------------


def open_store(directory: Path | str) -> ResultStore:
    directory = Path(directory)
    if not directory.exists():
        raise UsageError(f"{directory}: no such folder (a matrix directory with a result store)")
    if not directory.is_dir():
        raise UsageError(f"{directory}: a file, not a matrix directory with a result store")
    store = ResultStore.read(directory)
    if store is None:
        raise UsageError(f"{directory}: no result store (results.parquet) to replay")
    return store


def choose(store: ResultStore, count: Optional[int], names: Optional[list[str]], seed: int) -> list[str]:
    """The cells to replay: ``names`` as given (each must be in the store), else ``count`` complete cells drawn at
    random with ``seed``, in the store's order. A count above the complete cells the store holds is refused."""
    if names:
        unknown = [n for n in names if n not in store.cells]
        if unknown:
            known = sorted(store.cells)
            raise UsageError(f"--cell {unknown[0]}: no such cell in {store.path} (it holds {len(known)}: "
                             f"{', '.join(known[:3])}{', ...' if len(known) > 3 else ''})")
        return list(dict.fromkeys(names))
    complete = [k for k, v in store.cells.items() if (v.get("summary") or {}).get("status") == "complete"]
    if count is None or count < 1:
        raise UsageError("--cells K (at least 1) or --cell NAME: which cells to replay")
    if count > len(complete):
        raise UsageError(f"--cells {count}: {store.path} holds {len(complete)} complete cell"
                         f"{'' if len(complete) == 1 else 's'}; ask for at most that many")
    chosen = set(random.Random(seed).sample(sorted(complete), count))
    return [k for k in store.cells if k in chosen]


# ------------------------------------------------------------------------------------------------
# One cell's replay
# ------------------------------------------------------------------------------------------------


def _outcome(run: dict, stored_rows: list[dict], stored_summary: dict, recorded_env: dict) -> dict:
    """A run's verdict against the stored cell, with the environment changes that could explain a difference."""
    env = recorded_environment(run["summary"])
    base = {"seconds": round(run["seconds"], 1), "host": host(env), "changes": environment_changes(recorded_env, env)}
    if run["error"]:
        return {**base, "status": FAILED, "error": run["error"]}
    # The replay's rows read back through a store, as the stored ones were (numbers as float64)
    with tempfile.TemporaryDirectory(prefix="grpo-bench-replay-rows-") as tmp:
        ResultStore.open(tmp).put("cell", {}, run["summary"], run["rows"])
        rows = ResultStore.open(tmp).metrics("cell")
    verdict = compare(stored_rows, stored_summary, rows, run["summary"])
    if verdict["status"] == WITHIN:
        verdict["reason"] = ("; ".join(base["changes"]) if base["changes"]
                             else "same host and libraries as recorded: not explained")
    return {**base, **verdict}


def not_run(why: str, short: str) -> dict:
    """The outcome of a cell not run at a place: ``why`` for its row, ``short`` for the headline's count."""
    return {"status": NOT_RUN, "why": why, "why_short": short}


def replay_cell(store: ResultStore, relpath: str, at: str, head: dict, log: Callable[[str], None],
                runner: Callable = run_spec, repo: Path = ROOT) -> dict:
    """One cell replayed at its recorded commit and/or HEAD (``at``): its row of the report."""
    spec, summary = store.spec(relpath), store.summary(relpath) or {}
    env = recorded_environment(summary)
    code = env.get("code") or {}
    commit, dirty = code.get("commit"), code.get("dirty")
    recorded_threads = summary.get("threads")
    threads = recorded_threads if isinstance(recorded_threads, int) and recorded_threads > 0 else 1
    row = {"cell": relpath, "commit": commit, "dirty": dirty, "recorded_host": host(env), "threads": threads,
           "threads_from": "recorded" if threads == recorded_threads else "none recorded: 1",
           "recorded_s": summary.get("cell_s"), "task": (spec or {}).get("task"), "at_commit": None, "at_head": None}
    if summary.get("status") != "complete":
        row["at_commit"] = row["at_head"] = not_run(f"the stored cell is {summary.get('status')}", "not complete")
        return row
    stored_rows = store.metrics(relpath)
    cell_s = summary.get("cell_s")
    cost = f"recorded {cell_s:.0f} s" if isinstance(cell_s, (int, float)) else "cost not recorded"
    same_as_head = bool(commit) and dirty is False and commit == head.get("commit") and head.get("dirty") is False

    def replayed(where: str, code_root: Path) -> dict:
        log(f"  {relpath} at {where} ({cost}, {threads} thread{'s' if threads > 1 else ''}) ...")
        with tempfile.TemporaryDirectory(prefix="grpo-bench-replay-") as work:
            outcome = _outcome(runner(spec, code_root, threads, Path(work)), stored_rows, summary, env)
        log(f"  {relpath} at {where}: {describe(outcome)}")
        return outcome

    if at in ("recorded", "both"):
        if not commit:
            row["at_commit"] = not_run("no commit recorded", "no commit recorded")
        elif dirty:
            row["at_commit"] = not_run("recorded with uncommitted changes: the code that ran is not its commit",
                                       "recorded with uncommitted changes")
        elif not in_history(commit, repo):
            row["at_commit"] = not_run(f"commit {commit[:10]} is not in this repository's history",
                                       "commit not in this repository's history")
        elif same_as_head and at == "both":
            pass  # the HEAD run below is this commit's run
        else:
            with checkout(commit, repo) as code_root:
                row["at_commit"] = replayed(f"commit {commit[:10]}", code_root)
    if at in ("head", "both"):
        label = f"HEAD {str(head.get('commit'))[:10]}" + (" with uncommitted changes" if head.get("dirty") else "")
        row["at_head"] = replayed(label, repo)
        if same_as_head and at == "both":
            row["at_commit"] = {**row["at_head"], "same_as_head": True}
    return row


def describe(outcome: Optional[dict]) -> str:
    """One cell of the report's table (and a progress line): the verdict and what backs it."""
    if outcome is None:
        return "-"
    status = outcome["status"]
    if status == NOT_RUN:
        return f"not run: {outcome['why']}"
    if status == FAILED:
        return f"failed: {outcome['error']}"
    if status == BIT:
        steps = outcome["steps"]
        return f"bit for bit ({outcome['values']} values, {steps} step{'s' if steps != 1 else ''})"
    largest = outcome["max_abs_diff"]
    big = f"max abs diff {largest['value']:.3g} ({largest['metric']}, step {largest['step']})" if largest else ""
    if status == WITHIN:
        return f"within tolerance ({big}; {outcome['reason']})"
    first = outcome["first"]
    text = (f"differs from step {first['step']}, {first['metric']}: stored {_short(first['stored'])}, replayed "
            f"{_short(first['replayed'])}" + (f"; {big}" if big else ""))
    return text + (f"; host/library changes: {'; '.join(outcome['changes'])}" if outcome.get("changes") else "")


def _short(value) -> str:
    if value is None:
        return "missing"
    if _number(value):
        return f"{value:.9g}"
    text = str(value)
    return text if len(text) <= 24 else text[:21] + "..."


# ------------------------------------------------------------------------------------------------
# The report
# ------------------------------------------------------------------------------------------------


def headline(rows: list[dict], planned: int) -> str:
    """"7 of 8 reproduced bit for bit at their commit, ...": at each place the cells ran, how many reproduced and
    how the others ended, and how many were not run there and why."""
    parts = []
    for key, where in (("at_commit", "at their commit"), ("at_head", "at HEAD")):
        outcomes = [r[key] for r in rows if r[key] is not None]
        ran = [o for o in outcomes if o["status"] != NOT_RUN]
        skipped = [o["why_short"] for o in outcomes if o["status"] == NOT_RUN]
        if not outcomes:
            continue
        counts = {s: sum(o["status"] == s for o in ran) for s in (WITHIN, DIFFERS, FAILED)}
        text = (f"{sum(o['status'] == BIT for o in ran)} of {len(ran)} reproduced bit for bit {where}" if ran
                else f"none ran {where}")
        extra = [f"{n} {s}" for s, n in counts.items() if n]
        extra += [f"{skipped.count(w)} not run: {w}" for w in dict.fromkeys(skipped)]
        parts.append(text + (f" ({', '.join(extra)})" if extra else ""))
    line = "; ".join(parts) or "no cell replayed"
    return line + (f" -- {len(rows)} of {planned} cells replayed so far" if len(rows) < planned else "")


def render(report: dict) -> str:
    rows = report["rows"]
    table = markdown_table(
        ["cell", "recorded commit", "recorded host", "threads", "at its commit", "at HEAD"],
        [[f"`{r['cell']}`", (f"`{r['commit'][:10]}`" if r["commit"] else "none")
          + (" (uncommitted changes)" if r["dirty"] else ""), r["recorded_host"],
          f"{r['threads']} ({r['threads_from']})", describe(r["at_commit"]), describe(r["at_head"])] for r in rows])
    head = report["head"]
    return "\n".join([
        f"# Replay of `{report['store']}`", "",
        f"**{headline(rows, report['planned'])}.**", "",
        f"{report['planned']} of the store's {report['store_cells']} cells ({report['chosen']}), each run again from "
        f"its stored spec in a fresh process at its recorded commit (a temporary worktree) and at HEAD "
        f"(`{str(head.get('commit'))[:10]}`{' with uncommitted changes' if head.get('dirty') else ''}), at the "
        f"thread count it recorded. This host: {report['host']}.", "",
        "Compared: every metric of every step except the wall-clock ones (`time/...`), and the summary's before/after "
        f"evaluation results (accuracy, reward, format, ...). Bit for bit: every value equal (NaN equal to NaN). "
        f"Within tolerance: every number within {TOLERANCE}, the reason being what differs between the host and "
        "libraries the cell recorded and the replay's. Else the first differing step and metric and the largest "
        "absolute difference.", "",
        table, "",
        f"Regenerate: `{report['command']}`", ""])


def this_host() -> str:
    import torch  # heavy

    from benchmarks.harness.measure import cpu_bf16_instructions, cpu_name

    return (f"{cpu_name()}, {torch.backends.cpu.get_cpu_capability()}, bf16 {cpu_bf16_instructions()}, "
            f"torch {torch.__version__}")


def replay(store_dir: Path | str, *, count: Optional[int] = None, names: Optional[list[str]] = None, seed: int = 0,
           at: str = "both", out: Path | str, command: str = "", log: Callable[[str], None] = print,
           runner: Callable = run_spec, repo: Path = ROOT) -> dict:
    """Replay the chosen cells of ``store_dir``'s store; the page goes to ``out`` and its JSON beside it (same name,
    .json), rewritten after each cell. Returns the report."""
    if at not in AT:
        raise UsageError(f"--at {at}: one of {', '.join(AT)}")
    store = open_store(store_dir)
    chosen = choose(store, count, names, seed)
    out = Path(out)
    head = head_revision(repo)
    recorded = [(store.summary(c) or {}).get("cell_s") for c in chosen]
    known = [s for s in recorded if isinstance(s, (int, float))]
    runs = 2 if at == "both" else 1
    log(f"replay {store_dir}: {len(chosen)} cell{'s' if len(chosen) > 1 else ''}"
        + (f", recorded {sum(known):.0f} s of cell time in all, up to {runs}x that to run" if known else "")
        + (f" ({len(recorded) - len(known)} without a recorded time)" if len(known) < len(recorded) else "")
        + f" -> {out}")
    report = {"store": str(store_dir), "store_cells": len(store.cells), "planned": len(chosen),
              "chosen": f"named: {', '.join(chosen)}" if names else f"drawn at random with seed {seed}",
              "seed": seed, "at": at, "head": head, "host": this_host(), "tolerance": TOLERANCE,
              "command": command, "rows": []}
    for i, relpath in enumerate(chosen, 1):
        log(f"[{i}/{len(chosen)}] {relpath}")
        report["rows"].append(replay_cell(store, relpath, at, head, log, runner, repo))
        atomic_write_json(out.with_suffix(".json"), report)
        atomic_write_text(out, render(report))
    report["headline"] = headline(report["rows"], report["planned"])
    atomic_write_json(out.with_suffix(".json"), report)
    return report


def default_out(store_dir: Path | str) -> Path:
    """results/replay/NAME.md: NAME the store's folder below ./results with '/' as '-' (calibration/aa ->
    calibration-aa), or its folder's name when it is not under ./results."""
    path = Path(store_dir).resolve()
    try:
        name = "-".join(path.relative_to(Path("results").resolve()).parts)
    except ValueError:
        name = path.name
    return Path("results") / "replay" / f"{name or 'store'}.md"
