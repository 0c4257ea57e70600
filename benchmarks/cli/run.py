"""``grpo-bench run`` (train one algorithm on one task) and ``grpo-bench eval`` (evaluate, no training).

Every algorithm option is generated from the algorithms' config dataclasses and every task option
from the task's own declaration, so ``--help`` shows each one's documentation and a new field
needs no change here. An option that belongs to another algorithm or task is refused with one line.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from algorithms import ALGORITHMS
from algorithms.base import config_fields, option_groups
from benchmarks.api import train
from benchmarks.cli.options import (
    add_dataclass_options, add_task_options, flag, given_options, load_reward_fn, run_settings_problem, seed_value,
    task_option_names, task_options_for,
)
from benchmarks.errors import UsageError
from benchmarks.harness.config import RunConfig, check_types, load_config_file
from benchmarks.harness.evaluate import evaluate_policy, tabulate_run
from tasks import TASKS


def add_run_parser(sub, name: str) -> None:
    p = sub.add_parser(name, help="train one algorithm on one task, evaluate before and after")
    run_group = p.add_argument_group("run")
    run_group.add_argument("--config", default=None, metavar="FILE",
                           help="settings from a .toml, .yaml/.yml or .json file: the names of these flags (dashes "
                                "or underscores) in one flat table; flags given here override the file")
    run_group.add_argument("--task", default=None, help=f"one of: {', '.join(sorted(TASKS))} (required, here or in --config)")
    run_group.add_argument("--algo", default=None, help=f"one of: {', '.join(sorted(ALGORITHMS))} (required, here or in --config)")
    add_dataclass_options(run_group, RunConfig, {}, "run", skip=("task", "algo", "command"))
    run_group.add_argument("--reward-fn", dest="reward_fn", default=None, metavar="MODULE:FUNC",
                           help="replace the task's reward: FUNC(prompts, completions) -> list of floats "
                                "(MODULE is an importable module or a path to a .py file)")
    algo_owners: dict[str, set] = {}
    # An option several algorithms take is listed once, under its own heading, not under the first of them.
    owners: dict[str, list[str]] = {}
    for name, cls in sorted(ALGORITHMS.items()):
        for option in config_fields(cls.Config):
            owners.setdefault(option, []).append(name)
    shared = {n for n, algos in owners.items() if len(algos) > 1}
    shared_group = p.add_argument_group("options of several algorithms", "options more than one algorithm takes; "
                                        "[algo] marks a meaning that differs between them")
    for name, cls in sorted(ALGORITHMS.items()):
        add_dataclass_options(shared_group, cls.Config, algo_owners, name, only=shared)
    for name, cls in sorted(ALGORITHMS.items()):
        takes = [flag(option) for option in config_fields(cls.Config) if option in shared]
        group = p.add_argument_group(f"{name} options", f"and of the options above: {', '.join(takes)}" if takes else None)
        add_dataclass_options(group, cls.Config, algo_owners, name, skip=shared)
        # a registry's members' own options (GRPO: each policy loss's and advantage estimator's), under the member
        for grouped in option_groups(cls.Config):
            members: dict[type, list[str]] = {}
            for member, options in grouped.members().items():
                if dataclasses.fields(options):
                    members.setdefault(options, []).append(member)
            for options, names in members.items():
                sub = p.add_argument_group(f"{name} options of {grouped.selector} {', '.join(names)}")
                add_dataclass_options(sub, options, algo_owners, name, skip=shared)
    add_task_options(p)
    p.set_defaults(handler=cmd_run)


def run_options(args) -> tuple[dict, Callable[[str], str]]:
    """The settings of ``--config`` overridden by the flags given, as the flat ``{name: value}`` mapping the
    harness resolves, and how to name a setting in an error (a flag, or a key of the file)."""
    # RunConfig's ``command`` is no flag (args.command is the subcommand's name): cmd_run records the command line.
    names = ({f.name for f in dataclasses.fields(RunConfig)} - {"command"} | task_option_names() | {"reward_fn"}
             | {option for cls in ALGORITHMS.values() for option in config_fields(cls.Config)})
    flags = given_options(args, names)
    from_file = load_config_file(args.config) if getattr(args, "config", None) else {}

    def spell(name: str) -> str:
        return flag(name) if name in flags or not from_file else f"{name!r} (in {args.config})"

    options = {**check_types(from_file, spell=spell), **flags}
    for name in ("task", "algo"):
        if options.get(name) is None:
            raise UsageError(f"--{name} is required (on the command line or in --config)")
    problem = run_settings_problem(options, spell)  # a seed out of range, temperature 0 for a group, ...
    if problem:
        raise UsageError(problem)
    if isinstance(options.get("reward_fn"), str):
        options["reward_fn"] = load_reward_fn(options["reward_fn"])
    return options, spell


def cmd_run(args) -> int:
    options, spell = run_options(args)
    # The API's default is a temporary directory; the command line's a folder per task, algorithm and seed, so that a
    # second run of something else does not meet the first one's folder.
    options.setdefault("out", f"runs/{options['task']}-{options['algo']}-seed{options.get('seed', RunConfig.seed)}")
    options["command"] = args.command_line
    summary = train(**options, spell=spell).summary
    rc = summary["config"]["run"]
    print(
        f"{summary['task']}/{summary['algo']} seed {summary['seed']}: accuracy {summary['accuracy_before']:.3f} -> "
        f"{summary['accuracy_after']:.3f}, reward {summary['reward_before']:.3f} -> {summary['reward_after']:.3f}, "
        f"{summary['wall_clock_s']:.1f} s, peak memory {summary['peak_memory_bytes'] / 2**20:.0f} MiB -> {rc['out']}"
    )
    return 0


def add_eval_parser(sub, name: str) -> None:
    p = sub.add_parser(name, help="evaluate a task's starting policy (or --model), or tabulate a run's before/after")
    p.add_argument("--task", required=True, help=f"one of: {', '.join(sorted(TASKS))}")
    p.add_argument("--seed", type=seed_value, default=0, help="evaluation sampling seed (default: 0)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda (default: auto)")
    p.add_argument("--out", default=None, help="folder for eval.json and eval.md (default: print only)")
    p.add_argument("--readme", default=None, metavar="PATH", help="also write the table as a section of this README")
    p.add_argument("--from-run", dest="from_run", default=None, metavar="RUN_DIR",
                   help="tabulate a finished run's before/after evaluation instead of evaluating")
    p.add_argument("--pass-at-k", dest="pass_at_k", default=None, metavar="K,K,..",
                   help="also evaluate pass@k for these k (e.g. 1,4,16), of --model beside the starting policy's")
    p.add_argument("--pass-samples", dest="pass_samples", type=int, default=None, metavar="N",
                   help="samples per question for --pass-at-k (>= the largest k; default: the largest k)")
    add_task_options(p)
    p.set_defaults(handler=cmd_eval)


def cmd_eval(args) -> int:
    options = task_options_for(args.task, given_options(args, task_option_names()))
    if args.from_run:
        return tabulate_run(args.task, args.from_run, out=args.out, readme=args.readme)
    return evaluate_policy(args.task, options, seed=args.seed, device=args.device, out=args.out, readme=args.readme,
                           pass_at_k=args.pass_at_k, pass_samples=args.pass_samples)
