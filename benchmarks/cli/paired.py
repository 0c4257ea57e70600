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
from typing import Optional

from benchmarks.errors import UsageError
from benchmarks.cli.options import seed_value, set_options
from benchmarks.io import atomic_write_json
from benchmarks.markdown import markdown_table, update_section


def add_paired_parser(sub) -> None:
    p = sub.add_parser("paired", help="per-question before/after evaluations and McNemar's exact test between them")
    which = p.add_subparsers(dest="paired_command", required=True, parser_class=type(p))
    e = which.add_parser("eval", help="evaluate one policy and keep per-question results")
    e.add_argument("--task", required=True)
    e.add_argument("--set", nargs="*", metavar="KEY=VALUE", help="task options (JSON values: 500, 0.0, true, \"sft\")")
    e.add_argument("--seed", type=seed_value, default=0)
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


def _question_range(text: str) -> tuple[int, Optional[int]]:
    """'A:B' -> (A, B); A defaults to 0 and B to the end (None)."""
    first, sep, last = text.partition(":")
    try:
        if sep:
            return int(first or 0), int(last) if last else None
    except ValueError:
        pass
    raise UsageError(f"--questions wants A:B (question numbers; either may be left out), got {text!r}")


def cmd_eval(args) -> int:
    from benchmarks.harness.paired import PairedEvalSettings, evaluate_paired  # heavy: torch, not for --help

    options = set_options(args.set)
    settings = PairedEvalSettings(task=args.task, task_options=options, seed=args.seed, device=args.device,
                                  label=args.label, questions=_question_range(args.questions) if args.questions else None,
                                  command=args.command_line)
    result = evaluate_paired(settings)
    out = Path(args.out)
    atomic_write_json(out, result)
    shown = ", ".join(f"{k} {v:.4f}" for k, v in result["metrics"].items() if not k.endswith("_se"))
    print(f"{result['label']}: {shown}; evaluate {result['seconds']['evaluate']:.0f} s -> {out}")
    return 0


def cmd_compare(args) -> int:
    from benchmarks.report.paired import SAME_SETTINGS, compare, merge  # start-up: decimal, ~5 ms of --help's 0.1 s

    before, after = (merge([json.loads(Path(p).read_text()) for p in files]) for files in (args.before, args.after))
    result = compare(before, after)
    result["settings"] = {k: before.get("describe", {}).get(k) for k in SAME_SETTINGS}
    result["wall_clock_s"] = {"before": before["seconds"], "after": after["seconds"]}
    result["files"] = {"before": args.before, "after": args.after}
    if args.out:
        atomic_write_json(Path(args.out), result)
    if args.readme:
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
                + f"\n\nRegenerate: `{args.command_line}`\n")
        update_section(args.readme, args.section, body)
    for key, t in result["tests"].items():
        print(f"{key}: {t['accuracy_before']:.4f} -> {t['accuracy_after']:.4f} (n {t['n']}, right->wrong b {t['b']}, "
              f"wrong->right c {t['c']}), McNemar exact p = {t['p_value']:.3g}")
    return 0
