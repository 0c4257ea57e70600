"""pass@k of a policy on a task's held-out questions (``Task.evaluate_pass_at_k``), as a run's summary and
``grpo-bench eval`` record it: ``pass_at_k`` {"1": .., "4": .., "16": ..} and the per-question counts of correct
samples (``encode_correct``'s record), off unless a run asks (``--pass-at-k 1,4,16 --pass-samples N``)."""

from __future__ import annotations

from typing import Optional

from benchmarks.errors import UsageError
from benchmarks.io import encode_correct
from tasks.base import TaskError


def parse_ks(text: Optional[str], samples: Optional[int], *, flag: str = "--pass-at-k",
             samples_flag: str = "--pass-samples") -> tuple[tuple[int, ...], int]:
    """(the sorted distinct ks, the samples per question) from "1,4,16" and N (None: the largest k); () and 0 when
    ``text`` is None (off). Anything else is one UsageError line."""
    if text is None or str(text).strip() == "":
        if samples is not None:
            raise UsageError(f"{samples_flag} is the samples per question of {flag}; give {flag} too")
        return (), 0
    try:
        ks = tuple(sorted({int(part) for part in str(text).split(",")}))
    except ValueError:
        raise UsageError(f"{flag} takes comma-separated whole numbers (e.g. 1,4,16), got {text!r}") from None
    if ks[0] < 1:
        raise UsageError(f"{flag}: every k must be >= 1, got {text!r}")
    n = ks[-1] if samples is None else samples
    if n < ks[-1]:
        raise UsageError(f"{samples_flag} ({n}) must be >= the largest k of {flag} ({ks[-1]})")
    return ks, n


def pass_at_k_evaluation(task, model, ks: tuple[int, ...], samples: int, seed: int) -> tuple[dict, Optional[dict]]:
    """({"pass_at_k": {k: value}}, the per-question record) of ``model``; ({}, None) when ``ks`` is empty (off). A
    task without a notion of correct is one UsageError line."""
    if not ks:
        return {}, None
    try:
        got = task.evaluate_pass_at_k(model, ks, samples, seed=seed)
    except TaskError as exc:
        raise UsageError(str(exc)) from None
    return {"pass_at_k": got["pass_at_k"]}, encode_correct(got["correct"])


def pass_at_k_against_start(make_evaluated_task, task_name: str, options: dict, task, model, label: str,
                            ks: tuple[int, ...], samples: int, seed: int, device) -> dict:
    """``grpo-bench eval``'s pass@k: {label: {"pass_at_k": .., "questions": record}} of ``model`` and, when it is a
    saved model (``options["model"]``, e.g. a run's OUT/final), of the task's starting policy beside it, on the
    same questions with the same seed. ``make_evaluated_task`` builds the starting policy's task (the harness's)."""
    policies = {label: (task, model)}
    if options.get("model"):
        start = make_evaluated_task(task_name, **{k: v for k, v in options.items() if k != "model"})
        policies[f"{task.name} starting policy"] = (start, start.load_policy(device))
    out = {}
    for name, (evaluated, policy) in policies.items():
        found, record = pass_at_k_evaluation(evaluated, policy, ks, samples, seed)
        out[name] = {**found, "questions": record}
    return out


def pass_at_k_table(results: dict) -> str:
    """A markdown table of ``pass_at_k_against_start``'s results: a row a policy, a column a k."""
    ks = list(next(iter(results.values()))["pass_at_k"])
    rows = ["| model | " + " | ".join(f"pass@{k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    rows += [f"| {name} | " + " | ".join(f"{r['pass_at_k'][k]:.3f}" for k in ks) + " |" for name, r in results.items()]
    return "\n".join(rows)
