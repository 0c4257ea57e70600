"""The ``grpo-bench`` command line.

Every algorithm option is generated from the algorithms' config dataclasses, so ``--help`` shows each
field's documentation and a new field needs no CLI change. An option that belongs to another
algorithm or task is refused with one line. Bad input never shows a traceback: one line, exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import inspect
import sys
import typing
from pathlib import Path
from typing import Any, Callable, Optional

from algorithms import ALGORITHMS, AlgoConfig
from algorithms.base import config_fields
from benchmarks.harness import RunConfig, TrainingFailed, UsageError
from tasks import TASKS, TaskError

PROG = "grpo-bench"


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2 (argparse prints the usage too)."""

    def error(self, message: str):
        raise UsageError(message)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _field_type(f: dataclasses.Field, owner) -> Any:
    hint = typing.get_type_hints(owner).get(f.name, str)
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def _add_dataclass_options(group, cls, seen: dict[str, set], owner_name: str, skip=()) -> None:
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        seen.setdefault(f.name, set()).add(owner_name)
        doc = f.metadata.get("help", "")
        default = f.default if f.default is not dataclasses.MISSING else None
        help_text = f"{doc} (default: {default})" if doc else f"default: {default}"
        if len(seen[f.name]) > 1:  # added by another algorithm: say what it means, and its default, for this one
            action = group._option_string_actions[_flag(f.name)]
            if f.name not in config_fields(AlgoConfig) and owner_name not in (action.help or ""):
                first = "" if "[" in (action.help or "") else f"[{sorted(seen[f.name] - {owner_name})[0]}] "
                action.help = f"{first}{action.help} | [{owner_name}] {help_text}"
            continue
        kind = _field_type(f, cls)
        if kind is bool:
            group.add_argument(_flag(f.name), dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            group.add_argument(_flag(f.name), dest=f.name, type=kind, default=None, choices=f.metadata.get("choices"),
                               help=help_text, metavar=f.name.upper() if not f.metadata.get("choices") else None)


def _task_parameters(task_cls) -> dict[str, inspect.Parameter]:
    params = dict(inspect.signature(task_cls.__init__).parameters)
    params.pop("self", None)
    params.pop("reward_fn", None)  # given as --reward-fn MODULE:FUNC
    return params


TASK_OPTION_HELP = {
    "reward_mode": "the task's reward mode",
    "eval_samples": "completions sampled for evaluation",
    "model": "a Hugging Face model id or local directory to start from",
    "data": "a local jsonl/parquet file or folder, or a hub dataset name",
    "eval_questions": "evaluate on the first N test questions (the same N before and after)",
    "eval_k": "completions sampled per evaluation question",
    "eval_temperature": "sampling temperature of evaluation (0: greedy)",
    "eval_max_new_tokens": "completion length cap in evaluation",
    "eval_batch": "evaluation prompts per generate call",
    "think_prefill": "start the assistant's turn with '<think>' (R1-Zero's template), counted as part of the completion",
}


def _add_run_options(parser: argparse.ArgumentParser) -> tuple[dict, dict]:
    run_group = parser.add_argument_group("run")
    run_fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    run_group.add_argument("--task", required=True, help=f"one of: {', '.join(sorted(TASKS))}")
    run_group.add_argument("--algo", required=True, help=f"one of: {', '.join(sorted(ALGORITHMS))}")
    _add_dataclass_options(run_group, RunConfig, {}, "run", skip=("task", "algo"))
    run_group.add_argument("--reward-fn", dest="reward_fn", default=None, metavar="MODULE:FUNC",
                           help="replace the task's reward: FUNC(prompts, completions) -> list of floats "
                                "(MODULE is an importable module or a path to a .py file)")

    algo_owners: dict[str, set] = {}
    for name, cls in sorted(ALGORITHMS.items()):
        group = parser.add_argument_group(f"{name} options")
        _add_dataclass_options(group, cls.Config, algo_owners, name)

    return algo_owners, add_task_options(parser)


def add_task_options(parser: argparse.ArgumentParser) -> dict[str, set]:
    """A flag for every task constructor argument; returns {option: tasks that take it}."""
    task_owners: dict[str, set] = {}
    task_group = parser.add_argument_group("task options")
    for name, cls in sorted(TASKS.items()):
        for pname, param in _task_parameters(cls).items():
            task_owners.setdefault(pname, set()).add(name)
            if len(task_owners[pname]) == 1:
                default = None if param.default is inspect.Parameter.empty else param.default
                help_text = f"{TASK_OPTION_HELP.get(pname, pname)} (default: {default})"
                if isinstance(default, bool):
                    task_group.add_argument(_flag(pname), dest=pname, action=argparse.BooleanOptionalAction,
                                            default=None, help=help_text)
                    continue
                kind = type(default) if isinstance(default, (int, float)) else str
                task_group.add_argument(_flag(pname), dest=pname, type=kind, default=None, help=help_text)
    return task_owners


def task_options(args: argparse.Namespace, task_owners: dict) -> dict:
    """The task options given on the command line, refusing those that belong to another task."""
    params = _task_parameters(TASKS[args.task])
    options = {}
    for key, value in vars(args).items():
        if value is None or key not in task_owners:
            continue
        if key not in params:
            raise UsageError(f"{_flag(key)} is an option of task {', '.join(sorted(task_owners[key]))}, not of {args.task}")
        options[key] = value
    return options


def load_reward_fn(spec: str) -> Callable:
    """'pkg.module:func' or 'path/to/file.py:func' -> the function, or one UsageError line."""
    module_name, sep, func_name = spec.rpartition(":")
    if not sep or not module_name or not func_name:
        raise UsageError(f"--reward-fn must look like MODULE:FUNC or FILE.py:FUNC, got {spec!r}")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise UsageError(f"--reward-fn: no such file {module_name!r}")
            mod_spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(f"--reward-fn: cannot import {module_name!r}: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise UsageError(f"--reward-fn: {module_name!r} has no function {func_name!r}")
    return fn


def parse_run(args: argparse.Namespace, algo_owners: dict, task_owners: dict):
    """Split the parsed flags into (RunConfig, algorithm config, task options), refusing misplaced ones."""
    given = {k: v for k, v in vars(args).items() if v is not None and k not in ("command", "handler")}
    if args.task not in TASKS:
        raise UsageError(f"unknown task {args.task!r}; choose from {', '.join(sorted(TASKS))}")
    if args.algo not in ALGORITHMS:
        raise UsageError(f"unknown algorithm {args.algo!r}; choose from {', '.join(sorted(ALGORITHMS))}")
    algo_cls = ALGORITHMS[args.algo]
    algo_fields = {f.name for f in dataclasses.fields(algo_cls.Config)}
    task_params = _task_parameters(TASKS[args.task])
    algo_kwargs, task_kwargs = {}, {}
    for key, value in given.items():
        if key in algo_owners and key not in {f.name for f in dataclasses.fields(RunConfig)}:
            if key not in algo_fields:
                owners = ", ".join(sorted(algo_owners[key]))
                raise UsageError(f"{_flag(key)} is an option of {owners}, not of {args.algo}")
            algo_kwargs[key] = value
        elif key in task_owners:
            if key not in task_params:
                owners = ", ".join(sorted(task_owners[key]))
                raise UsageError(f"{_flag(key)} is an option of task {owners}, not of {args.task}")
            task_kwargs[key] = value
    run_kwargs = {f.name: given[f.name] for f in dataclasses.fields(RunConfig) if f.name in given}
    rc = RunConfig(**run_kwargs)
    algo_config = algo_cls.Config(**algo_kwargs)
    if args.reward_fn:
        task_kwargs["reward_fn"] = load_reward_fn(args.reward_fn)
    return rc, algo_config, task_kwargs


def cmd_run(args, owners) -> int:
    from benchmarks.harness import run

    rc, algo_config, task_kwargs = parse_run(args, *owners)
    summary = run(rc, algo_config, task_kwargs)
    print(
        f"{summary['task']}/{summary['algo']} seed {summary['seed']}: accuracy {summary['accuracy_before']:.3f} -> "
        f"{summary['accuracy_after']:.3f}, reward {summary['reward_before']:.3f} -> {summary['reward_after']:.3f}, "
        f"{summary['wall_clock_s']:.1f} s, peak memory {summary['peak_memory_bytes'] / 2**20:.0f} MiB -> {rc.out}"
    )
    return 0


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = OneLineParser(prog=PROG, description="Side-by-side benchmarks for LLM post-training RL.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    run_parser = sub.add_parser("run", help="train one algorithm on one task, evaluate before and after")
    owners = _add_run_options(run_parser)
    run_parser.set_defaults(handler=lambda a: cmd_run(a, owners))
    for module_name in EXTRA_COMMANDS:
        importlib.import_module(module_name).add_parser(sub)
    return parser, owners


# Subcommands defined in their own modules: each exposes add_parser(subparsers) that sets `handler`.
EXTRA_COMMANDS: list[str] = [
    "benchmarks.evaluate", "benchmarks.checks", "benchmarks.matrix", "benchmarks.report", "benchmarks.ablation",
    "benchmarks.readme", "benchmarks.perf",
]


def main(argv: Optional[list[str]] = None) -> int:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Loading weights" bars would bury our own progress and errors
    try:
        parser, _ = build_parser()
        args = parser.parse_args(argv)
        return args.handler(args)
    except (UsageError, TaskError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except TrainingFailed as exc:
        print(f"{PROG}: failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
