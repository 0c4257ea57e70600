"""Executors that run a matrix's cells in parallel: ``local`` (warm worker processes on this machine, the
default), ``ray`` (a Ray task per cell, local instance or a cluster) and ``slurm`` (a submitit job per
cell). ``subprocess`` (``execute.SubprocessExecutor``: one fresh process per cell, one at a time) is the
baseline. Each implements ``run(jobs, on_done)``; ``on_done`` is always called in the driver, which alone
writes the matrix's record.

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

from benchmarks.errors import UsageError
from benchmarks.io import atomic_write_json, read_json
from benchmarks.matrix.execute import (
    CellJob, SubprocessExecutor, _child_env, _die_with_parent, finish_cell, prepare_cell_dir,
)

EXECUTORS = ("local", "subprocess", "ray", "slurm")
EXTRAS = {"ray": ("ray", "ray"), "slurm": ("submitit", "slurm")}  # executor -> (module, pip extra)


def require_extra(executor: str):
    """The module an executor needs, or UsageError naming the pip command (one line, exit status 2)."""
    module, extra = EXTRAS[executor]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UsageError(f"--executor {executor} needs {module}, which is not installed: "
                         f"pip install -e \".[{extra}]\"") from None


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
            [sys.executable, "-m", "benchmarks.matrix.cell", "--worker"], stdin=subprocess.PIPE,
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


class LocalExecutor:
    """``jobs`` warm worker processes on this machine, each running cells one after another with its share of
    the cores as torch threads (``--executor local --jobs N``). A worker pays the torch / transformers import
    once; a cell it runs writes the same metrics as in a fresh process (``cell.reset_process_state``). A cell
    that kills its worker is recorded as failed and the slot starts a new worker."""

    name = "local"

    def __init__(self, jobs: int = 0, threads: int = 0):
        self.jobs, self.threads = jobs, threads

    def run(self, jobs: list[CellJob], on_done: Callable[[CellJob, dict], None]) -> None:
        if not jobs:
            return
        n = min(self.jobs or default_jobs(jobs), len(jobs))
        self.jobs = self.jobs or n
        share = self.threads or max(1, cpu_count() // n)
        todo: queue.Queue = queue.Queue()
        for job in jobs:
            todo.put(job)
        lock, stop, errors = threading.Lock(), threading.Event(), []
        workers: dict[int, _Worker] = {}
        gpus = _visible_gpus()

        def slot(i: int) -> None:
            env = {"CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]} if gpus else {}
            try:
                while not stop.is_set():
                    try:
                        job = todo.get_nowait()
                    except queue.Empty:
                        return
                    job = prepare_cell_dir(job)
                    threads = _cell_threads(job, share)
                    start = time.perf_counter()
                    if i not in workers or not workers[i].alive():
                        workers[i] = _Worker(i, threads, env)
                    worker = workers[i]
                    record = {"executor": "local", "queue_wait_s": start - job.queued_at, "worker": i,
                              "worker_pid": worker.proc.pid, "worker_cell_index": worker.cells}
                    returncode, error = worker.run(job, threads, job.timeout_s)
                    summary = finish_cell(job, returncode, time.perf_counter() - start, error, record)
                    with lock:
                        if not stop.is_set():
                            on_done(job, summary)
            except BaseException as exc:  # noqa: BLE001 -- handed to the driver's thread
                errors.append(exc)
                stop.set()

        threads = [threading.Thread(target=slot, args=(i,), daemon=True) for i in range(n)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(0.2)
        finally:
            stop.set()
            for w in list(workers.values()):
                w.kill() if errors or any(t.is_alive() for t in threads) else w.close()
        if errors:
            raise errors[0]


def _visible_gpus() -> list[str]:
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 -- no CUDA, no placement
        return []


# ------------------------------------------------------------------------------------------------
# Moving a cell directory between machines without a shared filesystem
# ------------------------------------------------------------------------------------------------


def pack_dir(cell_dir: Path, *, checkpoints: bool = True, only_newest_checkpoint: bool = False) -> bytes:
    """The cell's files as a tar archive in memory (checkpoints optional; lock files left out)."""
    buf = io.BytesIO()
    newest = sorted((cell_dir / "checkpoints").glob("step_*.pt"))[-1:] if (cell_dir / "checkpoints").is_dir() else []
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(cell_dir.rglob("*")):
            rel = path.relative_to(cell_dir)
            if not path.is_file() or rel.name.startswith(".") or rel.name.endswith(".tmp"):
                continue
            if rel.parts[0] == "checkpoints" and (not checkpoints or (only_newest_checkpoint and path not in newest)):
                continue
            tar.add(path, arcname=str(rel))
    return buf.getvalue()


def unpack_dir(data: bytes, cell_dir: Path) -> None:
    """Write an archive from ``pack_dir`` into ``cell_dir``, replacing the files it holds."""
    cell_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        names = tar.getnames()
        if any(n.startswith("checkpoints/") for n in names):  # the archive's checkpoints are the cell's now
            for old in (cell_dir / "checkpoints").glob("step_*.pt"):
                old.unlink()
        tar.extractall(cell_dir, filter="data")


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

    from benchmarks.matrix import cell as cell_process  # torch and the harness: imported once per worker

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


class RayExecutor:
    """Each cell a Ray task with the cell's ``num_cpus`` / ``num_gpus`` (``--executor ray [--ray-address A]``).

    No address: a local Ray instance, shut down at the end. The worker runs the cell in a temporary directory
    and returns its files; the driver writes them (no shared filesystem needed). A worker that dies is retried
    (``max_retries``) from the newest checkpoint it shipped to the driver's checkpoint store (cells whose
    matrix has ``checkpoint_every``), else from the start."""

    name = "ray"

    def __init__(self, address: Optional[str] = None, max_retries: int = 3, threads: int = 0):
        self.address, self.max_retries, self.threads = address, max_retries, threads
        self.jobs: Optional[int] = None

    def _init(self, ray) -> bool:
        if ray.is_initialized():
            return False
        root = str(Path(__file__).absolute().parents[2])
        env = {"PYTHONPATH": os.pathsep.join(p for p in [root, os.environ.get("PYTHONPATH", "")] if p)}
        for key in ("GRPO_BENCH_CACHE", "HF_HOME", "TOKENIZERS_PARALLELISM"):
            if key in os.environ:
                env[key] = os.environ[key]
        if self.address:
            ray.init(address=self.address, log_to_driver=False)
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
        ray = require_extra("ray")
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
                    job.threads or self.threads or cpus, job.timeout_s, time.time(), store)
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
    from benchmarks.matrix import cell as cell_process

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
class SlurmExecutor:
    """Each cell a submitit job (``--executor slurm``): on Slurm with ``partition``, ``time_min``,
    ``gpus_per_cell`` and the cell's num_cpus; ``cluster="local"`` runs the jobs as local processes
    (submitit's LocalExecutor, what the tests use). A job whose process dies is resubmitted (``max_retries``)
    and resumes from the cell's newest checkpoint on the shared filesystem."""

    partition: Optional[str] = None
    time_min: int = 60
    gpus_per_cell: float = 0
    cluster: Optional[str] = None
    max_retries: int = 2
    poll_s: float = 0.5
    name: str = "slurm"
    jobs: Optional[int] = None

    def _executor(self, submitit, folder: Path, job: CellJob):
        executor = submitit.AutoExecutor(folder=folder, cluster=self.cluster)
        cpus = job.cell.resources.get("num_cpus", 1)
        gpus = int(job.cell.resources.get("num_gpus", self.gpus_per_cell) or 0)
        minutes = max(1, int(-(-job.timeout_s // 60))) if job.timeout_s else self.time_min
        params = {"timeout_min": minutes, "cpus_per_task": cpus, "nodes": 1, "tasks_per_node": 1}
        if gpus:
            params["gpus_per_node"] = gpus
        if self.partition:
            params["slurm_partition"] = self.partition
        executor.update_parameters(**params)
        return executor

    def run(self, jobs: list[CellJob], on_done: Callable[[CellJob, dict], None]) -> None:
        if not jobs:
            return
        submitit = require_extra("slurm")
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


def make_executor(name: str, *, jobs: int = 0, ray_address: Optional[str] = None,
                  slurm_partition: Optional[str] = None, slurm_time: int = 60, slurm_gpus_per_cell: float = 0,
                  slurm_cluster: Optional[str] = None):
    """The executor ``--executor NAME`` names; a missing optional extra is a UsageError naming its pip command."""
    if name not in EXECUTORS:
        raise UsageError(f"unknown executor {name!r}; choose from {', '.join(EXECUTORS)}")
    if jobs < 0:
        raise UsageError(f"--jobs must be >= 1, got {jobs}")
    if name in EXTRAS:
        require_extra(name)  # fail before anything runs
    if name == "local":
        return LocalExecutor(jobs)
    if name == "subprocess":
        return SubprocessExecutor()
    if name == "ray":
        return RayExecutor(ray_address)
    return SlurmExecutor(partition=slurm_partition, time_min=slurm_time, gpus_per_cell=slurm_gpus_per_cell,
                         cluster=slurm_cluster)
