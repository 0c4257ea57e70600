"""``grpo-bench eval``: a task's evaluation of its starting policy (or of a saved model), no training.

    grpo-bench eval --task gsm8k --eval-questions 200 --eval-k 4 --out results/gsm8k --readme README.md
    grpo-bench eval --task gsm8k --from-run runs/gsm8k-grpo --out results/gsm8k   # before/after table of a run

Writes OUT/eval.json (metrics, task description, device, versions, seconds) and OUT/eval.md (a table);
with --from-run, OUT/before_after.{json,md} from the run's summary.json (the harness evaluated the
same questions with the same seed before and after training).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from benchmarks import measure
from benchmarks.harness import UsageError, make_evaluated_task
from benchmarks.io import atomic_write_json, atomic_write_text
from benchmarks.readme import update_section
from tasks import TASKS

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


def cmd_eval(args, task_owners) -> int:
    from benchmarks.cli import task_options

    if args.task not in TASKS:
        raise UsageError(f"unknown task {args.task!r}; choose from {', '.join(sorted(TASKS))}")
    options = task_options(args, task_owners)
    out = Path(args.out) if args.out else None
    if args.from_run:
        summary_path = Path(args.from_run) / "summary.json"
        if not summary_path.is_file():
            raise UsageError(f"--from-run: no summary.json in {args.from_run} (has the run finished?)")
        summary = json.loads(summary_path.read_text())
        table = before_after_table(summary)
        title = (f"{summary['task']}/{summary['algo']}, {summary['steps']} steps, seed {summary['seed']}, "
                 f"{summary['wall_clock_s']:.0f} s on {summary['device_name']}")
        body = f"Before/after training ({title}; same questions and seed before and after):\n\n{table}\n"
        if out:
            atomic_write_json(out / "before_after.json", {k: v for k, v in summary.items() if k != "config"})
            atomic_write_text(out / "before_after.md", body)
        print(body)
        if args.readme:
            update_section(args.readme, f"{args.task}-before-after", body)
        return 0

    try:
        device = measure.resolve_device(args.device)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    task = make_evaluated_task(args.task, **options)
    model = task.load_policy(device)
    start = time.perf_counter()
    metrics = task.evaluate(model, seed=args.seed)
    seconds = time.perf_counter() - start
    label = options.get("model") or f"{task.name} starting policy"
    body = (f"{args.task} evaluation of {label}, no training ({_settings_line(task)}, seed {args.seed}; ± is the "
            f"standard error over questions; {seconds:.0f} s on {measure.environment(device)['device_name']}):\n\n"
            f"{eval_table(label, metrics)}\n")
    if out:
        atomic_write_json(out / "eval.json", {"task": task.describe(), "seed": args.seed, "metrics": metrics,
                                              "seconds": seconds, "environment": measure.environment(device)})
        atomic_write_text(out / "eval.md", body)
    print(body)
    if args.readme:
        update_section(args.readme, f"{args.task}-baseline", body)
    return 0


def add_parser(subparsers) -> None:
    from benchmarks.cli import add_task_options

    p = subparsers.add_parser("eval", help="evaluate a task's starting policy (or --model), or tabulate a run's before/after")
    p.add_argument("--task", required=True, help=f"one of: {', '.join(sorted(TASKS))}")
    p.add_argument("--seed", type=int, default=0, help="evaluation sampling seed (default: 0)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda (default: auto)")
    p.add_argument("--out", default=None, help="folder for eval.json and eval.md (default: print only)")
    p.add_argument("--readme", default=None, metavar="PATH", help="also write the table as a section of this README")
    p.add_argument("--from-run", dest="from_run", default=None, metavar="RUN_DIR",
                   help="tabulate a finished run's before/after evaluation instead of evaluating")
    owners = add_task_options(p)
    p.set_defaults(handler=lambda a: cmd_eval(a, owners))
