"""``grpo-bench bench revisions``: what each change to the code bought, measured on its own.

One training step of this suite on a workload of ``bench grpo-vs-trl`` (GRPO, RLOO, or PPO at the real-LM verdict's
step), built as ``grpo-bench run`` builds it, at each of several git revisions of the project, side by side. Each revision's tree comes out of ``git archive`` into a temporary folder
and runs in its own warm worker process, which imports that tree in place of the working one (it says which
tree it imported, and a worker that imported another is an error) from the caller's working directory. The rounds interleave the revisions, in
an order that rotates each round, so a slow spell on a shared machine falls on all of them alike. Every
worker builds the policy with the same seed and steps on the same prompts; where the sampling code is the
same, the first step's batch is the same (later ones drift with the weights' rounding), and the report gives
the tokens each step generated so that a reader sees the work was alike.

Per revision and workload: the median seconds per phase (generate, reference log-probs, update) and per step
over the rounds, the step's percentile-bootstrap interval, and the first revision's median step over this
one's (above 1: faster than the first).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Optional

from benchmarks.errors import UsageError
from benchmarks.git import git, resolve
from benchmarks.harness import measure
from benchmarks.io import atomic_write_json, atomic_write_text
from benchmarks.markdown import markdown_table
from benchmarks.perf import revisions_worker
from benchmarks.perf.vs_trl import median_interval
from benchmarks.references.sides import WORKLOADS
from benchmarks.study import StudySettings, at_least, option

# The phases this report shows, of the step's (benchmarks.io.PHASES): written out rather than taken from there, since
# every measured revision's step, however old, must report each of them.
SHOWN_PHASES = ("generate", "logprobs", "update")
# Before each step: the previous worker's OpenMP threads spin-wait for a while after their last parallel region
# (libgomp's spin count, Intel OpenMP's 200 ms block time), which would take cores from the next worker.
PAUSE_S = 0.3

@dataclasses.dataclass
class RevisionSettings(StudySettings):
    revisions: list[str] = dataclasses.field(metadata={
        "help": "git revisions (commits, tags, branches), the baseline first"})
    workloads: list[str] = dataclasses.field(default_factory=lambda: ["chain_sum-mu1", "gsm8k-mu1"], metadata={
        "help": "comma-separated grpo-vs-trl workloads", "comma_separated": True})
    rounds: int = dataclasses.field(default=5, metadata={"help": "timed steps per revision after a warm-up"})
    seed: int = option("seed")
    threads: int = option("threads", shown="0, torch's own")  # per worker
    device: str = option("device")
    repo: str = dataclasses.field(default=".", metadata={"help": "the git checkout the revisions belong to"})
    out: str = option("out", "results/perf")  # revisions.md and revisions.json


def extract(repo: str, commit: str, into: Path) -> Path:
    """The tree of ``commit`` written under ``into`` (git archive), its folder returned."""
    tree = into / commit[:12]
    with tarfile.open(fileobj=io.BytesIO(git(repo, "archive", "--format=tar", commit))) as archive:
        archive.extractall(tree, filter="data")
    return tree


class Worker:
    """One revision's warm process: ``step()`` runs one training step of the run ``settings`` (a workload's flat run
    settings) there and returns its metrics."""

    def __init__(self, tree: Path, name: str, settings: dict, seed: int, threads: int, log: Path):
        self.name = f"{tree.name} on {name}"
        self.stderr_path = log
        self._stderr = open(log, "w")
        # The caller's working directory, so that data found from it (GSM8K's local copy) is found the same way.
        # The worker is this checkout's file, run by its path (not -m, which would import this checkout's
        # benchmarks package first): it imports the measured code from ``tree`` (revisions_worker says how).
        self.proc = subprocess.Popen([sys.executable, revisions_worker.__file__, json.dumps(settings), str(seed),
                                      str(threads), str(tree)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        ready = self._read()
        imported = Path(ready["imported"]).resolve()
        if tree.resolve() not in imported.parents:
            self.close()
            raise UsageError(f"the worker for {self.name} imported {imported}, not its own tree")
        self.threads = ready["threads"]

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.close()
            tail = self.stderr_path.read_text().strip().splitlines()[-1:]
            code = self.proc.returncode
            why = (f"killed by signal {-code}{' (the kernel kills for memory with 9)' if code == -9 else ''}"
                   if code is not None and code < 0 else tail[0] if tail else "no output")
            raise UsageError(f"the worker for {self.name} stopped: {why}")
        return json.loads(line)

    def step(self) -> dict:
        time.sleep(PAUSE_S)
        try:
            self.proc.stdin.write("\n")
            self.proc.stdin.flush()
        except BrokenPipeError:  # it stopped: _read says why
            pass
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(BrokenPipeError):  # it stopped between the poll and the close
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._stderr.close()


def summarise(steps: list[dict], baseline_step: Optional[float], seed: int) -> dict:
    step_times = [s["time/step"] for s in steps]
    median = statistics.median(step_times)
    return {
        "rounds": len(steps),
        "median": {p: statistics.median(s.get(f"time/{p}", 0.0) for s in steps) for p in ("step", *SHOWN_PHASES)},
        "step_ci95": list(median_interval(step_times, seed=seed)),
        "tokens_generated": [s["tokens/generated"] for s in steps],
        "speedup_vs_first": (baseline_step / median) if baseline_step else 1.0,
        "steps": steps,
    }


def compare_workload(workload: str, revisions: list[dict], trees: list[Path], settings: RevisionSettings,
                     logs: Path, log=print) -> dict:
    workers = []
    try:
        for i, tree in enumerate(trees):
            run = WORKLOADS[workload].run_settings(seed=settings.seed, device=settings.device)
            workers.append(Worker(tree, workload, run, settings.seed, settings.threads, logs / f"{workload}-{i}.log"))
        for worker in workers:  # warm-up: allocation, first-touch pages, kernel choice
            worker.step()
        steps: list[list[dict]] = [[] for _ in workers]
        for r in range(settings.rounds):
            order = [(r + i) % len(workers) for i in range(len(workers))]  # each revision leads a round in turn
            for i in order:
                steps[i].append(workers[i].step())
            log(f"  {workload} round {r + 1}/{settings.rounds}: " + ", ".join(
                f"{revisions[i]['revision']} {steps[i][-1]['time/step']:.2f} s" for i in range(len(workers))))
    finally:
        for worker in workers:
            worker.close()
    first = statistics.median(s["time/step"] for s in steps[0])
    return {"workload": dataclasses.asdict(WORKLOADS[workload]), "threads": workers[0].threads,
            "revisions": [{**rev, **summarise(s, first if i else None, settings.seed)}
                          for i, (rev, s) in enumerate(zip(revisions, steps))]}


def _machine(report: dict) -> str:
    """The device the workers ran on, without the caller's thread count (each workload states its workers')."""
    return re.sub(r" \(\d+ threads?\)$", "", report["environment"]["device_name"])


def render_markdown(report: dict) -> str:
    load = report["load"]["load_1min"]
    lines = [
        "# One step at each revision: what each change bought",
        "",
        f"This suite's training step on each workload (as `grpo-bench run` builds it) at {len(report['revisions'])} "
        f"revisions, each in its own warm worker, in interleaved rounds; on {_machine(report)} "
        f"(torch {report['environment']['versions']['torch']}). Machine load (1-minute load average at the start "
        f"and after each workload): {min(load):.1f} to {max(load):.1f} on {report['load']['cpus']} CPUs. Seconds are "
        "medians over the rounds; the step's 95% percentile-bootstrap interval in brackets; speed-up is the first "
        "revision's median step over this one's.",
        "",
    ]
    if report["workloads"]:
        last = report["revisions"][-1]
        lines[1:1] = ["", f"**`{last['commit'][:8]}` against `{report['revisions'][0]['commit'][:8]}`, median step: " + ", ".join(
            f"{w['workload']['name']} {w['revisions'][-1]['speedup_vs_first']:.2f}x" for w in report["workloads"]) + ".**"]
    for w in report["workloads"]:
        spec = w["workload"]
        lora = f", LoRA r {spec['lora_r']}" if spec.get("lora_r") else ""
        step = (f"{spec['group_size']} pairs a step, beta {spec['beta']:g}" if spec.get("algo") == "dpo"  # sides.Workload
                else f"{spec.get('prompts_per_step', 1)} x G {spec['group_size']}")
        shape = f"{spec.get('algo', 'grpo')}, {step}, {spec.get('precision', 'fp32')}"
        lines += [f"## {spec['name']}: {spec['task']}, {shape}, {spec['max_new_tokens']} new tokens, "
                  f"mu {spec['mu']}{lora}; {w['threads']} thread{'s' if w['threads'] != 1 else ''}, {w['revisions'][0]['rounds']} rounds", ""]
        rows = []
        for r in w["revisions"]:
            m = r["median"]
            tokens = r["tokens_generated"]
            rows.append([f"`{r['commit'][:8]}`", r["subject"][:90] + ("..." if len(r["subject"]) > 90 else ""),
                         f"{m['step']:.2f} [{r['step_ci95'][0]:.2f}, {r['step_ci95'][1]:.2f}]",
                         *(f"{m[p]:.2f}" for p in SHOWN_PHASES), f"{min(tokens):.0f}-{max(tokens):.0f}",
                         f"{r['speedup_vs_first']:.2f}x"])
        lines.append(markdown_table(["revision", "change", "step s", "generate s", "ref log-probs s", "update s",
                                     "tokens generated", "speed-up"], rows))
        lines.append("")
    lines.append(f"Regenerate: `{report['command']}`")
    return "\n".join(lines)


def run_revisions(settings: RevisionSettings, command: str, log=print) -> dict:
    unknown = [w for w in settings.workloads if w not in WORKLOADS]
    if unknown:
        raise UsageError(f"unknown workload {unknown[0]!r}; choose from {', '.join(WORKLOADS)}")
    if len(settings.revisions) < 2:
        raise UsageError("bench revisions needs at least two revisions: a baseline, then each change")
    at_least(rounds=(settings.rounds, 2))
    device = measure.requested_device(settings.device)
    revisions = [resolve(settings.repo, r) for r in settings.revisions]
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"command": command, "environment": measure.environment(device), "revisions": revisions,
              "load": {"cpus": os.cpu_count(), "load_1min": [os.getloadavg()[0]]}, "workloads": []}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="grpo-bench-revisions-") as tmp:
        extracted = {c: extract(settings.repo, c, Path(tmp)) for c in dict.fromkeys(r["commit"] for r in revisions)}
        trees = [extracted[r["commit"]] for r in revisions]
        for workload in settings.workloads:
            log(f"{workload}: {len(revisions)} revisions x {settings.rounds} rounds")
            report["workloads"].append(compare_workload(workload, revisions, trees, settings, Path(tmp), log))
            report["load"]["load_1min"].append(os.getloadavg()[0])
            # What is finished is on disk: a 135M workload is minutes per round.
            atomic_write_json(out / "revisions.json", report)
            atomic_write_text(out / "revisions.md", render_markdown(report) + "\n")
    report["wall_clock_s"] = time.perf_counter() - started
    atomic_write_json(out / "revisions.json", report)
    atomic_write_text(out / "revisions.md", render_markdown(report) + "\n")
    log(f"wrote {out}/revisions.md, revisions.json in {report['wall_clock_s']:.0f} s")
    return report
