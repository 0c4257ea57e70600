"""``grpo-bench run --help``: the run's own options first, one line per algorithm and task, and an algorithm's or a
task's options in full under its heading when ``--algo NAME`` / ``--task NAME`` is on the line; every option the
run parser takes is shown by one of these views."""

from __future__ import annotations

import re

import pytest

from algorithms import ALGORITHMS
from algorithms.base import config_fields
from tasks import TASKS
from tests.benchmarks.cli.test_main import assert_one_line_error

# An option line of argparse's help: "  --name ...", a boolean's "  --name, --no-name".
OPTION_LINE = re.compile(r"^  (-[\w-]+|--[\w-]+)(?:, (--[\w-]+))?", re.MULTILINE)


@pytest.fixture
def run_help(run_cli, capsys, monkeypatch):
    """``run ARGS --help``'s text at 100 columns."""
    monkeypatch.setenv("COLUMNS", "100")

    def shown(*args: str) -> str:
        with pytest.raises(SystemExit) as exited:
            run_cli("run", *args)
        assert exited.value.code in (0, None)
        return capsys.readouterr().out

    return shown


def section(text: str, heading: str) -> str:
    """The lines under ``heading`` (a line of its own) up to the next blank line."""
    start = text.index(f"\n{heading}\n") + 1
    end = text.find("\n\n", start)
    return text[start:end if end > 0 else None]


def flags_shown(text: str) -> set[str]:
    return {flag for pair in OPTION_LINE.findall(text) for flag in pair if flag}


def test_run_help_shows_the_common_options_then_a_line_per_algorithm_and_task(run_help):
    text = run_help("--help")
    lines = text.splitlines()
    assert len(lines) <= 130, f"run --help is {len(lines)} lines"
    run = section(text, "run:")
    for common in ("--config", "--task", "--algo", "--steps", "--budget", "--seed", "--device", "--out", "--resume"):
        assert re.search(rf"^  {common}[ ,]", run, re.MULTILINE), common
    assert text.index("\nrun:\n") < text.index("\nalgorithms (") < text.index("\ntasks (")
    # no algorithm's or task's option is listed, only how many each has and how to see them
    assert not any(heading.endswith(" options:") for heading in lines if not heading.startswith(" "))
    assert flags_shown(text) == flags_shown(run) | {"-h", "--help"}
    assert "--loss-type" not in text and "--eval-samples" not in run
    algorithms = section(text, next(line for line in lines if line.startswith("algorithms (")))
    assert "grpo-bench run --algo NAME --help" in text and "grpo-bench run --task NAME --help" in text
    for name, cls in ALGORITHMS.items():
        assert re.search(rf"^  {name} +{len(config_fields(cls.Config))} options\b", algorithms, re.MULTILINE), name
    tasks = section(text, next(line for line in lines if line.startswith("tasks (")))
    for name, cls in TASKS.items():
        assert re.search(rf"^  {name} +{len(cls.options())} options: ", tasks, re.MULTILINE), name


def test_an_algorithms_options_are_shown_under_its_heading_wherever_algo_is_given(run_help):
    text = run_help("--algo", "grpo", "--help")
    assert run_help("--help", "--algo", "grpo") == text == run_help("--help", "--algo=grpo")
    assert text.index("\nrun:\n") < text.index("\ngrpo options:\n") < text.index("\ngrpo options of loss_type sapo:\n")
    grpo = section(text, "grpo options:")
    for option in ("--learning-rate", "--group-size", "--loss-type", "--beta", "--epsilon"):
        assert re.search(rf"^  {option}[ ,]", grpo, re.MULTILINE), option
    assert "--sapo-temperature-pos" in section(text, "grpo options of loss_type sapo:")
    assert "[dpo]" not in text and "[ppo]" not in text  # grpo's own meaning of a shared option, not every owner's
    assert "ppo options" not in text and "algorithms (" not in text and "\ntasks (" in text
    shown = flags_shown(text) - flags_shown(section(text, "run:")) - {"-h", "--help"}
    expected = {f"--{name.replace('_', '-')}" for name in config_fields(ALGORITHMS["grpo"].Config)}
    assert {flag for flag in shown if not flag.startswith("--no-")} == expected


def test_a_tasks_options_are_shown_with_its_own_help(run_help):
    text = run_help("--task", "pizza", "--help")
    pizza = section(text, "pizza options:")
    assert "--eval-samples" in pizza and "--dataset" not in text and "\ntasks (" not in text
    assert "the same one prompt" in pizza  # pizza's own --eval-set help, not the first task's (addition's)
    both = run_help("--task", "pizza", "--help", "--algo", "dpo")
    assert both.index("\nrun:\n") < both.index("\ndpo options:\n") < both.index("\npizza options:\n")


def test_every_option_the_run_parser_takes_is_shown_by_one_view(run_help):
    from benchmarks.cli.main import build_parser

    parser = build_parser()._subparsers._group_actions[0].parser_of("run")
    takes = {string for action in parser._actions for string in action.option_strings}
    shown = flags_shown(run_help("--help"))
    for name in ALGORITHMS:
        shown |= flags_shown(run_help("--algo", name, "--help"))
    for name in TASKS:
        shown |= flags_shown(run_help("--task", name, "--help"))
    assert shown == takes


def test_an_unknown_algorithm_or_task_with_help_is_one_line(run_cli):
    assert_one_line_error(run_cli("run", "--algo", "grpoo", "--help"),
                          f"unknown algorithm 'grpoo'; choose from {', '.join(sorted(ALGORITHMS))}")
    code, _, err = run_cli("run", "--help", "--task", "pizzza")
    assert code == 2 and err.startswith("grpo-bench: error: unknown task 'pizzza'; choose from")
