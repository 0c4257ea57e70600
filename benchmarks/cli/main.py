"""The ``grpo-bench`` command line: one parser, a subcommand per module of this package.

Bad input never shows a traceback: one line, exit status 2; a run that breaks (a non-finite loss)
exits 1. Installed plug-ins (entry points ``grpo_bench.algorithms`` / ``grpo_bench.tasks``) are
registered before the parser is built, so their options show in ``--help`` like the built-in ones.
Nothing imports this module.
"""

from __future__ import annotations

import shlex
import sys
from typing import Optional

from benchmarks.cli.bench import add_bench_parser
from benchmarks.cli.checks import add_check_parser
from benchmarks.cli.matrix import (add_ablation_parser, add_agreement_parser, add_calibration_parser, add_matrix_parser,
                                   add_readme_parser, add_report_parser, add_transfer_parser)
from benchmarks.cli.options import PROG, OneLineParser
from benchmarks.cli.paired import add_paired_parser
from benchmarks.cli.run import add_eval_parser, add_run_parser
from benchmarks.cli.survey import add_survey_parser
from benchmarks.errors import TrainingFailed, UsageError
from benchmarks.plugins import load_plugins
from tasks import TaskError

SUBCOMMANDS = (add_run_parser, add_eval_parser, add_check_parser, add_matrix_parser, add_report_parser, add_agreement_parser,
               add_transfer_parser, add_calibration_parser, add_ablation_parser, add_readme_parser, add_bench_parser, add_paired_parser,
               add_survey_parser)


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog=PROG, description="Side-by-side benchmarks for LLM post-training RL.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Loading weights" bars would bury our own progress and errors
    try:
        load_plugins()
        argv = sys.argv[1:] if argv is None else list(argv)
        args = build_parser().parse_args(argv)
        # The command as typed, recorded with a result so that running it again reproduces the result.
        args.argv, args.command_line = argv, shlex.join([PROG, *argv])
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
