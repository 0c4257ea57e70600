"""One policy's evaluation kept question by question, for a paired test between two of them.

``evaluate_paired`` evaluates a task's policy (its starting policy, or the ``model`` its options name)
on the task's evaluation questions, or on a range of them (``Task.evaluation_subset``), and keeps each
question's results (``Task.evaluate_per_question``); McNemar's test between two such results is
``benchmarks.report.paired``. ``grpo-bench paired eval`` is its command line.
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import dataclass, field
from typing import Optional

import torch

from benchmarks.harness import measure
from benchmarks.harness.loop import make_evaluated_task
from tasks.base import answer_concentration


@dataclass(frozen=True)
class PairedEvalSettings:
    task: str  # a registered task's name
    task_options: dict = field(default_factory=dict)  # the task's options by name, e.g. {"eval_questions": 500}
    seed: int = 0  # evaluation sampling seed: two results are compared only at the same seed
    device: str = "cpu"  # auto, cpu or cuda
    label: Optional[str] = None  # the policy's name in a comparison (default: the task options as JSON)
    questions: Optional[tuple[int, Optional[int]]] = None  # (first, last): questions first .. last - 1 only; last None: to the end
    command: Optional[str] = None  # the command line that asked for this evaluation (None from Python)


def evaluate_paired(settings: PairedEvalSettings) -> dict:
    """The result ``benchmarks.report.paired.compare`` reads: label, task, options, seed, the question range,
    metrics, the task's describe(), per-question results, seconds per phase, environment and command."""
    device = measure.requested_device(settings.device)
    start = time.perf_counter()
    task = make_evaluated_task(settings.task, **settings.task_options)
    if settings.questions is not None:  # a range of the questions, so that a long evaluation can run in parts
        task = task.evaluation_subset(*settings.questions)
    model = task.load_policy(device)
    loaded = time.perf_counter()
    metrics = task.evaluate_per_question(model, seed=settings.seed)
    done = time.perf_counter()
    first = task.eval_first
    return {
        "label": settings.label or json.dumps(settings.task_options, sort_keys=True), "task": settings.task,
        "options": settings.task_options, "seed": settings.seed,
        "questions": [first, first + len(metrics.per_question["row"])],
        "metrics": dict(metrics), "describe": task.describe(), "per_question": metrics.per_question,
        "seconds": {"load_policy": loaded - start, "evaluate": done - loaded},
        "environment": {"device": str(device), "cpu": platform.processor() or platform.machine(),
                        "threads": torch.get_num_threads(), "torch": torch.__version__},
        "command": settings.command,
    }


def answers_alike(before: dict, after: dict) -> Optional[dict]:
    """How alike each of two ``evaluate_paired`` results answers ({"top": its most common answer, "share": of all its
    answers}) and the same of the reference answers, under "before", "after" and "reference"; None where a side's
    answers or the references are not known. The answers are the evaluation's ``given``; a Reasoning Gym result
    written before its evaluation kept them has them read again from its completions by the task's own rule."""
    given = [_given(r) for r in (before, after)]
    references = before["per_question"].get("answer")
    if any(g is None for g in given) or not references:
        return None
    out = {side: dict(zip(("top", "share"), answer_concentration(g))) for side, g in zip(("before", "after"), given)}
    out["reference"] = dict(zip(("top", "share"), answer_concentration([str(a) for a in references])))
    return out


def _given(result: dict) -> Optional[list]:
    per_question = result["per_question"]
    if "given" in per_question:
        return [a for row in per_question["given"] for a in row]
    if result.get("task") != "reasoning_gym" or "completions" not in per_question:
        return None
    from tasks.reasoning_gym import given_answer  # reasoning-gym's task: only for such a result

    describe = result.get("describe", {})
    return [given_answer(text, describe.get("extract", "last_number"), bool(describe.get("answer_prefill")))
            for row in per_question["completions"] for text in row]
