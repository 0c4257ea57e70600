"""``grpo-bench eval``: a task's evaluation of its starting policy (or of a saved model), no training.

    grpo-bench eval --task gsm8k --eval-questions 200 --eval-k 4 --out results/gsm8k --readme README.md
    grpo-bench eval --task gsm8k --from-run runs/gsm8k-grpo --out results/gsm8k   # before/after table of a run

Writes OUT/eval.json (metrics, task description, device, versions, seconds) and OUT/eval.md (a table);
with --from-run, OUT/before_after.{json,md} from the run's summary.json (the harness evaluated the
same questions with the same seed before and after training).
"""

from __future__ import annotations

import time
from pathlib import Path

from typing import Optional

from benchmarks.errors import UsageError
from benchmarks.harness import measure
from benchmarks.harness.loop import make_evaluated_task
from benchmarks.io import atomic_write_json, atomic_write_text, read_json
from benchmarks.markdown import update_section
from benchmarks.passk import parse_ks, pass_at_k_against_start, pass_at_k_table

# What the before/after table's title reads of a run's summary.json.
SUMMARY_KEYS = ("task", "algo", "steps", "seed", "wall_clock_s", "device_name")
# Metrics shown first, each with its standard error when the task reports one (``NAME_se``).
LEADING = ("accuracy", "format", "reward")


def _cell(metrics: dict, name: str) -> str:
    value = metrics[name]
    se = metrics.get(f"{name}_se")
    return f"{value:.3f} ± {se:.3f}" if se is not None and se == se else f"{value:.3f}"


def _names(metrics: dict) -> list[str]:
    rest = sorted(k for k in metrics if not k.endswith("_se") and k not in LEADING)
    return [k for k in LEADING if k in metrics] + rest


def eval_table(label: str, metrics: dict) -> str:
    names = _names(metrics)
    return "\n".join([
        "| model | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
        f"| {label} | " + " | ".join(_cell(metrics, n) for n in names) + " |",
    ])


def before_after_table(summary: dict) -> str:
    before = {k[: -len("_before")]: v for k, v in summary.items() if k.endswith("_before") and isinstance(v, (int, float))}
    after = {k[: -len("_after")]: v for k, v in summary.items() if k.endswith("_after") and isinstance(v, (int, float))}
    rows = ["| metric | before | after |", "|---|---|---|"]
    rows += [f"| {n} | {_cell(before, n)} | {_cell(after, n)} |" for n in _names(before) if n in after]
    return "\n".join(rows)


def _settings_line(task) -> str:
    d = task.describe()
    keys = [k for k in ("eval_questions", "eval_k", "eval_temperature", "eval_max_new_tokens", "model", "data") if k in d]
    return ", ".join(f"{k} {d[k]}" for k in keys)


def tabulate_run(task: str, run_dir: str, *, out: Optional[str], readme: Optional[str]) -> int:
    """OUT/before_after.{json,md} (and a README section) from a finished run's summary.json."""
    summary_path = Path(run_dir) / "summary.json"
    if not summary_path.is_file():
        raise UsageError(f"--from-run: no summary.json in {run_dir} (has the run finished?)")
    summary = read_json(summary_path)
    if summary is None or not all(key in summary for key in SUMMARY_KEYS):
        raise UsageError(f"--from-run: {summary_path} is not a readable run summary (cut short or damaged)")
    table = before_after_table(summary)
    title = (f"{summary['task']}/{summary['algo']}, {summary['steps']} steps, seed {summary['seed']}, "
             f"{summary['wall_clock_s']:.0f} s on {summary['device_name']}")
    body = f"Before/after training ({title}; same questions and seed before and after):\n\n{table}\n"
    if out:
        atomic_write_json(Path(out) / "before_after.json", {k: v for k, v in summary.items() if k != "config"})
        atomic_write_text(Path(out) / "before_after.md", body)
    print(body)
    if readme:
        update_section(readme, f"{task}-before-after", body)
    return 0


def evaluate_policy(task_name: str, options: dict, *, seed: int, device: str, out: Optional[str], readme: Optional[str],
                    pass_at_k: Optional[str] = None, pass_samples: Optional[int] = None) -> int:
    """Evaluate a task's starting policy: OUT/eval.{json,md} (and a README section); with ``pass_at_k`` also
    pass@k, of a saved model (--model) beside the starting policy's."""
    ks, samples = parse_ks(pass_at_k, pass_samples)
    try:
        device = measure.resolve_device(device)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    task = make_evaluated_task(task_name, **options)
    model = task.load_policy(device)
    start = time.perf_counter()
    metrics = task.evaluate(model, seed=seed)
    seconds = time.perf_counter() - start
    label = options.get("model") or f"{task.name} starting policy"
    body = (f"{task_name} evaluation of {label}, no training ({_settings_line(task)}, seed {seed}; ± is the "
            f"standard error over questions; {seconds:.0f} s on {measure.environment(device)['device_name']}):\n\n"
            f"{eval_table(label, metrics)}\n")
    passk = pass_at_k_against_start(make_evaluated_task, task_name, options, task, model, label, ks, samples, seed,
                                    device) if ks else {}
    body += f"\npass@k, {samples} samples a question:\n\n{pass_at_k_table(passk)}\n" if passk else ""
    if out:
        atomic_write_json(Path(out) / "eval.json", {"task": task.describe(), "seed": seed, "metrics": metrics,
                                              **({"pass_at_k": passk} if passk else {}),
                                              "seconds": seconds, "environment": measure.environment(device)})
        atomic_write_text(Path(out) / "eval.md", body)
    print(body)
    if readme:
        update_section(readme, f"{task_name}-baseline", body)
    return 0
