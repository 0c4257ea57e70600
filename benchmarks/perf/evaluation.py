"""``grpo-bench bench eval``: what one held-out evaluation of a matrix's task costs with each way of decoding it,
side by side, and whether the answers stay the same.

A real-LM cell evaluates 300 questions greedily 5 times; at bf16 that is more of the cell than training. The setups
(``SETUPS``, ``--setups``) are the task's decoding options for the same questions: every prompt encoded whole and every row decoded
to its batch's end (the committed matrices' first instrument), the shared prefix encoded once (``eval_share_prefix``),
and the finished rows dropped from the batch as well (``eval_drop_finished``). Each policy (the task's starting one,
and any checkpoint of a cell) is evaluated by every setup in interleaved rounds, each setup leading a round in turn,
on ``threads`` torch threads. Cost is the process's CPU seconds (core-seconds) per evaluation, median over rounds,
with wall seconds beside it; the speed-up is the first setup's over the other's in the same round, median with a
percentile-bootstrap 95% interval. Agreement: the questions whose completion differs from the first setup's, and
whether a setup's answers were the same in every round."""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from pathlib import Path

import torch

from benchmarks.errors import UsageError
from benchmarks.harness import resolve
from benchmarks.harness.loop import make_evaluated_task
from benchmarks.harness.measure import environment
from benchmarks.io import atomic_write_text
from benchmarks.markdown import markdown_table
from benchmarks.matrix.plan import variant_settings
from benchmarks.perf.grpo_vs_trl import median_interval
from benchmarks.study import StudySettings, at_least, measure_parts, option
from tasks import TASKS

# name -> the task's decoding options; each is one way to evaluate the same questions with the same greedy answers.
SETUPS = {
    "whole": {"eval_share_prefix": False, "eval_drop_finished": False},  # every prompt whole, every row to the end
    "shared": {"eval_share_prefix": True, "eval_drop_finished": False},  # the shared prefix encoded once
    "shared+drop": {"eval_share_prefix": True, "eval_drop_finished": True},  # and the finished rows dropped
}
BASE = "base"  # the task's starting policy, as --policies names it


@dataclasses.dataclass
class EvalBenchSettings(StudySettings):
    matrix: str = dataclasses.field(default="benchmarks/matrices/rg_verdict_chain_sum.toml", metadata={
        "help": "matrix file whose task (its first variant's settings) is evaluated"})
    task: str = dataclasses.field(default=None, metadata={"help": "the matrix's task label (default: its first)"})
    policies: tuple[str, ...] = dataclasses.field(default=(BASE,), metadata={
        "help": f"comma-separated policies: {BASE} (the task's starting policy) or a cell's checkpoint file "
                "(OUT/.../checkpoints/step_*.pt)", "comma_separated": True})
    setups: tuple[str, ...] = dataclasses.field(default=tuple(SETUPS), metadata={
        "help": f"comma-separated ways to decode, the first the reference of every ratio: {', '.join(SETUPS)}",
        "comma_separated": True})
    rounds: int = dataclasses.field(default=3, metadata={"help": "timed rounds (every setup once a round)"})
    seed: int = option("seed")
    threads: int = option("threads", 1, shown="1, a matrix cell's one core")
    out: str = option("out", "results/perf")  # eval.md and eval.json
    resume: bool = option("resume")  # the policies OUT's eval.json measured with the same settings


def _policy(task, name: str) -> tuple:
    """(the policy, what it is: the task's starting policy, or a run's checkpoint and its step)."""
    model = task.load_policy(torch.device("cpu"))
    if name == BASE:
        return model.eval(), "the task's starting policy"
    try:
        state = torch.load(name, map_location="cpu", weights_only=False)
        model.load_state_dict(state["policy"])
    except (OSError, KeyError, RuntimeError, ValueError) as e:
        raise UsageError(f"--policies: {name} is not a checkpoint of this task's policy: {e!r}") from None
    return model.eval(), f"run {Path(name).parent.parent} at step {state.get('step', '?')} (its config.json says how it trained)"


def time_policy(name: str, tasks: dict, *, rounds: int, seed: int, log=print) -> dict:
    """Every setup's evaluations of one policy in interleaved rounds, and what they say."""
    labels = list(tasks)
    model, what = _policy(tasks[labels[0]], name)
    runs: dict[str, list[dict]] = {label: [] for label in labels}
    for r in range(rounds):
        for i in range(len(labels)):
            label = labels[(r + i) % len(labels)]
            cpu, wall = time.process_time(), time.perf_counter()
            metrics = tasks[label].evaluate(model, seed=seed)
            runs[label].append({"core_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall,
                                "accuracy": metrics["accuracy"], "completion_tokens": metrics["completion_tokens"],
                                "completions": tasks[label].last_evaluation["completions"]})
        log(f"  round {r + 1}/{rounds}: " + ", ".join(f"{label} {runs[label][-1]['core_s']:.1f} core-s" for label in labels))
    reference = runs[labels[0]]
    out = {"policy": what}
    for label in labels:
        mine = runs[label]
        ratios = [a["core_s"] / b["core_s"] for a, b in zip(reference, mine)]
        out[label] = {
            "core_s": statistics.median(m["core_s"] for m in mine), "wall_s": statistics.median(m["wall_s"] for m in mine),
            "speedup": statistics.median(ratios), "speedup_ci95": list(median_interval(ratios, seed=seed)),
            "accuracy": mine[0]["accuracy"], "completion_tokens": mine[0]["completion_tokens"],
            "questions": len(mine[0]["completions"]),
            "differ_from_reference": sum(a != b for a, b in zip(mine[0]["completions"], reference[0]["completions"])),
            "same_every_round": all(m["completions"] == mine[0]["completions"] for m in mine),
            "rounds": [{k: v for k, v in m.items() if k != "completions"} for m in mine]}
    return out


def headline(report: dict) -> str:
    """Per policy, the last setup's speed-up over the first's, and how many answers differ."""
    first, last = report["setups"][0], report["setups"][-1]
    parts = []
    for policy, by_setup in report["policies"].items():
        r = by_setup[last]
        low, high = r["speedup_ci95"]
        parts.append(f"{Path(policy).name} {by_setup[first]['core_s']:.0f} -> {r['core_s']:.0f} core-s, "
                     f"{r['speedup']:.2f}x [{low:.2f}, {high:.2f}], {r['differ_from_reference']} of {r['questions']} "
                     "answers differ")
    return f"**One evaluation, `{last}` against `{first}`: " + "; ".join(parts) + ".**"


def render(report: dict) -> str:
    env = report["environment"]
    lines = [f"# What a held-out evaluation costs, by how it decodes (`{report['command']}`)", "", headline(report), "",
             f"Matrix `{report['matrix']}`, task `{report['task']}` as its cells evaluate it, {env['device_name']}, "
             f"{report['threads']} torch thread(s), torch {env['versions'].get('torch', '?')}, seed {report['seed']}, "
             f"{report['rounds']} interleaved rounds. 1-minute load average {report['load']['start']:.1f} at the start "
             f"and {report['load']['end']:.1f} at the end on {os.cpu_count()} CPUs (other work shared the machine: the "
             "ratios are side by side in one process; the seconds are this machine's under that load).", "",
             "Core-seconds: the process's CPU time for one evaluation, median over rounds (wall seconds beside it). "
             "Speed-up: the first setup's core-seconds over this setup's in the same round, median [95% bootstrap]. "
             "Differ: questions whose greedy completion is not the first setup's, of all evaluated. Setups: "
             + "; ".join(f"`{name}` " + ", ".join(f"{k} {v}" for k, v in SETUPS.get(name, {}).items()) for name in report["setups"])
             + ".", ""]
    rows = []
    for policy, by_setup in report["policies"].items():
        for label, r in ((label, by_setup[label]) for label in report["setups"]):
            low, high = r["speedup_ci95"]
            rows.append([Path(policy).name, label, f"{r['core_s']:.1f}", f"{r['wall_s']:.1f}",
                         f"{r['speedup']:.2f}x [{low:.2f}, {high:.2f}]", f"{r['accuracy']:.3f}",
                         f"{r['completion_tokens']:.1f}", f"{r['differ_from_reference']} of {r['questions']}",
                         "yes" if r["same_every_round"] else "no"])
    lines.append(markdown_table(["policy", "setup", "core-s", "wall s", "speed-up", "accuracy", "tokens per answer",
                                 "differ", "same every round"], rows))
    lines += ["", "Policies: " + "; ".join(f"`{Path(policy).name}`, {by_setup.get('policy', policy)}"
                                      for policy, by_setup in report["policies"].items()) + "."]
    return "\n".join(lines) + "\n"


def run_eval_bench(settings: EvalBenchSettings, *, command: str = "grpo-bench bench eval", log=print) -> dict:
    at_least(rounds=(settings.rounds, 2), threads=(settings.threads, 1))
    unknown = [name for name in settings.setups if name not in SETUPS]
    if unknown or len(set(settings.setups)) < 2:
        raise UsageError(f"--setups takes two or more of {', '.join(SETUPS)}; got {', '.join(settings.setups)}")
    missing = [p for p in settings.policies if p != BASE and not Path(p).is_file()]
    if missing:
        raise UsageError(f"--policies: no checkpoint file {', '.join(missing)}")
    task_label, variants = variant_settings(settings.matrix, settings.task)
    rc, _, task_options = resolve({**variants[0][1], "out": "/dev/null", "device": "cpu"})
    lacking = sorted({option for name in settings.setups for option in SETUPS[name]} - set(TASKS[rc.task].options()))
    if lacking:
        raise UsageError(f"task {rc.task} has no {', '.join(lacking)} option: its evaluation has one way to decode")
    torch.set_num_threads(settings.threads)
    out = Path(settings.out)
    same = {"matrix": settings.matrix, "task": task_label, "seed": settings.seed, "rounds": settings.rounds,
            "threads": settings.threads, "setups": list(settings.setups)}
    header = {"command": command, **same, "task_options": task_options, "environment": environment(torch.device("cpu")),
              "load": {"start": os.getloadavg()[0], "end": None}}
    tasks = {name: make_evaluated_task(rc.task, **{**task_options, **SETUPS[name]}) for name in settings.setups}
    report = measure_parts(settings, out / "eval.json", same, header, [(p, p) for p in settings.policies],
                           key="policies", log=log,
                           measure=lambda policy: time_policy(policy, tasks, rounds=settings.rounds, seed=settings.seed,
                                                              log=log))
    atomic_write_text(out / "eval.md", render(report))
    log(f"-> {out / 'eval.md'}")
    return report
