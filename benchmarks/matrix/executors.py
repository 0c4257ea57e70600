"""Executors that run a matrix's cells, each registered by name with ``@register_executor``: ``local`` (warm
worker processes on this machine, the default), ``subprocess`` (a fresh process per cell: one at a time, the
baseline, or ``jobs`` at once), ``ray`` (a Ray task per cell, local instance or a cluster) and ``slurm`` (a
submitit job per cell). Each declares its options as a dataclass, ``Options``, whose fields become
``grpo-bench matrix`` flags, and implements ``run(jobs, on_done)``; ``on_done`` is always called in the
driver, which alone writes the matrix's record. An installed package adds one through the entry-point group
``grpo_bench.executors``, registered when this module is first imported (``load_executor_plugins``).

Semantics shared by all: a cell is finished only when its summary says complete (``--resume`` skips
finished cells and re-runs the others from their last checkpoint where the cell directory holds one); a
cell whose process dies is retried (Ray, Slurm: ``max_retries`` times, from its last checkpoint) or
recorded as failed (local: the worker is replaced), and the matrix goes on.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib
import io
import json
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from algorithms.registry import register_named
from benchmarks.errors import UsageError
from benchmarks.io import atomic_write_json, read_json
from benchmarks.matrix import cell as cell_process
from benchmarks.matrix.execute import (
    CellJob, SubprocessExecutor, _child_env, _die_with_parent, cell_process_command, finish_cell, prepare_cell_dir,
)
from benchmarks.plugins import register_entry_points

# ------------------------------------------------------------------------------------------------
# The registry
# ------------------------------------------------------------------------------------------------


class RegisteredExecutor:
    """What ``register_executor`` takes: a ``name``, an ``Options`` dataclass whose fields (each with a one-line
    ``help`` in its metadata) are the executor's ``grpo-bench matrix`` flags, and ``run(jobs, on_done)``
    (``execute.Executor``). It is built as ``cls(options)``; ``requires`` names a module it needs and the pip
    extra of this package that installs it."""

    name: str
    Options: type
    requires: Optional[tuple[str, str]] = None  # (module, pip extra)
    jobs: Optional[int] = None  # cells at once, resolved by run(); matrix.json's session records it

    def __init__(self, options=None):
        self.options = self.Options() if options is None else options


# Filled by ``register_executor`` at each executor's definition and, for installed plug-ins, from the
# entry-point group ``grpo_bench.executors`` (``load_executor_plugins``, at the end of this module).
EXECUTORS: dict[str, type[RegisteredExecutor]] = {}


def register_executor(cls=None, *, name: Optional[str] = None):
    """Class decorator: ``EXECUTORS[name or cls.name] = cls``. A second, different class under a taken name is
    refused (re-registering the same class is a no-op, so a module may be imported twice)."""

    def register(cls):
        if not (isinstance(cls, type) and issubclass(cls, RegisteredExecutor)
                and dataclasses.is_dataclass(getattr(cls, "Options", None))):
            raise TypeError(f"{cls!r} is not a subclass of benchmarks.matrix.executors.RegisteredExecutor "
                            "with an Options dataclass")
        return register_named(EXECUTORS, "executor", name or cls.name, cls)

    return register if cls is None else register(cls)


def executor_class(name: str) -> type[RegisteredExecutor]:
    """The registered executor ``name``, or one UsageError line listing the choices."""
    try:
        return EXECUTORS[name]
    except KeyError:
        raise UsageError(f"unknown executor {name!r}; choose from {', '.join(sorted(EXECUTORS))}") from None


def executor_option_names() -> set[str]:
    """Every registered executor's option names (the flags ``grpo-bench matrix`` adds for executors)."""
    return {f.name for cls in EXECUTORS.values() for f in dataclasses.fields(cls.Options)}


def make_executor(name: str, **options) -> RegisteredExecutor:
    """The executor ``--executor NAME`` names, built from those of ``options`` that are its own; another
    executor's options are ignored (the command line hands over every executor flag given), a name no executor
    declares is a TypeError. A missing optional extra is a UsageError naming its pip command."""
    cls = executor_class(name)
    unknown = set(options) - executor_option_names()
    if unknown:
        raise TypeError(f"make_executor() got options no executor declares: {', '.join(sorted(unknown))}")
    own = {f.name for f in dataclasses.fields(cls.Options)}
    executor = cls(cls.Options(**{k: v for k, v in options.items() if k in own}))
    if cls.requires:
        require_extra(cls)  # fail before anything runs
    return executor


def require_extra(executor):
    """The module ``executor`` (a class or an instance) requires, or UsageError naming the pip command (one line,
    exit status 2)."""
    module, extra = executor.requires
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UsageError(f"--executor {executor.name} needs {module}, which is not installed: "
                         f"pip install -e \".[{extra}]\"") from None


def _check_jobs(jobs: int) -> None:
    if jobs < 0:
        raise UsageError(f"--jobs must be >= 1 (or 0: what fits the cores), got {jobs}")


# ------------------------------------------------------------------------------------------------
# Shared by the executors
# ------------------------------------------------------------------------------------------------


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def default_jobs(jobs: list[CellJob] | None = None) -> int:
    """As many cells at once as fit the cores, each with its num_cpus (1 where the matrix names none)."""
    need = max([j.cell.resources.get("num_cpus", 1) for j in jobs or []] or [1])
    return max(1, cpu_count() // need)


def _cell_threads(job: CellJob, share: int) -> int:
    return job.threads or job.cell.resources.get("num_cpus") or share


def slots_and_share(requested: int, jobs: list[CellJob]) -> tuple[int, int]:
    """How many cells run at once (``requested``; 0: what fits the cores; never more than there are cells) and
    each one's share of the cores as torch threads, which a cell whose matrix names no num_cpus runs with."""
    slots = min(requested or default_jobs(jobs), len(jobs))
    return slots, max(1, cpu_count() // slots)


def run_in_slots(slots: int, jobs: list[CellJob], run_cell: Callable[[int, CellJob], dict],
                 on_done: Callable[[CellJob, dict], None]) -> None:
    """``run_cell(slot, job)`` for every job on ``slots`` threads, each slot taking the next job when its cell
    ends; ``on_done`` is called one cell at a time. An exception in a slot stops every slot from taking another
    cell and is raised here once they are back."""
    todo: queue.Queue = queue.Queue()
    for job in jobs:
        todo.put(job)
    lock, stop, errors = threading.Lock(), threading.Event(), []

    def slot(i: int) -> None:
        try:
            while not stop.is_set():
                try:
                    job = todo.get_nowait()
                except queue.Empty:
                    return
                summary = run_cell(i, job)
                with lock:
                    if not stop.is_set():
                        on_done(job, summary)
        except BaseException as exc:  # noqa: BLE001 -- handed to the driver's thread
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=slot, args=(i,), daemon=True) for i in range(slots)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():  # joined in short waits, so that Ctrl-C reaches the driver
                t.join(0.2)
    finally:
        stop.set()
    if errors:
        raise errors[0]


def _process_age_s() -> float:
    """Seconds since this process started (from /proc; 0 where unknown)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


# ------------------------------------------------------------------------------------------------
# local: warm worker processes
# ------------------------------------------------------------------------------------------------


class _Worker:
    """One ``python -m benchmarks.matrix.cell --worker`` process, running the cells it is sent one by one."""

    def __init__(self, slot: int, threads: int, env: dict):
        self.slot, self.cells = slot, 0
        self.proc = subprocess.Popen(
            [*cell_process_command(), "--worker"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, bufsize=1, env={**_child_env(threads), **env},
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)

    def run(self, job: CellJob, threads: int, timeout_s: float) -> tuple[int, Optional[str]]:
        """(returncode, error) of one cell; a dead or timed-out worker is killed and its status returned."""
        try:
            self.proc.stdin.write(json.dumps({"cell_dir": str(job.cell_dir), "resume": job.resume,
                                             "threads": threads, "progress": False}) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return self.proc.wait(), None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s or None)
        if not ready:
            self.kill()
            return self.proc.returncode, f"timed out after {timeout_s:g} s"
        line = self.proc.stdout.readline()
        if not line:  # the worker died in the cell (SIGKILL, out of memory, a crash)
            return self.proc.wait(), None
        self.cells += 1
        reply = json.loads(line)
        return reply["returncode"], reply["error"]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # EOF: the worker leaves its loop
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()


@dataclasses.dataclass
class LocalOptions:
    jobs: int = dataclasses.field(default=0, metadata={
        "help": "cells at once, each on cores // jobs torch threads (0: what fits the cores, given each cell's num_cpus)"})

    def __post_init__(self):
        _check_jobs(self.jobs)


@register_executor
class LocalExecutor(RegisteredExecutor):
    """Warm worker processes on this machine, each running cells one after another (the default).

    ``jobs`` workers, each cell with its share of the cores as torch threads (``--executor local --jobs N``). A
    worker pays the torch / transformers import once; a cell it runs writes the same metrics as in a fresh
    process (``cell.reset_process_state``) but its peak memory, which grows with the cells the worker ran before
    (glibc keeps freed heap: the chain_sum verdict's RLOO read 4.8 GiB as a worker's first cell, up to 6.6 GiB
    later), so the report keeps only a worker's first cell's peak (``report.matrix.fresh_process_peaks``): where
    peak memory is a result, run the cells with ``--executor subprocess``. A cell that kills its
    worker is recorded as failed and the slot starts a new worker."""

    name = "local"
    Options = LocalOptions

    def run(self, jobs: list[CellJob], on_done: Callable[[CellJob, dict], None]) -> None:
        if not jobs:
            return
        self.jobs, share = slots_and_share(self.options.jobs, jobs)
        workers: dict[int, _Worker] = {}
        gpus = _visible_gpus()

        def run_cell(slot: int, job: CellJob) -> dict:
            job = prepare_cell_dir(job)
            threads = _cell_threads(job, share)
            start = time.perf_counter()
            if slot not in workers or not workers[slot].alive():
                workers[slot] = _Worker(slot, threads, {"CUDA_VISIBLE_DEVICES": gpus[slot % len(gpus)]} if gpus else {})
            worker = workers[slot]
            record = {"executor": "local", "queue_wait_s": start - job.queued_at, "worker": slot,
                      "worker_pid": worker.proc.pid, "worker_cell_index": worker.cells}
            returncode, error = worker.run(job, threads, job.timeout_s)
            return finish_cell(job, returncode, time.perf_counter() - start, error, record)

        finished = False
        try:
            run_in_slots(self.jobs, jobs, run_cell, on_done)
            finished = True
        finally:
            for worker in list(workers.values()):
                worker.close() if finished else worker.kill()


def _visible_gpus() -> list[str]:
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 -- no CUDA, no placement
        return []


# ------------------------------------------------------------------------------------------------
# subprocess: a fresh process per cell
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class SubprocessOptions:
    jobs: int = dataclasses.field(default=1, metadata={
        "help": "cells at once, a fresh process each, on cores // jobs torch threads as local pins its workers "
                "(1: one at a time, on the process's default threads)"})

    def __post_init__(self):
        _check_jobs(self.jobs)


@register_executor
class FreshProcessExecutor(SubprocessExecutor, RegisteredExecutor):
    """A fresh process per cell, paying process start-up and imports every time: the baseline.

    ``execute.SubprocessExecutor`` (one cell after another) with ``jobs`` cells at once (``--executor subprocess
    --jobs N``), each cell pinned to its share of the cores exactly as the local executor pins its warm workers,
    so that the two compare at equal parallelism."""

    name = "subprocess"
    Options = SubprocessOptions

    def run(self, jobs: list[CellJob], on_done: Callable[[CellJob, dict], None]) -> None:
        if self.options.jobs == 1:
            # the baseline as it always ran: on the cell's num_cpus, else on the process's default threads
            super().run(jobs, on_done)
            return
        if not jobs:
            return
        self.jobs, share = slots_and_share(self.options.jobs, jobs)
        run_in_slots(self.jobs, jobs, lambda slot, job: self.run_one(
            dataclasses.replace(job, threads=_cell_threads(job, share))), on_done)


# ------------------------------------------------------------------------------------------------
# Moving a cell directory between machines without a shared filesystem
# ------------------------------------------------------------------------------------------------


def pack_dir(cell_dir: Path, *, checkpoints: bool = True, only_newest_checkpoint: bool = False) -> bytes:
    """The cell's files as a tar archive in memory (checkpoints optional; hidden entries such as lock files
    and a staging folder left out)."""
    buf = io.BytesIO()
    newest = sorted((cell_dir / "checkpoints").glob("step_*.pt"))[-1:] if (cell_dir / "checkpoints").is_dir() else []
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(cell_dir.rglob("*")):
            rel = path.relative_to(cell_dir)
            if not path.is_file() or any(part.startswith(".") for part in rel.parts) or rel.name.endswith(".tmp"):
                continue
            if rel.parts[0] == "checkpoints" and (not checkpoints or (only_newest_checkpoint and path not in newest)):
                continue
            tar.add(path, arcname=str(rel))
    return buf.getvalue()


def unpack_dir(data: bytes, cell_dir: Path) -> None:
    """Write an archive from ``pack_dir`` into ``cell_dir``, replacing the files it holds.

    Each file is extracted beside the cell and renamed into place, summary.json last: a process killed
    half-way leaves whole files, old or new, and never a summary ahead of the metrics it describes (the
    harness resumes only from a checkpoint whose steps metrics.jsonl holds)."""
    import tempfile

    cell_dir.mkdir(parents=True, exist_ok=True)
    # Inside the cell (whose .gitignore and pack_dir leave hidden entries out), on the same filesystem.
    with tempfile.TemporaryDirectory(prefix=".unpack-", dir=cell_dir) as staging:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
            tar.extractall(staging, filter="data")
        names = sorted((p.relative_to(staging) for p in Path(staging).rglob("*") if p.is_file()),
                       key=lambda rel: (rel.name == "summary.json", str(rel)))
        if any(rel.parts[0] == "checkpoints" for rel in names):  # the archive's checkpoints are the cell's now
            for old in (cell_dir / "checkpoints").glob("step_*.pt"):
                old.unlink()
        for rel in names:
            (cell_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(Path(staging) / rel, cell_dir / rel)


def _redirected(log_path: Path):
    """Context: this process's fd 1 and 2 into ``log_path`` (what a cell prints is its log)."""
    import contextlib

    @contextlib.contextmanager
    def manager():
        sys.stdout.flush(), sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        with open(log_path, "a") as log:
            os.dup2(log.fileno(), 1), os.dup2(log.fileno(), 2)
            try:
                yield
            finally:
                sys.stdout.flush(), sys.stderr.flush()
                os.dup2(saved[0], 1), os.dup2(saved[1], 2)
                os.close(saved[0]), os.close(saved[1])

    return manager()


class CellTimeout(Exception):
    pass


def _watchdog(timeout_s: float) -> Callable[[], None]:
    """Raise CellTimeout in this thread after ``timeout_s`` (at its next Python bytecode); returns the cancel."""
    if not timeout_s:
        return lambda: None
    target, done = threading.get_ident(), threading.Event()

    def fire():
        if not done.wait(timeout_s):
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(target), ctypes.py_object(CellTimeout))

    threading.Thread(target=fire, daemon=True).start()
    return done.set


# ------------------------------------------------------------------------------------------------
# ray: one Ray task per cell; files travel back to the driver
# ------------------------------------------------------------------------------------------------


class _CheckpointStore:
    """A Ray actor holding each running cell's newest checkpoint (with its config.json and metrics.jsonl), so
    that a retry on another worker, with no shared filesystem, continues from it."""

    def __init__(self):
        self.files: dict[str, bytes] = {}

    def put(self, key: str, data: bytes) -> None:
        self.files[key] = data

    def get(self, key: str) -> Optional[bytes]:
        return self.files.get(key)


def _ship_checkpoints(store, key: str, cell_dir: Path, stop: threading.Event) -> None:
    sent = None
    while not stop.wait(1.0):
        newest = sorted((cell_dir / "checkpoints").glob("step_*.pt"))[-1:]
        if newest and newest[0].name != sent:
            try:
                store.put.remote(key, pack_dir(cell_dir, only_newest_checkpoint=True))
                sent = newest[0].name
            except (OSError, tarfile.TarError):  # a checkpoint replaced while archived: the next tick sends it
                pass


_RAY_CELLS_RUN = 0  # cells this Ray worker process has run (its first pays the imports)


def _ray_run_cell(key: str, files: bytes, resume: bool, threads: int, timeout_s: float, submitted_at: float,
                  store=None) -> dict:
    """A Ray task: unpack the cell into a temporary directory, run it in this (reused) worker process, return
    its files. A retry (the worker died) starts from the newest checkpoint the store received."""
    global _RAY_CELLS_RUN
    import tempfile

    # The first cell of a worker pays its start-up: from the later of the process's start (Ray may have
    # started it idle, before this cell was submitted) and the submission, to now (imports done).
    now = time.time()
    started_at = max(now - _process_age_s(), submitted_at) if _RAY_CELLS_RUN == 0 else now
    startup = now - started_at
    begun = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="grpo-bench-cell-") as tmp:
        cell_dir = Path(tmp) / "cell"
        unpack_dir(files, cell_dir)
        saved = ray_get(store.get.remote(key)) if store is not None else None
        retried = saved is not None
        if retried:
            unpack_dir(saved, cell_dir)
            resume = True
        stop = threading.Event()
        if store is not None:
            threading.Thread(target=_ship_checkpoints, args=(store, key, cell_dir, stop), daemon=True).start()
        cancel = _watchdog(timeout_s)
        try:
            with _redirected(cell_dir / "log.txt"):
                if retried:
                    print("grpo-bench: retrying this cell on a new Ray worker from its newest checkpoint", flush=True)
                returncode, error = cell_process.run_guarded(cell_dir, resume=resume, progress=False, threads=threads,
                                                             startup_s=startup)
        except CellTimeout:
            returncode, error = 1, f"timed out after {timeout_s:g} s"
        finally:
            cancel()
            stop.set()
        _RAY_CELLS_RUN += 1
        return {"returncode": returncode, "error": error, "files": pack_dir(cell_dir), "started_at": started_at,
                "queue_s": max(0.0, started_at - submitted_at), "task_s": time.perf_counter() - begun + startup,
                "node": socket.gethostname(), "pid": os.getpid(), "retried_from_checkpoint": retried}


def ray_get(ref):
    import ray

    return ray.get(ref)


@dataclasses.dataclass
class RayOptions:
    ray_address: Optional[str] = dataclasses.field(default=None, metadata={
        "help": "an existing cluster's address, HOST:6379 (none: a local Ray instance)"})


@register_executor
class RayExecutor(RegisteredExecutor):
    """Each cell a Ray task with the cell's num_cpus / num_gpus, on a local Ray instance or a cluster.

    No address: a local Ray instance, shut down at the end. The worker runs the cell in a temporary directory
    and returns its files; the driver writes them (no shared filesystem needed). A worker that dies is retried
    (``max_retries``) from the newest checkpoint it shipped to the driver's checkpoint store (cells whose
    matrix has ``checkpoint_every``), else from the start."""

    name = "ray"
    Options = RayOptions
    requires = ("ray", "ray")
    max_retries = 3

    def _init(self, ray) -> bool:
        if ray.is_initialized():
            return False
        root = str(Path(__file__).absolute().parents[2])
        env = {"PYTHONPATH": os.pathsep.join(p for p in [root, os.environ.get("PYTHONPATH", "")] if p)}
        for key in ("GRPO_BENCH_CACHE", "HF_HOME", "TOKENIZERS_PARALLELISM"):
            if key in os.environ:
                env[key] = os.environ[key]
        if self.options.ray_address:
            ray.init(address=self.options.ray_address, log_to_driver=False)
        else:
            # A driver killed with SIGKILL takes its raylet with it; Ray's agents notice by the zombie-prone
            # parent-pid check unless told to watch the raylet's pipe, and in a container whose init does not
            # reap they would outlive the driver.
            os.environ.setdefault("RAY_enable_pipe_based_agent_to_parent_health_check", "1")
            ray.init(num_cpus=cpu_count(), include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": env})
        return True

    def run(self, jobs: list[CellJob], on_done: Callable[[CellJob, dict], None]) -> None:
        if not jobs:
            return
        ray = require_extra(self)
        started = self._init(ray)
        try:
            self.jobs = int(ray.cluster_resources().get("CPU", 1))
            store = ray.remote(_CheckpointStore).options(num_cpus=0).remote()
            task = ray.remote(_ray_run_cell)
            pending = {}
            for job in jobs:
                job = prepare_cell_dir(job)
                cpus = job.cell.resources.get("num_cpus", 1)
                gpus = job.cell.resources.get("num_gpus", 0)
                ref = task.options(num_cpus=cpus, num_gpus=gpus, max_retries=self.max_retries,
                                   retry_exceptions=False, name=f"cell {job.cell.relpath}").remote(
                    job.cell.relpath, pack_dir(job.cell_dir, checkpoints=job.resume), job.resume,
                    job.threads or cpus, job.timeout_s, time.time(), store)
                pending[ref] = (job, time.perf_counter())
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    job, submitted = pending.pop(ref)
                    on_done(job, self._finish(ray, ref, job, submitted))
        finally:
            if started:
                ray.shutdown()

    @staticmethod
    def _finish(ray, ref, job: CellJob, submitted: float) -> dict:
        elapsed = time.perf_counter() - submitted
        try:
            result = ray.get(ref)
        except Exception as exc:  # noqa: BLE001 -- the retries are spent (the worker kept dying) or Ray failed
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return finish_cell(job, -signal.SIGKILL, elapsed, f"ray: {type(exc).__name__}: {message}"[:300],
                               {"executor": "ray", "queue_wait_s": submitted - job.queued_at})
        unpack_dir(result["files"], job.cell_dir)
        record = {"executor": "ray", "queue_wait_s": submitted - job.queued_at + result["queue_s"],
                  "worker_node": result["node"], "worker_pid": result["pid"],
                  "retried_from_checkpoint": result["retried_from_checkpoint"]}
        return finish_cell(job, result["returncode"], result["task_s"], result["error"], record)


# ------------------------------------------------------------------------------------------------
# slurm: one submitit job per cell (the cluster's shared filesystem holds the cell directories)
# ------------------------------------------------------------------------------------------------


def _slurm_run_cell(cell_dir: str, resume: bool, threads: int) -> dict:
    """A submitit job: one cell, in this job's own (fresh) process, straight into its directory."""
    now = time.time()
    startup = _process_age_s()  # a fresh process per job: its whole start, submitit's unpickling included
    started_at = now - startup
    begun = time.perf_counter()
    cell_dir = Path(cell_dir)
    atomic_write_json(cell_dir / "job.json", {"host": socket.gethostname(), "pid": os.getpid(),
                                              "slurm_job_id": os.environ.get("SLURM_JOB_ID")})
    with _redirected(cell_dir / "log.txt"):
        returncode, error = cell_process.run_guarded(cell_dir, resume=resume, progress=False, threads=threads,
                                                     startup_s=startup)
    return {"returncode": returncode, "error": error, "started_at": started_at, "node": socket.gethostname(),
            "pid": os.getpid(), "task_s": time.perf_counter() - begun + startup}


def _cancel_stale_job(cell_dir: Path) -> None:
    """A job of an earlier (killed) driver may still run this cell: stop it before the cell runs again."""
    info = read_json(cell_dir / "job.json")
    if not info:
        return
    if info.get("slurm_job_id"):
        subprocess.run(["scancel", str(info["slurm_job_id"])], check=False, capture_output=True)
    elif info.get("host") == socket.gethostname():
        try:
            os.kill(int(info["pid"]), signal.SIGKILL)
        except (OSError, ValueError, TypeError):
            pass
    (cell_dir / "job.json").unlink(missing_ok=True)


@dataclasses.dataclass
class SlurmOptions:
    slurm_partition: Optional[str] = dataclasses.field(default=None, metadata={"help": "the partition to submit to"})
    slurm_time: int = dataclasses.field(default=60, metadata={
        "help": "minutes per cell job (a matrix's timeout_s overrides)"})
    slurm_gpus_per_cell: float = dataclasses.field(default=0, metadata={
        "help": "GPUs per cell job (a cell's num_gpus overrides)"})
    slurm_cluster: Optional[str] = dataclasses.field(default=None, metadata={
        "help": "submitit cluster; local: local processes (none: slurm where sbatch exists)"})


@register_executor
class SlurmExecutor(RegisteredExecutor):
    """Each cell a submitit job on Slurm (or, with --slurm-cluster local, a local process).

    On Slurm with the partition, time, GPUs per cell and the cell's num_cpus; ``slurm_cluster="local"`` runs
    the jobs as local processes (submitit's LocalExecutor, what the tests use). A job whose process dies is
    resubmitted (``max_retries``) and resumes from the cell's newest checkpoint on the shared filesystem."""

    name = "slurm"
    Options = SlurmOptions
    requires = ("submitit", "slurm")
    max_retries = 2
    poll_s = 0.5

    def _executor(self, submitit, folder: Path, job: CellJob):
        options = self.options
        executor = submitit.AutoExecutor(folder=folder, cluster=options.slurm_cluster)
        cpus = job.cell.resources.get("num_cpus", 1)
        gpus = int(job.cell.resources.get("num_gpus", options.slurm_gpus_per_cell) or 0)
        minutes = max(1, int(-(-job.timeout_s // 60))) if job.timeout_s else options.slurm_time
        params = {"timeout_min": minutes, "cpus_per_task": cpus, "nodes": 1, "tasks_per_node": 1}
        if gpus:
            params["gpus_per_node"] = gpus
        if options.slurm_partition:
            params["slurm_partition"] = options.slurm_partition
        executor.update_parameters(**params)
        return executor

    def run(self, jobs: list[CellJob], on_done: Callable[[CellJob, dict], None]) -> None:
        if not jobs:
            return
        submitit = require_extra(self)
        folder = (jobs[0].out_dir or jobs[0].cell_dir.parents[2]) / ".submitit"
        self.jobs = len(jobs)
        running = {}

        def submit(job: CellJob, attempt: int):
            _cancel_stale_job(job.cell_dir)
            threads = job.threads or job.cell.resources.get("num_cpus", 1)
            handle = self._executor(submitit, folder, job).submit(
                _slurm_run_cell, str(job.cell_dir), job.resume, threads)
            running[handle.job_id] = (job, handle, attempt, time.perf_counter(), time.time())

        for job in jobs:
            submit(prepare_cell_dir(job), 0)
        try:
            while running:
                time.sleep(self.poll_s)
                for job_id, (job, handle, attempt, submitted, submitted_wall) in list(running.items()):
                    if not handle.done():
                        continue
                    del running[job_id]
                    elapsed = time.perf_counter() - submitted
                    try:
                        result = handle.result()
                    except Exception as exc:  # noqa: BLE001 -- the job's process died (or the cluster failed it)
                        if attempt < self.max_retries:
                            submit(dataclasses.replace(job, resume=True), attempt + 1)  # from its newest checkpoint
                            continue
                        message = (str(exc).strip().splitlines() or [""])[-1]
                        on_done(job, finish_cell(job, -signal.SIGKILL, elapsed, f"slurm: {message}"[:300],
                                                 {"executor": "slurm", "queue_wait_s": submitted - job.queued_at,
                                                  "attempts": attempt + 1}))
                        continue
                    (job.cell_dir / "job.json").unlink(missing_ok=True)
                    record = {"executor": "slurm", "attempts": attempt + 1, "worker_node": result["node"],
                              "queue_wait_s": submitted - job.queued_at + max(0.0, result["started_at"] - submitted_wall)}
                    on_done(job, finish_cell(job, result["returncode"], result["task_s"], result["error"], record))
        except BaseException:
            for _, handle, _, _, _ in running.values():
                handle.cancel(check=False)
            raise


# ------------------------------------------------------------------------------------------------
# Installed plug-ins
# ------------------------------------------------------------------------------------------------


def load_executor_plugins() -> list[str]:
    """Register the executors installed packages declare (entry-point group ``grpo_bench.executors``); returns
    'group:name' of each. Runs as this module is imported, after the built-in executors, so that a plug-in
    cannot take their names."""
    return register_entry_points("grpo_bench.executors", register_executor)


load_executor_plugins()
