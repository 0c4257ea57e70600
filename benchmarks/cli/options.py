"""Command-line plumbing shared by the subcommands: one-line errors, flags generated from config
dataclasses and from each task's declared options, and ``--reward-fn MODULE:FUNC``."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
from pathlib import Path
from typing import Callable

from algorithms import AlgoConfig
from algorithms.base import config_fields
from benchmarks.errors import UsageError
from benchmarks.harness.config import field_type
from tasks import TASKS

PROG = "grpo-bench"


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2 (argparse prints the usage too)."""

    def error(self, message: str):
        raise UsageError(message)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _escape(help_text: str) -> str:
    return help_text.replace("%", "%%")  # argparse %-formats help strings


def add_dataclass_options(group, cls, seen: dict[str, set], owner_name: str, skip=()) -> None:
    """A flag per field of ``cls`` with its help and default; a field another owner added already gets
    this owner's meaning appended to its help instead of a second flag."""
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        seen.setdefault(f.name, set()).add(owner_name)
        doc = f.metadata.get("help", "")
        default = f.default if f.default is not dataclasses.MISSING else None
        help_text = _escape(f"{doc} (default: {default})" if doc else f"default: {default}")
        if len(seen[f.name]) > 1:
            action = group._option_string_actions[flag(f.name)]
            if f.name not in config_fields(AlgoConfig) and owner_name not in (action.help or ""):
                first = "" if "[" in (action.help or "") else f"[{sorted(seen[f.name] - {owner_name})[0]}] "
                action.help = f"{first}{action.help} | [{owner_name}] {help_text}"
            continue
        kind = field_type(cls, f.name)
        if kind is bool:
            group.add_argument(flag(f.name), dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            group.add_argument(flag(f.name), dest=f.name, type=kind, default=None, choices=f.metadata.get("choices"),
                               help=help_text, metavar=f.name.upper() if not f.metadata.get("choices") else None)


def add_task_options(parser: argparse.ArgumentParser) -> None:
    """A flag for every option some registered task declares (``Task.options``), with that task's help."""
    group = parser.add_argument_group("task options")
    added: dict[str, list[str]] = {}
    for task_name, cls in sorted(TASKS.items()):
        for name, option in cls.options().items():
            added.setdefault(name, []).append(task_name)
            if len(added[name]) > 1:
                continue
            help_text = _escape(f"{option.help} (default: {option.default})")
            if option.kind is bool:
                group.add_argument(flag(name), dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
            else:
                group.add_argument(flag(name), dest=name, type=option.kind, default=None, help=help_text)


def task_option_names() -> set[str]:
    return {name for cls in TASKS.values() for name in cls.options()}


def given_options(args: argparse.Namespace, names) -> dict:
    """The options among ``names`` that were given on the command line."""
    return {k: v for k, v in vars(args).items() if k in names and v is not None}


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


def task_options_for(task: str, given: dict) -> dict:
    """``given`` task options, refusing one that belongs to another task (one line)."""
    if task not in TASKS:
        raise UsageError(f"unknown task {task!r}; choose from {', '.join(sorted(TASKS))}")
    own = TASKS[task].options()
    for name in given:
        if name not in own:
            owners = sorted(t for t, cls in TASKS.items() if name in cls.options())
            raise UsageError(f"{flag(name)} is an option of task {', '.join(owners)}, not of {task}")
    return given


def comma_list(text: str) -> list[str]:
    """A comma-separated flag value as its items, blanks dropped ("a, b," -> ["a", "b"])."""
    return [item.strip() for item in text.split(",") if item.strip()]


def json_value(text: str):
    """A command-line value read as JSON where it parses (500, 0.0, true, "sft"), else the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def set_options(items) -> dict:
    """``--set KEY=VALUE ...`` as a dict of JSON values; an item without '=' is one UsageError line."""
    options = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--set wants KEY=VALUE, got {item!r}")
        options[key] = json_value(value)
    return options

