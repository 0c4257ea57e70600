"""``grpo-bench survey``: a starting policy's accuracy across candidate task settings, to pick tasks with headroom.

    grpo-bench survey --task reasoning_gym --candidate chain_sum --candidate 'leg_counting:{"max_animals": 2}' \\
        --set eval_problems=500 --out results/reasoning-gym

A candidate is DATASET or DATASET:JSON_CONFIG (the reasoning_gym task's ``dataset`` / ``dataset_config``),
or a JSON object of task options. Writes OUT/survey.csv and OUT/survey.md (``benchmarks.harness.survey``).
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.cli.options import seed_value, set_options
from benchmarks.errors import UsageError


def add_survey_parser(sub) -> None:
    p = sub.add_parser("survey", help="start accuracy of a task's starting policy across candidate settings")
    p.add_argument("--task", default="reasoning_gym")
    p.add_argument("--candidate", action="append", required=True, metavar="DATASET[:JSON]|{JSON}",
                   help="a dataset with its optional JSON config, or a JSON object of task options (repeatable)")
    p.add_argument("--set", nargs="*", metavar="KEY=VALUE", help="task options every candidate shares (JSON values)")
    p.add_argument("--band", default="0.10:0.60", metavar="LO:HI", help="start accuracy counted as headroom")
    p.add_argument("--seed", type=seed_value, default=0, help="evaluation sampling seed")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", required=True, help="folder for survey.csv and survey.md")
    p.add_argument("--resume", action="store_true", help="keep OUT/survey.csv's rows and skip the candidates in it")
    p.set_defaults(handler=cmd_survey)


def parse_candidate(text: str) -> dict:
    """'chain_sum' -> {"dataset": "chain_sum"}; 'chain_sum:{"max_terms": 2}' adds dataset_config; '{...}' as it is."""
    if text.lstrip().startswith("{"):
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise UsageError(f"--candidate: not a JSON object: {text!r} ({exc})") from None
        if not isinstance(value, dict):
            raise UsageError(f"--candidate: not a JSON object: {text!r}")
        return value
    name, sep, config = text.partition(":")
    if not name:
        raise UsageError(f"--candidate wants DATASET[:JSON], got {text!r}")
    if not sep:
        return {"dataset": name}
    try:
        parsed = json.loads(config)
    except ValueError:
        raise UsageError(f"--candidate {name}: config is not JSON: {config!r}") from None
    return {"dataset": name, "dataset_config": json.dumps(parsed, sort_keys=True)}


def cmd_survey(args) -> int:
    from benchmarks.harness.survey import SurveySettings, run_survey  # heavy: torch, not for --help

    common = set_options(args.set)
    try:
        lo, hi = (float(x) for x in args.band.split(":"))
    except ValueError:
        raise UsageError(f"--band wants LO:HI, got {args.band!r}") from None
    settings = SurveySettings(task=args.task, candidates=tuple(parse_candidate(c) for c in args.candidate), common=common,
                              band=(lo, hi), seed=args.seed, device=args.device, command=args.command_line)
    run_survey(settings, Path(args.out), resume=args.resume, log=lambda line: print(line, flush=True))
    print(f"-> {Path(args.out) / 'survey.md'}")
    return 0
