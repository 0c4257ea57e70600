"""The studies' subcommands (benchmarks/study.py): ``grpo-bench check NAME``, ``bench NAME`` and ``paired NAME``, a
subcommand per registered study of the group, and the top-level studies, ``grpo-bench NAME``. Each one's flags come
from its Settings dataclass; the one handler builds the settings from the flags given and starts the study's
lifecycle (``Study.start``)."""

from __future__ import annotations

import importlib

from benchmarks.cli.options import add_settings_flags, settings_from
from benchmarks.study import GROUPS, PLUGIN_GROUPS, TOP, load_study_plugins, studies, study_class

# Each group's line in ``grpo-bench --help`` (main.COMMANDS gives the same; a test holds them equal).
GROUP_HELP = {"check": "cross-check the losses against TRL, verl and OpenRLHF, or verify the mu = 1 behaviour",
              "bench": "performance benchmarks",
              "paired": "per-question before/after evaluations and McNemar's exact test between them"}
# The module that registers each group's built-in studies. Those of the top-level group and of paired import no
# engine until they run: their --help loads neither torch nor pandas.
BUILT_IN = {"check": "benchmarks.checks.studies", "bench": "benchmarks.perf.studies", "paired": "benchmarks.studies",
            TOP: "benchmarks.studies"}


def load_studies(groups=GROUPS) -> None:
    """Register the built-in studies of ``groups``; for a group plug-ins add to, the built-in checks and benches
    first, then the installed plug-ins (after them: none can take a built-in's name)."""
    pluggable = any(group in PLUGIN_GROUPS for group in groups)
    for group in GROUPS:  # in this order whatever was asked: the registry's order is the listings' order
        if group in groups or (pluggable and group in PLUGIN_GROUPS):
            importlib.import_module(BUILT_IN[group])
    if pluggable:
        load_study_plugins()


def add_study_command(subparsers, name: str) -> None:
    """The subcommand ``name``: a group of studies (check, bench, paired), or a top-level study."""
    if name in GROUP_HELP:
        add_study_group(subparsers, name)
    else:
        load_studies([TOP])
        add_study_parser(subparsers, TOP, name)


def add_study_group(subparsers, group: str) -> None:
    """The ``group`` subcommand, with a subcommand per study of the group in the order they were registered."""
    load_studies([group])
    parser = subparsers.add_parser(group, help=GROUP_HELP[group])
    which = parser.add_subparsers(dest=group, required=True, parser_class=type(parser))
    for name in studies(group):
        add_study_parser(which, group, name)


def add_study_parser(subparsers, group: str, name: str) -> None:
    cls = study_class(group, name)
    parser = subparsers.add_parser(name, help=cls.help)
    add_settings_flags(parser, cls.Settings)
    parser.set_defaults(handler=run_study, study=(group, name))


def run_study(args) -> int:
    cls = study_class(*args.study)
    return cls().start(settings_from(args, cls.Settings), args.command_line)
