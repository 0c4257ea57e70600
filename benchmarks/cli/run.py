"""``grpo-bench run`` (train one algorithm on one task) and ``grpo-bench eval`` (evaluate, no training).

Every algorithm option is generated from the algorithms' config dataclasses and every task option
from the task's own declaration, so ``--help`` shows each one's documentation and a new field
needs no change here: ``run --help`` the run's own options and a line per algorithm and task, ``run --algo NAME
--help`` (or ``--task NAME``) that one's options under its heading. An option that belongs to another algorithm or
task is refused with one line.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import textwrap
from typing import Callable, Optional

from algorithms import ALGORITHMS
from algorithms.base import config_fields, option_groups
from benchmarks.api import train
from benchmarks.cli.options import (
    PROG, add_dataclass_options, add_task_options, flag, given_options, load_reward_fn, run_settings_problem,
    seed_value, task_option_names, task_options_for,
)
from benchmarks.errors import UsageError
from benchmarks.harness.config import RunConfig, check_types, load_config_file
from benchmarks.harness.evaluate import evaluate_policy, tabulate_run
from tasks import TASKS


USAGE = "%(prog)s [-h] [--config FILE] [--task TASK] [--algo ALGO] [OPTION ...]"
DESCRIPTION = "train one algorithm on one task, evaluate before and after"


def add_run_parser(sub, name: str) -> None:
    # Every option of every algorithm and task parses here; --help shows the run's own and, per algorithm and task,
    # a line saying how to see theirs (RunHelp): all of them at once are 700 lines no one reads.
    p = sub.add_parser(name, help=DESCRIPTION, usage=USAGE, add_help=False)
    p.add_argument("-h", "--help", action=RunHelp, nargs=0, help=RunHelp.doc)
    add_run_options(p.add_argument_group("run"))
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
        add_algorithm_options(p, name, algo_owners, skip=shared,
                              description=f"and of the options above: {', '.join(takes)}" if takes else None)
    add_task_options(p)
    p.set_defaults(handler=cmd_run)


def add_run_options(group) -> None:
    """The options of a run whatever its algorithm and task."""
    group.add_argument("--config", default=None, metavar="FILE",
                       help="settings from a .toml, .yaml/.yml or .json file: the names of these flags (dashes "
                            "or underscores) in one flat table; flags given here override the file")
    group.add_argument("--task", default=None, help=f"one of: {', '.join(sorted(TASKS))} (required, here or in --config)")
    group.add_argument("--algo", default=None, help=f"one of: {', '.join(sorted(ALGORITHMS))} (required, here or in --config)")
    add_dataclass_options(group, RunConfig, {}, "run", skip=("task", "algo", "command"))
    group.add_argument("--reward-fn", dest="reward_fn", default=None, metavar="MODULE:FUNC",
                       help="replace the task's reward: FUNC(prompts, completions) -> list of floats "
                            "(MODULE is an importable module or a path to a .py file)")


def add_algorithm_options(parser, name: str, seen: dict[str, set], skip=(), description=None) -> None:
    """The algorithm ``name``'s options under the heading "NAME options" (those in ``skip`` left to another
    heading), then each registry member's own (GRPO: a policy loss's, an advantage estimator's) under
    "NAME options of SELECTOR MEMBER"."""
    cls = ALGORITHMS[name]
    add_dataclass_options(parser.add_argument_group(f"{name} options", description), cls.Config, seen, name, skip=skip)
    for grouped in option_groups(cls.Config):
        members: dict[type, list[str]] = {}
        for member, options in grouped.members().items():
            if dataclasses.fields(options):
                members.setdefault(options, []).append(member)
        for options, names in members.items():
            sub = parser.add_argument_group(f"{name} options of {grouped.selector} {', '.join(names)}")
            add_dataclass_options(sub, options, seen, name, skip=skip)


class RunHelp(argparse.Action):
    """``run --help``: the run's options, then one line per algorithm and per task saying how many options it has;
    with ``--algo NAME`` or ``--task NAME`` anywhere on the line, that one's options in full under its heading."""

    doc = "show this help and exit; with --algo NAME or --task NAME, that algorithm's or task's options too"

    def __call__(self, parser, namespace, values, option_string=None):
        named = given_names(getattr(parser, "arg_strings", []), ("algo", "task"))
        print(run_help(parser.prog, namespace.algo or named["algo"], namespace.task or named["task"]), end="")
        parser.exit()


def given_names(arg_strings: list[str], names) -> dict[str, Optional[str]]:
    """The value of each ``--NAME`` among ``arg_strings`` (``--NAME VALUE`` or ``--NAME=VALUE``; the last wins, as
    argparse's), None where it is not given. The help reads these before argparse has parsed the flags after it."""
    found = dict.fromkeys(names)
    for i, word in enumerate(arg_strings):
        for name in names:
            if word == flag(name) and i + 1 < len(arg_strings):
                found[name] = arg_strings[i + 1]
            elif word.startswith(flag(name) + "="):
                found[name] = word.split("=", 1)[1]
    return found


def run_help(prog: str, algo: Optional[str] = None, task: Optional[str] = None) -> str:
    """The text of ``run --help``, with ``algo``'s and ``task``'s options when named. Its own parser, never used
    to parse: the run parser parses every option and this one only lays out the help."""
    if algo is not None and algo not in ALGORITHMS:
        raise UsageError(f"unknown algorithm {algo!r}; choose from {', '.join(sorted(ALGORITHMS))}")
    if task is not None and task not in TASKS:
        raise UsageError(f"unknown task {task!r}; choose from {', '.join(sorted(TASKS))}")
    width = shutil.get_terminal_size().columns - 2  # argparse's own width

    def listing(heading: str, rows: dict[str, str]) -> str:
        return "\n".join([heading] + [textwrap.fill(text, width, initial_indent=f"  {name:<16}",
                                                     subsequent_indent=" " * 18) for name, text in rows.items()])

    blocks = []
    if algo is None:
        blocks.append(listing(f"algorithms ({PROG} run --algo NAME --help lists one's options under its heading):",
                              {name: _algorithm_summary(cls.Config) for name, cls in sorted(ALGORITHMS.items())}))
    if task is None:
        blocks.append(listing(f"tasks ({PROG} run --task NAME --help lists one's options):",
                              {name: f"{len(cls.options())} options: {', '.join(map(flag, cls.options()))}"
                               for name, cls in sorted(TASKS.items())}))
    shown = argparse.ArgumentParser(prog=prog, usage=USAGE, description=DESCRIPTION, epilog="\n\n".join(blocks),
                                    formatter_class=argparse.RawDescriptionHelpFormatter, add_help=False)
    shown.add_argument("-h", "--help", action="store_true", help=RunHelp.doc)
    add_run_options(shown.add_argument_group("run"))
    if algo is not None:
        add_algorithm_options(shown, algo, {})
    if task is not None:
        add_task_options(shown, only=task)
    return shown.format_help()


def _algorithm_summary(config_cls) -> str:
    """"N options", and how many of them belong to a registry member (GRPO's policy losses, ...)."""
    text = f"{len(config_fields(config_cls))} options"
    selectors = [grouped.selector for grouped in option_groups(config_cls)]
    if selectors:
        members = sum(len(grouped.fields()) for grouped in option_groups(config_cls))
        named = selectors[0] if len(selectors) == 1 else f"{', '.join(selectors[:-1])} or {selectors[-1]}"
        text += f", {members} of them for one {named} only"
    return text


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
