"""Command-line plumbing shared by the subcommands: one-line errors, subcommands whose parsers are built only
when named, flags generated from config dataclasses and from each task's declared options, ``--reward-fn
MODULE:FUNC``, and the checks of seeds and run settings that several subcommands share (the paths a study names
are checked by its lifecycle, benchmarks/study.py).

Nothing heavy is imported here at module level (algorithms, tasks and the harness import torch): ``grpo-bench
--help`` and a light subcommand's ``--help`` import this module and none of them. The functions that need them
import them where they run, each such import marked "heavy"."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import re
import sys
import types
import typing
from pathlib import Path
from typing import Callable, Optional

from benchmarks.errors import UsageError

PROG = "grpo-bench"


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2 (argparse prints the usage too). ``arg_strings``
    holds the words it was last asked to parse, so that an action (run's --help) can read the flags after it."""

    arg_strings: list[str] = []

    def error(self, message: str):
        raise UsageError(message)

    def parse_known_args(self, args=None, namespace=None):
        self.arg_strings = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)


class LazySubcommands(argparse._SubParsersAction):
    """Subcommands listed by name and one-line help, each one's parser built only when its name is parsed
    (``add_lazy``): the listing imports no subcommand's module, and a subcommand's ``--help`` imports only its own.
    ``build(self)`` adds the parser as usual, with ``add_parser(name, help=...)``; the listing keeps the help
    ``add_lazy`` was given, and ``given_help`` records the builder's (tests hold the two equal)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._builders: dict[str, Callable] = {}
        self._building: Optional[str] = None
        self.given_help: dict[str, Optional[str]] = {}

    def add_lazy(self, name: str, help: str, build: Callable) -> None:
        self._builders[name] = build
        self._name_parser_map[name] = None  # a choice now (usage, "invalid choice"); a parser once built
        self._choices_actions.append(self._ChoicesPseudoAction(name, (), help))

    def add_parser(self, name, **kwargs):
        if name != self._building:
            return super().add_parser(name, **kwargs)
        self.given_help[name] = kwargs.pop("help", None)
        if kwargs.get("prog") is None:
            kwargs["prog"] = f"{self._prog_prefix} {name}"
        parser = self._parser_class(**kwargs)
        self._name_parser_map[name] = parser
        return parser

    def parser_of(self, name: str) -> argparse.ArgumentParser:
        """``name``'s parser, built now if it was not yet."""
        if self._name_parser_map.get(name) is None and name in self._builders:
            self._building = name
            try:
                self._builders.pop(name)(self)
            finally:
                self._building = None
            if self._name_parser_map.get(name) is None:
                raise RuntimeError(f"the builder of subcommand {name!r} added no parser {name!r}")
        return self._name_parser_map[name]

    def __call__(self, parser, namespace, values, option_string=None):
        if values and values[0] in self._builders:
            self.parser_of(values[0])
        super().__call__(parser, namespace, values, option_string)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _escape(help_text: str) -> str:
    return help_text.replace("%", "%%")  # argparse %-formats help strings


def with_default(doc: str, default) -> str:
    """``doc`` and ``(default: DEFAULT)``, unless ``doc`` already says its default ("(default: the task's)"):
    each default is printed once."""
    if not doc:
        return f"default: {default}"
    if re.search(r"\(default\b|\bdefault:", doc):
        return doc
    return f"{doc} (default: {default})"


# ------------------------------------------------------------------------------------------------
# Values a flag takes (argparse ``type=``): a bad one is argparse's one line, "argument --seed: ..."
# ------------------------------------------------------------------------------------------------

# numpy's legacy seeding and transformers' set_seed take 0 .. 2**32 - 1 and the perf benches' numpy generators no
# negative seed; torch takes up to 2**64 - 1, but a run also seeds ``seed + rank`` (--nproc) and the mu1 check
# ``seed + 1``: the flags allow the range every consumer takes.
SEED_MAX = 2**32 - 1


def seed_problem(value) -> Optional[str]:
    """Why ``value`` is no seed (an integer from 0 to SEED_MAX), or None: "must be ..." to follow its name."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
        return f"must be an integer from 0 to {SEED_MAX} (2**32 - 1), got {value!r}"
    return None


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def seed_value(text: str) -> int:
    """A ``--seed`` value."""
    value = _integer(text)
    problem = seed_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def at_least_one(text: str) -> int:
    """An integer flag that counts something that must be there at least once (``--nproc``)."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


# A generated flag whose field name says what values it takes beyond its type.
FLAG_TYPES = {"seed": seed_value, "nproc": at_least_one}


def add_dataclass_options(group, cls, seen: dict[str, set], owner_name: str, skip=(), only=None) -> None:
    """A flag per field of ``cls`` (those in ``only``, when given) with its help and default; a field another owner
    added already gets this owner's meaning appended to its help instead of a second flag."""
    from algorithms import AlgoConfig  # heavy: torch
    from algorithms.base import config_fields  # heavy: torch
    from benchmarks.harness.config import field_type  # heavy: torch

    for f in dataclasses.fields(cls):
        if f.name in skip or (only is not None and f.name not in only) or "option_group" in f.metadata:
            continue
        seen.setdefault(f.name, set()).add(owner_name)
        default = f.default if f.default is not dataclasses.MISSING else None
        help_text = with_default(f.metadata.get("help", ""), default)
        if len(seen[f.name]) > 1:
            action = group._option_string_actions[flag(f.name)]
            help_text = _escape(help_text)
            if f.name not in config_fields(AlgoConfig) and owner_name not in (action.help or ""):
                first = "" if "[" in (action.help or "") else f"[{sorted(seen[f.name] - {owner_name})[0]}] "
                action.help = f"{first}{action.help} | [{owner_name}] {help_text}"
            continue
        add_field_flag(group, f, field_type(cls, f.name), help_text)


def add_field_flag(group, f: dataclasses.Field, kind, help_text: str, container: Optional[type] = None) -> None:
    """The flag of one dataclass field of type ``kind`` (in a list or tuple: ``container``): ``--name``, dest the
    field's name, default None, so that only what was given overrides the dataclass's default. A bool is
    ``--name/--no-name``; a list takes several values (metadata ``comma_separated``: one comma-separated value);
    a field without a default is a positional argument, or a required flag (metadata ``required``). The metadata
    keys benchmarks/study.py lists apply."""
    meta = f.metadata
    help_text = argparse.SUPPRESS if meta.get("hidden") else _escape(help_text)
    if kind is bool:
        group.add_argument(flag(f.name), dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        return
    kind = FLAG_TYPES.get(meta.get("values", f.name), kind) if kind is int else kind
    kwargs = {"type": kind, "choices": meta.get("choices"), "help": help_text}
    if container is not None and meta.get("comma_separated"):
        kwargs["type"] = comma_list
    elif container is not None and not meta.get("repeat"):
        kwargs["nargs"] = "+"
    if "nargs" in meta:
        kwargs["nargs"] = meta["nargs"]
    if meta.get("repeat"):
        kwargs["action"] = "append"
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and not meta.get("required"):
        group.add_argument(f.name, **kwargs)
    else:
        metavar = meta.get("metavar", f.name.upper() if not meta.get("choices") else None)
        group.add_argument(flag(f.name), dest=f.name, default=None, metavar=metavar,
                           required=bool(meta.get("required")), **kwargs)


def settings_types(cls) -> dict[str, tuple[type, Optional[type]]]:
    """(type, container) of every field of the dataclass ``cls``: Optional[...] unwrapped, and a list or tuple as
    its items' type and list or tuple (a scalar's container is None); a list of tuples (a flag given several
    times, several values each) as the tuples' items' type and list."""
    out = {}
    for name, hint in typing.get_type_hints(cls).items():
        hint = _without_none(hint)
        container = typing.get_origin(hint)
        if container in (list, tuple):
            item = typing.get_args(hint)[0]
            out[name] = (typing.get_args(item)[0] if typing.get_origin(item) in (list, tuple) else item, container)
        else:
            out[name] = (hint, None)
    return out


def _without_none(hint):
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def _as_typed(value, hint):
    """A flag's value (argparse's lists) as the field's type hint says: a list, a tuple, a list of tuples."""
    hint = _without_none(hint)
    container = typing.get_origin(hint)
    if container not in (list, tuple) or not isinstance(value, list):
        return value
    return container(_as_typed(item, typing.get_args(hint)[0]) for item in value)


def add_settings_flags(parser, cls) -> None:
    """A flag per field of the settings dataclass ``cls`` that its ``__init__`` takes, in field order, each help
    with the default (a list's as it is typed); fields that share a metadata ``one_of`` exclude each other."""
    types_ = settings_types(cls)
    exclusive: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        kind, container = types_[f.name]
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        if container is not None and default not in (None, dataclasses.MISSING):
            default = ("," if f.metadata.get("comma_separated") else " ").join(map(str, default))
        help_text = f.metadata.get("help", "")
        if default is not dataclasses.MISSING:
            help_text = with_default(help_text, default)
        one_of = f.metadata.get("one_of")
        if one_of is not None and one_of not in exclusive:
            exclusive[one_of] = parser.add_mutually_exclusive_group()
        add_field_flag(exclusive.get(one_of, parser), f, kind, help_text, container)


def settings_from(args: argparse.Namespace, cls):
    """``cls`` built from the flags ``add_settings_flags`` added that were given (the others keep the dataclass's
    defaults), a list flag's values in the field's container."""
    hints = typing.get_type_hints(cls)
    given = given_options(args, {f.name for f in dataclasses.fields(cls) if f.init})
    return cls(**{name: _as_typed(value, hints[name]) for name, value in given.items()})


def add_task_options(parser: argparse.ArgumentParser, only: Optional[str] = None) -> None:
    """A flag for every option some registered task declares (``Task.options``), with the help of the first task
    that declares it; ``only``: that task's options, with its own help, under the heading "TASK options"."""
    from tasks import TASKS  # heavy: torch

    group = parser.add_argument_group("task options" if only is None else f"{only} options")
    added: dict[str, list[str]] = {}
    for task_name, cls in sorted(TASKS.items()):
        if only is not None and task_name != only:
            continue
        for name, option in cls.options().items():
            added.setdefault(name, []).append(task_name)
            if len(added[name]) > 1:
                continue
            help_text = _escape(with_default(option.help, option.default))
            if option.kind is bool:
                group.add_argument(flag(name), dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
            else:
                group.add_argument(flag(name), dest=name, type=option.kind, default=None, help=help_text)


def task_option_names() -> set[str]:
    from tasks import TASKS  # heavy: torch

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
    from tasks import TASKS  # heavy: torch

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


# ------------------------------------------------------------------------------------------------
# A run's settings beyond their types: what RunConfig.validate does not refuse
# ------------------------------------------------------------------------------------------------

DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


def device_problem(device) -> Optional[str]:
    """Why ``device`` names no device a run can ask for (auto, cpu, cuda, cuda:N), or None: "must be ..." to
    follow its name."""
    if not isinstance(device, str) or not DEVICE.fullmatch(device):
        return f"must be auto, cpu, cuda or cuda:N, got {device!r}"
    return None


def group_based(algo: str, options: dict) -> bool:
    """Whether ``algo`` with ``options`` judges each completion against the other completions of its prompt (a
    group baseline): GRPO's and RLOO's groups, REINFORCE++ with group_baseline."""
    from algorithms import ALGORITHMS  # heavy: torch
    from algorithms.base import config_fields  # heavy: torch

    cls = ALGORITHMS.get(algo)
    if cls is None:
        return False
    names = set(config_fields(cls.Config))
    return "group_size" in names or bool(options.get("group_baseline"))


def run_settings_problem(settings: dict, spell: Callable[[str], str] = str) -> Optional[str]:
    """Why a run's flat settings (``grpo-bench run``'s after --config, or a matrix cell's) cannot be run or would
    train on nothing, or None; ``spell`` names a setting as its user wrote it (``flag`` for the command line).
    Beyond RunConfig.validate:

    * ``seed`` outside 0 .. 2**32 - 1 (an OverflowError deep in torch or numpy otherwise);
    * ``nproc`` below 1 (0 ran one process, silently);
    * ``device`` that is none of auto, cpu, cuda, cuda:N ("cudaXYZ" passed, and failed in every cell);
    * ``temperature`` 0 for a group-based algorithm: greedy decoding makes the G completions of a prompt one and
      the same, every group-relative advantage is 0, and the run would spend its budget without a gradient.
      Refused, not warned about: no setting makes it train, and a warning scrolls away under the progress lines.
      (Other algorithms keep temperature 0: their baselines are not the prompt's other completions.)"""
    if settings.get("seed") is not None and seed_problem(settings["seed"]):
        return f"{spell('seed')} {seed_problem(settings['seed'])}"
    nproc = settings.get("nproc")
    if nproc is not None and (isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1):
        return f"{spell('nproc')} must be an integer >= 1, got {nproc!r}"
    if settings.get("device") is not None and device_problem(settings["device"]):
        return f"{spell('device')} {device_problem(settings['device'])}"
    temperature = settings.get("temperature")
    if temperature is not None and temperature == 0 and group_based(settings.get("algo"), settings):
        return (f"{spell('temperature')} 0 with {settings.get('algo')}: greedy sampling makes every completion of a "
                "prompt the same, so every group-relative advantage is 0 and nothing is learned; give a temperature "
                "> 0 (or none: the task's)")
    return None
