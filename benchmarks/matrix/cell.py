"""One matrix cell's process: ``python -m benchmarks.matrix.cell CELL_DIR [--resume] [--threads N]``.

Reads CELL_DIR/cell.json (written by the matrix: the run's full resolved settings) and runs it with
the harness into CELL_DIR; no command line is rebuilt from options. Exit status as ``grpo-bench run``:
0 done, 1 the run failed, 2 bad input (one line on stderr).

``python -m benchmarks.matrix.cell --worker`` is a *warm worker*: it pays the torch / transformers
import once and then runs cell after cell, one JSON line per cell on stdin (``{"cell_dir", "resume",
"threads"}``) and one JSON line back per cell (``{"returncode", "error", "timing"}``), each cell's
output going to its own log.txt. Between cells it resets what a fresh process would start with
(``reset_process_state``): the thread count, grad mode and default dtype, the peak-memory high-water
mark (VmHWM through /proc/self/clear_refs; CUDA's peak statistics), and it frees the previous cell's
memory; the seeds are set by the harness's ``build`` as in a fresh process. A cell run this way writes
the same metrics rows as in a fresh process at the same thread count (tests/benchmarks/matrix/test_executors.py).

Either way the cell writes CELL_DIR/timing.json: ``startup_s`` (process start and imports this cell
paid for: 0 for a warm worker's later cells), ``reset_s``, ``build_s`` (task, policy, algorithm),
``eval_s`` (every evaluation), ``cell_s`` (the whole in-process run) and the peak-memory method.
"""

from __future__ import annotations

import time

_SPAWNED_AT = time.time()  # before the heavy imports below: they are start-up too

import ctypes  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Optional  # noqa: E402

import torch  # noqa: E402

from benchmarks.errors import TrainingFailed, UsageError  # noqa: E402
from benchmarks.harness.config import resolve  # noqa: E402
from benchmarks.harness.loop import run  # noqa: E402
from benchmarks.io import atomic_write_json, read_json  # noqa: E402
from benchmarks.plugins import load_plugins  # noqa: E402
from tasks import TaskError  # noqa: E402

SPAWN_ENV = "GRPO_BENCH_SPAWNED_AT"  # the parent's time.time() when it started this process


def startup_seconds() -> float:
    """Seconds from the parent starting this process (or, without that, from this module's first line) to now."""
    spawned = float(os.environ.get(SPAWN_ENV) or _SPAWNED_AT)
    return max(0.0, time.time() - spawned)


# ------------------------------------------------------------------------------------------------
# Resetting a process between cells
# ------------------------------------------------------------------------------------------------


def _clear_refs() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux >= 4.0: write 5 to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _release_memory() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # give the previous cell's freed heap back, so RSS starts low
    except (OSError, AttributeError):
        pass


def reset_process_state(threads: int = 0) -> dict:
    """Put this process back in the state a fresh cell process starts in; returns how peak memory is measured."""
    _release_memory()
    if threads:
        torch.set_num_threads(threads)
    torch.set_grad_enabled(True)
    torch.set_default_dtype(torch.float32)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
        for i in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(i)
    return {"peak_rss_method": "VmHWM (reset via /proc/self/clear_refs)" if _clear_refs() else "sampled max RSS"}


class _RssSampler:
    """Max RSS sampled every 20 ms: the fallback peak where VmHWM cannot be reset (it then under-reads
    short spikes; the summary says which method it used)."""

    def __init__(self):
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while True:
            try:
                with open("/proc/self/statm") as f:
                    self.peak = max(self.peak, int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
            except OSError:
                return
            if self._stop.wait(0.02):
                return

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


# ------------------------------------------------------------------------------------------------
# One cell
# ------------------------------------------------------------------------------------------------


def run_cell_dir(cell_dir: Path, *, resume: bool, progress: bool = True, threads: int = 0,
                 startup_s: float = 0.0, reset: Optional[dict] = None) -> dict:
    """Run the cell described by ``cell_dir/cell.json`` in this process; returns its summary.

    Writes ``cell_dir/timing.json`` (also when the run fails)."""
    cell_dir = Path(cell_dir)
    start = time.perf_counter()
    reset = reset or reset_process_state(threads)
    timing = {"startup_s": startup_s, "reset_s": time.perf_counter() - start, "build_s": 0.0, "eval_s": 0.0,
              "threads": torch.get_num_threads(), "pid": os.getpid(), **reset}
    sampler = _RssSampler() if reset.get("peak_rss_method") == "sampled max RSS" else None
    begun = time.perf_counter()

    def on_build(task, policy, algo):
        timing["build_s"] = time.perf_counter() - begun
        evaluate = task.evaluate

        def timed_evaluate(*args, **kwargs):
            t = time.perf_counter()
            try:
                return evaluate(*args, **kwargs)
            finally:
                timing["eval_s"] += time.perf_counter() - t

        task.evaluate = timed_evaluate  # an instance attribute: this task object only

    try:
        spec = read_json(cell_dir / "cell.json")
        if spec is None or "settings" not in spec:
            raise UsageError(f"{cell_dir}: no readable cell.json with settings")
        load_plugins()
        rc, algo_config, task_options = resolve({**spec["settings"], "out": str(cell_dir), "resume": resume})
        summary = run(rc, algo_config, task_options, progress=progress, on_build=on_build)
        if sampler is not None:  # VmHWM could not be reset: it would carry an earlier cell's peak
            summary.update(peak_memory_bytes=sampler.peak, peak_memory_kind="process_peak_rss_sampled")
            atomic_write_json(cell_dir / "summary.json", summary)
        return summary
    finally:
        if sampler is not None:
            sampler.stop()
        timing["cell_s"] = time.perf_counter() - begun
        if cell_dir.is_dir():
            atomic_write_json(cell_dir / "timing.json", timing)


def run_guarded(cell_dir: Path, *, resume: bool, progress: bool = True, threads: int = 0,
                startup_s: float = 0.0) -> tuple[int, Optional[str]]:
    """``run_cell_dir`` with ``main``'s exit statuses: (0 | 1 | 2, the one-line error)."""
    try:
        run_cell_dir(cell_dir, resume=resume, progress=progress, threads=threads, startup_s=startup_s)
    except (UsageError, TaskError) as exc:
        print(f"grpo-bench: error: {exc}", file=sys.stderr)
        return 2, str(exc)
    except TrainingFailed as exc:
        print(f"grpo-bench: failed: {exc}", file=sys.stderr)
        return 1, None  # the summary holds the error
    except Exception as exc:  # a fresh process would die with this traceback and exit status 1
        traceback.print_exc()
        return 1, f"{type(exc).__name__}: {exc}"
    return 0, None


# ------------------------------------------------------------------------------------------------
# The warm worker
# ------------------------------------------------------------------------------------------------


def worker(control_in, control_out) -> int:
    """Run cells named on ``control_in`` (JSON lines) until it closes; answer each on ``control_out``."""
    startup = startup_seconds()
    for line in control_in:
        if not line.strip():
            continue
        job = json.loads(line)
        cell_dir = Path(job["cell_dir"])
        sys.stdout.flush(), sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        with open(cell_dir / "log.txt", "w") as log:
            os.dup2(log.fileno(), 1), os.dup2(log.fileno(), 2)
            try:
                returncode, error = run_guarded(cell_dir, resume=job["resume"], progress=job.get("progress", True),
                                                threads=job.get("threads", 0), startup_s=startup)
            finally:
                sys.stdout.flush(), sys.stderr.flush()
                os.dup2(saved[0], 1), os.dup2(saved[1], 2)
                os.close(saved[0]), os.close(saved[1])
        startup = 0.0  # paid once, by this worker's first cell
        control_out.write(json.dumps({"returncode": returncode, "error": error}) + "\n")
        control_out.flush()
    return 0


def main(argv: list[str]) -> int:
    # A cell's output goes to its log.txt, never a terminal: no library's progress-bar frames in it.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import transformers

    transformers.utils.logging.disable_progress_bar()
    if argv[:1] == ["--worker"]:
        # Control messages travel on the original stdout; anything a library prints goes to stderr instead.
        control_out = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
        return worker(sys.stdin, control_out)
    if not argv or argv[0].startswith("-"):
        print("usage: python -m benchmarks.matrix.cell CELL_DIR [--resume] [--threads N] | --worker", file=sys.stderr)
        return 2
    threads = int(argv[argv.index("--threads") + 1]) if "--threads" in argv else 0
    returncode, _ = run_guarded(Path(argv[0]), resume="--resume" in argv[1:], threads=threads,
                                startup_s=startup_seconds())
    return returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
