"""``grpo-bench check NAME`` and ``grpo-bench bench NAME``: a subcommand per registered study (benchmarks/study.py),
its flags from its Settings dataclass; the handler builds the settings from the flags given and runs the study."""

from __future__ import annotations

from benchmarks.cli.options import add_settings_flags, settings_from
from benchmarks.study import load_study_plugins, studies, study_class

# Each group's line in ``grpo-bench --help`` (main.COMMANDS gives the same; a test holds them equal).
GROUP_HELP = {"check": "cross-check the losses against TRL, verl and OpenRLHF, or verify the mu = 1 behaviour",
              "bench": "performance benchmarks"}


def load_studies() -> None:
    """Register the built-in studies, then the installed plug-ins (after them: none can take a built-in's name)."""
    import benchmarks.checks.studies  # noqa: F401  (registers the checks)
    import benchmarks.perf.studies  # noqa: F401  (registers the benches)

    load_study_plugins()


def add_study_group(subparsers, group: str) -> None:
    """The ``group`` subcommand, with a subcommand per study of the group in the order they were registered."""
    load_studies()
    parser = subparsers.add_parser(group, help=GROUP_HELP[group])
    which = parser.add_subparsers(dest=group, required=True, parser_class=type(parser))
    for name, cls in studies(group).items():
        study_parser = which.add_parser(name, help=cls.help)
        add_settings_flags(study_parser, cls.Settings)
        study_parser.set_defaults(handler=run_study, study=(group, name))


def add_check_parser(subparsers) -> None:
    add_study_group(subparsers, "check")


def add_bench_parser(subparsers) -> None:
    add_study_group(subparsers, "bench")


def run_study(args) -> int:
    cls = study_class(*args.study)
    return cls().run(settings_from(args, cls.Settings), args.command_line)
