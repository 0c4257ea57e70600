"""``grpo-bench paired eval|compare``: before/after evaluations on the same questions, kept per question,
and McNemar's exact test between two of them (benchmarks/report/paired.py).

    grpo-bench paired eval --task gsm8k --set starting_policy=base eval_questions=500 ... --out A.json
    grpo-bench paired eval --task gsm8k --set model=runs/x/final ... --out B.json
    grpo-bench paired compare --before A.json --after B.json --out A-vs-B.json
    (--questions 0:100 evaluates a slice; compare joins slices: --before A-0.json A-100.json ...)
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.errors import UsageError
from benchmarks.io import atomic_write_json


def add_paired_parser(sub) -> None:
    p = sub.add_parser("paired", help="per-question before/after evaluations and McNemar's exact test between them")
    which = p.add_subparsers(dest="paired_command", required=True, parser_class=type(p))
    e = which.add_parser("eval", help="evaluate one policy and keep per-question results")
    e.add_argument("--task", required=True)
    e.add_argument("--set", nargs="*", metavar="KEY=VALUE", help="task options (JSON values: 500, 0.0, true, \"sft\")")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--device", default="cpu")
    e.add_argument("--label", default=None)
    e.add_argument("--questions", default=None, metavar="A:B", help="evaluate only questions A..B-1 of the task's set")
    e.add_argument("--out", required=True)
    e.set_defaults(handler=cmd_eval)
    c = which.add_parser("compare", help="McNemar's exact test between two `paired eval` files")
    c.add_argument("--before", nargs="+", required=True, help="eval file(s); parts are joined in question order")
    c.add_argument("--after", nargs="+", required=True)
    c.add_argument("--out", default=None)
    c.add_argument("--readme", default=None, help="also write the table as a README section")
    c.add_argument("--section", default="gsm8k-paired", help="name of that README section (default: gsm8k-paired)")
    c.set_defaults(handler=cmd_compare)


def _value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def cmd_eval(args) -> int:
    import platform
    import time

    import torch

    from benchmarks.harness.loop import make_evaluated_task

    options = {}
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--set wants KEY=VALUE, got {item!r}")
        options[key] = _value(value)
    device = torch.device(args.device)
    start = time.perf_counter()
    task = make_evaluated_task(args.task, **options)
    model = task.load_policy(device)
    first, last = 0, len(task.eval_prompts)
    if args.questions:  # a slice of the evaluation questions, so a long evaluation can run in parts
        a, _, b = args.questions.partition(":")
        first, last = int(a or 0), min(int(b or last), last)
        task.eval_problems, task.eval_prompts = task.eval_problems[first:last], task.eval_prompts[first:last]
    loaded = time.perf_counter()
    metrics = task.evaluate(model, seed=args.seed)
    done = time.perf_counter()
    per_question = getattr(metrics, "per_question", None)
    if per_question is None:
        raise UsageError(f"task {args.task!r} keeps no per-question results; a paired test needs them")
    result = {
        "label": args.label or json.dumps(options, sort_keys=True), "task": args.task, "options": options, "seed": args.seed,
        "questions": [first, last],
        "metrics": dict(metrics), "describe": task.describe(), "per_question": per_question,
        "seconds": {"load_policy": loaded - start, "evaluate": done - loaded},
        "environment": {"device": str(device), "cpu": platform.processor() or platform.machine(),
                        "threads": torch.get_num_threads(), "torch": torch.__version__},
        "command": "grpo-bench paired eval " + " ".join(getattr(args, "argv", [])),
    }
    out = Path(args.out)
    atomic_write_json(out, result)
    shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if not k.endswith("_se"))
    print(f"{result['label']}: {shown}; evaluate {done - loaded:.0f} s -> {out}")
    return 0


def cmd_compare(args) -> int:
    from benchmarks.report.paired import SAME_SETTINGS, compare, merge

    before, after = (merge([json.loads(Path(p).read_text()) for p in files]) for files in (args.before, args.after))
    result = compare(before, after)
    result["settings"] = {k: before.get("describe", {}).get(k) for k in SAME_SETTINGS}
    result["wall_clock_s"] = {"before": before["seconds"], "after": after["seconds"]}
    result["files"] = {"before": args.before, "after": args.after}
    if args.out:
        atomic_write_json(Path(args.out), result)
    if args.readme:
        from benchmarks.report.readme import update_section
        from benchmarks.report.tables import markdown_table

        rows = [[key.replace("correct", "accuracy").replace("_", " "), f"{t['accuracy_before']:.3f}", f"{t['accuracy_after']:.3f}",
                 t["b"], t["c"], f"{t['p_value']:.3g}"] for key, t in result["tests"].items()]
        seconds = {side: sum(v.values()) for side, v in result["wall_clock_s"].items()}
        settings = result["settings"]
        subset = (f" (the first {result['questions']} whose reference solution takes at most {settings['eval_max_steps']} "
                  "calculator steps)" if settings.get("eval_max_steps") else "")
        sampling = ("greedy" if not settings.get("eval_temperature") else
                    f"{settings.get('eval_k')} samples per question at temperature {settings['eval_temperature']} (pass@k)")
        body = (f"{result['before']} -> {result['after']}, the same {result['questions']} test questions{subset}, seed "
                f"{result['seed']}, {sampling}, {settings.get('eval_max_new_tokens')} new tokens "
                f"({seconds['before']:.0f} s and {seconds['after']:.0f} s of evaluation on this CPU):\n\n"
                + markdown_table(["metric", "before", "after", "right -> wrong (b)", "wrong -> right (c)",
                                  "McNemar exact p"], rows)
                + "\n\nRegenerate: `grpo-bench paired compare --before " + " ".join(args.before) + " --after "
                + " ".join(args.after) + (f" --out {args.out}" if args.out else "") + f" --readme {args.readme}"
                + (f" --section {args.section}" if args.section != "gsm8k-paired" else "") + "`\n")
        update_section(args.readme, args.section, body)
    for key, t in result["tests"].items():
        print(f"{key}: {t['accuracy_before']:.4f} -> {t['accuracy_after']:.4f} (n {t['n']}, right->wrong b {t['b']}, "
              f"wrong->right c {t['c']}), McNemar exact p = {t['p_value']:.3g}")
    return 0
