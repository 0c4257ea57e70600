"""The ``grpo-bench`` command line: one parser, with the subcommands of this package's modules and a subcommand
per study (benchmarks/study.py: the checks, the benches and the top-level studies). A
study's flags come from its Settings dataclass; the one handler builds the settings from the flags given and starts
the study's lifecycle (``Study.start``).

Bad input never shows a traceback: one line, exit status 2; a run that breaks (a non-finite loss)
exits 1. Installed plug-ins (entry points ``grpo_bench.algorithms`` / ``grpo_bench.tasks``, and
``grpo_bench.studies`` for ``check`` and ``bench``) are registered before the parser of a subcommand that
reads the registries is built, so their options show in ``--help`` like the built-in ones. A subcommand's
parser is built only when it is named (``COMMANDS``): ``grpo-bench --help`` imports neither torch nor
transformers, and a subcommand's ``--help`` imports what its own flags need. Nothing imports this module.
"""

from __future__ import annotations

import importlib
import importlib.util
import shlex
import sys
from pathlib import Path
from typing import Optional

from benchmarks.cli.options import PROG, LazySubcommands, OneLineParser, add_settings_flags, settings_from
from benchmarks.errors import TrainingFailed, UsageError
from benchmarks.study import GROUPS, PLUGIN_GROUPS, TOP, load_study_plugins, studies, study_class

# Each subcommand: the module and function that add its parser (given the subparsers and the subcommand's name), and
# its line in ``grpo-bench --help`` (the help that function passes, which tests/benchmarks/cli/test_main_adversary.py
# holds equal to this one). The studies' (benchmarks/study.py) are built from the study registry by
# ``add_study_command``; a group's (check, bench) line is its own ``--help`` line too.
STUDY = ("benchmarks.cli.main", "add_study_command")
COMMANDS = {
    "run": ("benchmarks.cli.run", "add_run_parser", "train one algorithm on one task, evaluate before and after"),
    "eval": ("benchmarks.cli.run", "add_eval_parser",
             "evaluate a task's starting policy (or --model), or tabulate a run's before/after"),
    "check": (*STUDY, "cross-check the losses against TRL, verl and OpenRLHF"),
    "matrix": ("benchmarks.cli.matrix", "add_matrix_parser",
               "run every task x algorithm variant x seed of a matrix file, cells in parallel"),
    "report": ("benchmarks.cli.matrix", "add_report_parser", "tables (CSV, markdown) and plots of a matrix directory"),
    "replay": ("benchmarks.cli.replay", "add_replay_parser", "re-run stored cells of a result store at their recorded "
               "commit and at HEAD: do they reproduce bit for bit?"),
    "agreement": (*STUDY, "does a rerun of a matrix (another machine or thread count) reach the same verdicts?"),
    "brief": (*STUDY, "which algorithm on a real LM, across verdict matrices of one skill each: the front page's section "
                      "(could-be-best set, P(best), MDD, tuned settings, costs; rankings across skills and against a toy)"),
    "claims": (*STUDY, "published claims about RL for LLMs, each tested by a matrix that stated it before its cells "
                       "ran: the table of marks"),
    "variance": (*STUDY, "where a primary metric's seed-to-seed spread comes from (policy vs evaluation), and the "
                         "design that reaches a target MDD in the fewest core-seconds"),
    "calibration": (*STUDY, "the verdict procedure's family-wise error: simulated at matrices' own designs, measured "
                            "on real A/A replicates and declared-equivalent pairs"),
    "readme": (*STUDY, "the README's table of checks and benchmarks (each results/ report's headline and a link), the "
                       "page of matrix files (each with its result stores and how far they have run) and "
                       "results/index.html"),
    "bench": (*STUDY, "performance benchmarks"),
}
# The subcommands with a flag per algorithm and task option: the plug-ins are registered before their parser is built.
FROM_REGISTRIES = ("run", "eval")
# The module that registers each group's built-in studies. Those of the top-level group import no engine until
# they run: their --help loads neither torch nor pandas.
BUILT_IN = {"check": "benchmarks.checks.commands", "bench": "benchmarks.perf.commands", TOP: "benchmarks.commands"}


def _builder(name: str):
    module, function, _ = COMMANDS[name]

    def build(sub) -> None:
        if name in FROM_REGISTRIES:
            from benchmarks.plugins import load_plugins  # heavy: torch (algorithms, tasks); not for --help alone

            load_plugins()
        getattr(importlib.import_module(module), function)(sub, name)

    return build


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog=PROG, description="Side-by-side benchmarks for LLM post-training RL.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser, action=LazySubcommands)
    for name, (_, _, help_text) in COMMANDS.items():
        sub.add_lazy(name, help_text, _builder(name))
    return parser


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
    """The subcommand ``name``: a group of studies (check, bench), with a subcommand per study of the group
    in the order they were registered, or a top-level study."""
    if name not in GROUPS:  # a top-level study: grpo-bench NAME
        load_studies([TOP])
        add_study_parser(subparsers, TOP, name)
        return
    load_studies([name])
    parser = subparsers.add_parser(name, help=COMMANDS[name][2])
    which = parser.add_subparsers(dest=name, required=True, parser_class=type(parser))
    for study in studies(name):
        add_study_parser(which, name, study)


def add_study_parser(subparsers, group: str, name: str) -> None:
    cls = study_class(group, name)
    parser = subparsers.add_parser(name, help=cls.help)
    add_settings_flags(parser, cls.Settings)
    parser.set_defaults(handler=run_study, study=(group, name))


def run_study(args) -> int:
    cls = study_class(*args.study)
    return cls().start(settings_from(args, cls.Settings), args.command_line)


def _decoded_file(exc: UnicodeDecodeError) -> Optional[str]:
    """The file whose bytes ``exc`` could not decode: the open file, or the path, in the innermost frame of its
    traceback that holds one (Path.read_text's ``f`` and ``self``, a reader's ``path``). None when none does."""
    import io
    from pathlib import PurePath

    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        values = list(frame.f_locals.values())
        for value in values:
            if isinstance(value, (io.TextIOWrapper, io.BufferedReader)) and isinstance(getattr(value, "name", None), str):
                return value.name
        for value in values:
            if isinstance(value, PurePath):
                return str(value)
    return None


# An OSError of one of these, raised with the path it concerns, is a path given on the command line that cannot be
# used as given (a folder where a file is wanted, a file where a folder is wanted, no permission).
PATH_ERRORS = {IsADirectoryError: "a folder where a file is wanted", NotADirectoryError: "a file where a folder is wanted",
               FileExistsError: "a file where a folder is wanted", PermissionError: "permission denied"}


def one_line(exc: Exception) -> Optional[tuple[int, str]]:
    """(exit status, the line to print) for an exception that is bad input or a failed run; None for a bug."""
    task_error = getattr(sys.modules.get("tasks.base"), "TaskError", None)  # raised only once tasks is imported
    if isinstance(exc, UsageError) or (task_error is not None and isinstance(exc, task_error)):
        return 2, f"error: {exc}"
    if isinstance(exc, TrainingFailed):
        return 1, f"failed: {exc}"
    if isinstance(exc, UnicodeDecodeError):
        where = _decoded_file(exc)
        byte = exc.object[exc.start:exc.start + 1].hex() if isinstance(exc.object, bytes) else "?"
        return 2, (f"error: {where or 'an input file'}: not UTF-8 text (byte 0x{byte} at offset {exc.start}: "
                   f"{exc.reason}); save it as UTF-8")
    if type(exc) in PATH_ERRORS and (exc.filename or exc.filename2):
        # os.replace(tmp, target) names both: the target is the path given
        target = exc.filename2 if exc.filename2 is not None else exc.filename
        return 2, f"error: {target}: {exc.strerror or exc} ({PATH_ERRORS[type(exc)]})"
    return None


def check_import_names() -> None:
    """grpo-bench installs three top-level import names, ``algorithms``, ``tasks`` and ``benchmarks`` (the folders as
    the users laid them out; README "Import names"). Another installed package with one of those names would shadow
    ours silently, so the command line refuses to start unless all three come from this checkout: one line, not an
    ImportError deep in a run."""
    home = Path(__file__).resolve().parents[2]
    for name in ("algorithms", "tasks"):
        spec = importlib.util.find_spec(name)
        where = Path(spec.origin).resolve().parent.parent if spec is not None and spec.origin else None
        if where != home:
            found = spec.origin if spec is not None and spec.origin else "nothing"
            raise UsageError(f"the import name {name!r} is not grpo-bench's ({found}, expected under {home}): another "
                             f"installed package takes it; uninstall it or run from a clean environment")


def main(argv: Optional[list[str]] = None) -> int:
    try:
        check_import_names()
        argv = sys.argv[1:] if argv is None else list(argv)
        args = build_parser().parse_args(argv)
        from benchmarks.plugins import load_plugins  # heavy: torch (algorithms, tasks); not for --help alone
        from transformers.utils import logging as hf_logging

        load_plugins()  # before a handler reads the registries (a matrix names a plug-in's algorithm)
        hf_logging.disable_progress_bar()  # "Loading weights" bars would bury our own progress and errors
        # The command as typed, recorded with a result so that running it again reproduces the result.
        args.argv, args.command_line = argv, shlex.join([PROG, *argv])
        return args.handler(args)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        outcome = one_line(exc)
        if outcome is None:
            raise
        status, line = outcome
        print(f"{PROG}: {line}", file=sys.stderr)
        return status


if __name__ == "__main__":
    sys.exit(main())
