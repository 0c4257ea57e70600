"""The command line's adversary: bad input that showed a traceback, paths and settings accepted silently,
and a --help that waited seconds for torch. Each test fails on the code before its fix.

    7  a file that is not UTF-8 (matrix file, --config, --prompts): one line naming the file, exit 2
    10 an --out / --readme that is a folder, a file where a folder is wanted, or unwritable: one line, exit 2
    11 a seed outside 0 .. 2**32 - 1: one line with the range, exit 2
    15 --ray-address without --executor ray, device "cudaXYZ", --nproc 0, agreement of two different matrices,
       report on another matrix's store, brief with a missing folder, temperature 0 for a group-based algorithm
    18 --help imports neither torch nor transformers (the subcommands with a flag per algorithm and task option, or
       whose modules build on torch, import torch but not transformers); each default printed once
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.cli import main as cli_main
from benchmarks.cli import options
from benchmarks.errors import UsageError
from tests.conftest import ROOT

RESULTS = ROOT / "results"
SMOKE = ROOT / "benchmarks" / "matrices" / "smoke.toml"
BIG = "18446744073709551616"  # 2**64


def assert_one_line_error(result, *fragments):
    code, _, err = result
    assert code == 2, err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("grpo-bench: error: ")
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def parse(*argv):
    """The command line parsed, nothing run."""
    return cli_main.build_parser().parse_args([str(a) for a in argv])


def matrix_dir(path: Path, *variants: str, task: str = "t") -> Path:
    """A folder with a matrix.json planning one cell per variant (what the checks before any work read)."""
    path.mkdir(parents=True)
    cells = [{"dir": f"{task}/{v}/seed0", "task": task, "task_label": task, "variant": v, "algo": "grpo", "seed": 0}
             for v in variants]
    (path / "matrix.json").write_text(json.dumps({"name": path.name, "cells": cells}))
    return path


# --- 7. files that are not UTF-8 -----------------------------------------------------------------------------


def test_a_matrix_file_that_is_not_utf8_is_one_line_naming_it(run_cli, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_bytes(SMOKE.read_bytes().replace(b'name = "smoke"', b'name = "sm\xffoke"'))
    assert_one_line_error(run_cli("matrix", bad, "--out", tmp_path / "out", "--dry-run"),
                          f"{bad}: not UTF-8 text", "0xff")


def test_a_config_file_that_is_not_utf8_is_one_line_naming_it(run_cli, tmp_path):
    bad = tmp_path / "run.toml"
    bad.write_bytes(b'task = "pizza"\nalgo = "grpo\xfe"\n')
    assert_one_line_error(run_cli("run", "--config", bad, "--out", tmp_path / "run"), f"{bad}: not UTF-8 text", "0xfe")


def test_a_prompts_file_that_is_not_utf8_is_one_line_naming_it(run_cli, tmp_path, pizza_model):
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes(b"ravin likes \xe9\n")  # latin-1
    (tmp_path / "rewards.py").write_text("def score(prompts, completions):\n    return [0.0] * len(completions)\n")
    result = run_cli("run", "--task", "prompts", "--algo", "grpo", "--model", pizza_model, "--prompts", prompts,
                     "--reward-fn", f"{tmp_path / 'rewards.py'}:score", "--steps", "1", "--out", tmp_path / "run")
    assert_one_line_error(result, f"{prompts}: not UTF-8 text", "save it as UTF-8")


def test_a_decoding_error_without_a_file_still_is_one_line():
    try:
        b"\xff".decode()
    except UnicodeDecodeError as exc:
        status, line = cli_main.one_line(exc)
    assert status == 2 and line.startswith("error: an input file: not UTF-8 text (byte 0xff at offset 0")


# --- 10. outputs that cannot be written ----------------------------------------------------------------------


@pytest.fixture
def two_matrices(tmp_path):
    return matrix_dir(tmp_path / "first", "a", "b", "c"), matrix_dir(tmp_path / "second", "a", "b", "c")


@pytest.mark.parametrize("command, fragment", [
    ("agreement --out FOLDER", "--out {FOLDER}: a folder, not a file"),
    ("agreement --out FILE/x.md", "--out {FILE}/x.md: {FILE} is a file, not a folder"),
    ("claims --out FOLDER", "--out {FOLDER}: a folder, not a file"),
    ("claims --out new.md --readme FOLDER", "--readme {FOLDER}: a folder, not a file"),
    ("calibration --out FILE", "--out {FILE}: a file, not a folder"),
    ("calibration --out FILE/sub", "--out {FILE}/sub: {FILE} is a file, not a folder"),
    ("report --readme FOLDER", "--readme {FOLDER}: a folder, not a file"),
])
def test_an_output_path_that_cannot_be_written_is_one_line(run_cli, tmp_path, two_matrices, command, fragment):
    first, second = two_matrices
    folder, file = tmp_path / "folder", tmp_path / "file"
    folder.mkdir()
    file.write_text("not a folder\n")
    name, *flags = command.split()
    flags = [f.replace("FOLDER", str(folder)).replace("FILE", str(file)).replace("new.md", str(tmp_path / "new.md"))
             for f in flags]
    positional = {"agreement": [first, second], "calibration": [first], "report": [first], "claims": [first]}[name]
    result = run_cli(name, *positional, *flags, *(["--sims", "100"] if name == "calibration" else []))
    assert_one_line_error(result, fragment.format(FOLDER=folder, FILE=file))
    assert file.read_text() == "not a folder\n" and not any(folder.iterdir())


def test_an_output_folder_without_write_permission_is_one_line(run_cli, tmp_path, two_matrices, monkeypatch):
    first, second = two_matrices
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == locked else real_access(p, mode))  # as root
    assert_one_line_error(run_cli("agreement", first, second, "--out", locked / "agree.md"),
                          f"--out {locked / 'agree.md'}: cannot write in {locked} (permission denied)")


@pytest.mark.parametrize("error, line", [
    (IsADirectoryError(21, "Is a directory", "/x/.agree.md.1234.tmp", None, "out/agree.md"),
     "error: out/agree.md: Is a directory (a folder where a file is wanted)"),
    (FileExistsError(17, "File exists", "results/calibration"),
     "error: results/calibration: File exists (a file where a folder is wanted)"),
    (PermissionError(13, "Permission denied", "/etc/README.md"), "error: /etc/README.md: Permission denied (permission denied)"),
])
def test_a_path_error_any_command_meets_is_one_line(run_cli, monkeypatch, error, line):
    """What no check before the work catches (a path that changed meanwhile, a command without such a check)."""
    from benchmarks.commands import Readme

    def run(self, settings, command):
        raise error

    monkeypatch.setattr(Readme, "run", run)
    assert_one_line_error(run_cli("readme"), line)


# --- 11. seeds -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ("run", "--seed", BIG), ("run", "--seed", "-1"),
    ("bench", "grpo-vs-trl", "--seed", BIG), ("bench", "rloo-vs-trl", "--seed", "-1"),
    ("replay", "results/ppo-ties", "--seed", BIG),
], ids=lambda argv: " ".join(argv[:2]))
def test_a_seed_out_of_range_is_refused_with_the_range(argv):
    with pytest.raises(UsageError, match=r"^argument --seeds?: must be an integer from 0 to 4294967295 \(2\*\*32 - 1\)"):
        parse(*argv)


def test_a_huge_seed_is_one_line_not_an_overflow(run_cli, tmp_path):
    result = run_cli("run", "--task", "bandit", "--algo", "grpo", "--steps", "1", "--seed", BIG, "--out", tmp_path / "run")
    assert_one_line_error(result, "--seed", "from 0 to 4294967295", BIG)
    assert not (tmp_path / "run").exists()


def test_a_matrix_seed_out_of_range_is_refused_when_the_matrix_is_read(run_cli, tmp_path):
    toml = tmp_path / "seeds.toml"
    toml.write_text(SMOKE.read_text().replace("seeds = [0, 1]", f"seeds = [0, {BIG}]"))
    assert_one_line_error(run_cli("matrix", toml, "--out", tmp_path / "out", "--dry-run"),
                          f"{toml}: cell pizza/grpo_level=token/seed{BIG}: seed must be an integer from 0 to 4294967295")


# --- 15. settings accepted silently -------------------------------------------------------------------------------


def test_an_option_of_another_executor_is_refused(run_cli, tmp_path):
    result = run_cli("matrix", SMOKE, "--out", tmp_path / "out", "--dry-run", "--ray-address", "10.0.0.1:6379")
    assert_one_line_error(result, "--ray-address is an option of --executor ray, not of --executor local (the default)")
    result = run_cli("matrix", SMOKE, "--out", tmp_path / "out", "--dry-run", "--executor", "slurm", "--jobs", "2")
    assert_one_line_error(result, "--jobs is an option of --executor local or subprocess, not of --executor slurm")


@pytest.mark.parametrize("device", ["cudaXYZ", "cuda:x", "cuda0", "gpu"])
def test_a_matrix_device_no_run_can_use_is_refused_when_the_matrix_is_read(run_cli, tmp_path, device):
    toml = tmp_path / "device.toml"
    toml.write_text(SMOKE.read_text().replace("seeds = [0, 1]", f'seeds = [0, 1]\ndevice = "{device}"'))
    assert_one_line_error(run_cli("matrix", toml, "--out", tmp_path / "out", "--dry-run"),
                          str(toml), "device must be auto, cpu", f"got '{device}'")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:1"])
def test_the_devices_a_run_can_ask_for_pass(device):
    assert options.device_problem(device) is None


def test_nproc_below_one_is_refused():
    with pytest.raises(UsageError, match=r"^argument --nproc: must be >= 1, got 0$"):
        parse("run", "--task", "pizza", "--algo", "grpo", "--nproc", "0")


def test_agreement_of_two_different_matrices_is_refused(run_cli, tmp_path):
    first, second = RESULTS / "int8-rollouts", RESULTS / "ppo-ties"
    result = run_cli("agreement", first, second, "--out", tmp_path / "agree.md")
    assert_one_line_error(result, f"{first} (matrix int8-rollouts) and {second} (matrix ppo-ties) share no variant of a task",
                          "agreement compares a rerun of the same matrix")
    assert not (tmp_path / "agree.md").exists()


def test_agreement_with_a_missing_folder_says_so(run_cli, tmp_path):
    result = run_cli("agreement", RESULTS / "ppo-ties", tmp_path / "nope", "--out", tmp_path / "agree.md")
    assert_one_line_error(result, f"SECOND {tmp_path / 'nope'}: no such folder")


def test_report_on_another_matrixs_store_is_refused_and_writes_nothing(run_cli, tmp_path):
    directory = tmp_path / "ppo-ties"
    directory.mkdir()
    shutil.copy(RESULTS / "ppo-ties" / "matrix.json", directory)
    shutil.copy(RESULTS / "int8-rollouts" / "results.parquet", directory)  # another matrix's store
    before = sorted(p.name for p in directory.iterdir())
    assert_one_line_error(run_cli("report", directory, "--no-plots"),
                          f"{directory}: none of the 12 cells of its result store is a cell of the plan in "
                          f"{directory / 'matrix.json'} (matrix ppo-ties, 60 cells)", "belongs to another matrix")
    assert sorted(p.name for p in directory.iterdir()) == before


def test_a_matrixs_own_store_passes_the_check(tmp_path):
    from benchmarks.cli.matrix import check_store_matches_plan

    directory = tmp_path / "int8"
    directory.mkdir()
    for name in ("matrix.json", "results.parquet"):
        shutil.copy(RESULTS / "int8-rollouts" / name, directory)
    check_store_matches_plan(directory)


def test_brief_with_a_missing_folder_says_it_is_missing(run_cli, tmp_path):
    toy = matrix_dir(tmp_path / "toy", "a")
    result = run_cli("brief", tmp_path / "real", "--toy", toy, "--pair", "a", "a", "--out", tmp_path / "t.md")
    assert_one_line_error(result, f"{tmp_path / 'real'}: no such folder")
    result = run_cli("brief", toy, "--toy", tmp_path / "nope", "--pair", "a", "a", "--out", tmp_path / "t.md")
    assert_one_line_error(result, f"--toy {tmp_path / 'nope'}: no such folder")


@pytest.mark.parametrize("settings, refused", [
    ({"algo": "grpo", "temperature": 0.0}, True),
    ({"algo": "rloo", "temperature": 0}, True),
    ({"algo": "reinforce_pp", "temperature": 0.0, "group_baseline": True}, True),
    ({"algo": "reinforce_pp", "temperature": 0.0}, False),
    ({"algo": "ppo", "temperature": 0.0}, False),
    ({"algo": "grpo", "temperature": 0.7}, False),
    ({"algo": "grpo"}, False),
])
def test_temperature_zero_is_refused_for_a_group_based_algorithm(settings, refused):
    """Greedy sampling gives a group G copies of one completion: every group-relative advantage is 0."""
    problem = options.run_settings_problem(settings, spell=options.flag)
    if refused:
        assert problem.startswith(f"--temperature 0 with {settings['algo']}: greedy sampling makes every completion")
    else:
        assert problem is None


# --- 18. --help ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["", "report", "agreement", "brief", "calibration", "readme"])
def test_help_imports_neither_torch_nor_transformers(command):
    code = ("import sys\nfrom benchmarks.cli.main import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'transformers', 'algorithms', 'tasks', 'pandas') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, *command.split(), "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage: grpo-bench" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("command", ["run", "eval", "matrix", "check", "bench"])
def test_help_of_the_registry_subcommands_imports_no_transformers(command):
    # run --help took 8-10 s with transformers imported by algorithms.rollout and tasks.tiny_lm at module level;
    # their options come from the registries' dataclasses, which need torch (about 2 s) and nothing heavier.
    code = ("import sys\nfrom benchmarks.cli.main import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('transformers', 'trl', 'peft', 'datasets', 'pandas', 'matplotlib') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, command, "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage: grpo-bench" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_every_subcommand_is_listed_with_the_help_its_parser_gives():
    sub = cli_main.build_parser()._subparsers._group_actions[0]
    listed = {action.dest: action.help for action in sub._choices_actions}
    assert listed == {name: help_text for name, (_, _, help_text) in cli_main.COMMANDS.items()}
    for name in cli_main.COMMANDS:
        assert sub.parser_of(name).prog == f"grpo-bench {name}"
    assert sub.given_help == listed


def test_an_unknown_subcommand_lists_the_choices():
    with pytest.raises(UsageError, match=r"invalid choice: 'rnu' \(choose from 'run', 'eval', 'check'"):
        parse("rnu")


@pytest.mark.parametrize("command", ["run", "eval", "matrix"])
def test_each_default_is_printed_once(run_cli, capsys, command):
    with pytest.raises(SystemExit):
        run_cli(command, "--help")
    text = " ".join(capsys.readouterr().out.split())  # argparse's wrapping undone
    assert "(default: the task's) (default: None)" not in text
    for owner in text.split(" | ["):  # a flag several algorithms share: one default each
        for option in owner.split(" --"):
            assert option.count("(default") <= 1, option


def test_run_refuses_temperature_zero_for_a_group_based_algorithm(run_cli, tmp_path):
    code, _, err = run_cli("run", "--task", "pizza", "--algo", "grpo", "--temperature", "0", "--steps", "1",
                           "--out", tmp_path / "r")
    assert code == 2 and "--temperature 0 with grpo" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_a_prompt_longer_than_the_context_is_refused(run_cli, tmp_path):
    """A training prompt that with max_new_tokens does not fit the model's positions: one line, not a run on
    positions the model never learned."""
    from tasks.tiny_lm import shipped_model
    from tasks.pizza import RECIPE

    model = shipped_model("pizza", RECIPE)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n{"prompt": "' + "abc " * 100 + '"}\n')
    reward = tmp_path / "rw.py"
    reward.write_text("def score(prompts, completions):\n    return [float(len(c)) for c in completions]\n")
    code, _, err = run_cli("run", "--task", "prompts", "--prompts", prompts, "--model", model, "--algo", "grpo",
                           "--steps", "1", "--max-new-tokens", "8", "--reward-fn", f"{reward}:score", "--out", tmp_path / "r")
    assert code == 2 and "training prompt 1 of task 'prompts' is 400 tokens, as long as or longer than the model's context of 64" in err and len(err.strip().splitlines()) == 1


def test_a_store_of_tuning_cells_only_passes_the_check_between_the_stages(tmp_path):
    """When the tuning stage has ended and no evaluation cell has finished, matrix.json plans the evaluation cells and
    the store holds the tuning cells only: that is the matrix's own store, not another's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from benchmarks.cli.matrix import check_store_matches_plan
    from benchmarks.errors import UsageError

    tune = {"algo": "grpo", "seed": 100, "algo_options": {"learning_rate": 1e-5}, "dir": "tune/t/grpo/lr/seed100"}
    plan = {"name": "staged", "cells": [{**tune, "seed": 0, "dir": "t/grpo/seed0"}], "tuning": {"cells": [tune]}}
    directory = tmp_path / "staged"
    directory.mkdir()
    (directory / "matrix.json").write_text(json.dumps(plan))
    spec = {k: v for k, v in tune.items() if k != "dir"}
    pq.write_table(pa.table({"cell": [tune["dir"]], "kind": ["cell"], "spec": [json.dumps(spec)]}),
                   directory / "results.parquet")
    check_store_matches_plan(directory)
    plan["tuning"] = {"cells": []}  # the same store against a plan without those tuning cells: refused
    (directory / "matrix.json").write_text(json.dumps(plan))
    with pytest.raises(UsageError, match="belongs to another matrix"):
        check_store_matches_plan(directory)


def test_report_costs_against_a_named_variant_seed_by_seed_and_refuses_an_unknown_one(run_cli, tmp_path):
    """--cost-reference VARIANT: each other variant's training, cell and peak-memory ratios against it over the
    seeds both completed (the geometric mean and its 95% t-interval); an unknown variant is one line, nothing
    written."""
    import pandas as pd

    from benchmarks.report.stats import ratio_interval

    directory = tmp_path / "int8"
    directory.mkdir()
    for name in ("matrix.json", "results.parquet"):
        shutil.copy(RESULTS / "int8-rollouts" / name, directory)
    assert_one_line_error(run_cli("report", directory, "--no-plots", "--cost-reference", "grpo_fp8"),
                          "--cost-reference grpo_fp8: not a variant of", "grpo, grpo_int8")
    assert sorted(p.name for p in directory.iterdir()) == ["matrix.json", "results.parquet"]
    assert run_cli("report", directory, "--no-plots", "--cost-reference", "grpo")[0] == 0
    text = (directory / "README.md").read_text()
    cells = pd.read_csv(directory / "tables" / "cells.csv")
    rg = cells[cells["task"] == "reasoning_gym"]
    per_seed = {v: dict(zip(g["seed"], g["wall_clock_s"])) for v, g in rg.groupby("variant")}
    geo, low, high = ratio_interval(per_seed["grpo_int8"], per_seed["grpo"])
    cell = ratio_interval(*({s: w for s, w in zip(g["seed"], g["process_wall_clock_s"])}
                            for _, g in (("", rg[rg["variant"] == "grpo_int8"]), ("", rg[rg["variant"] == "grpo"]))))
    row = f"| reasoning_gym | grpo_int8 | {geo:.2f} [{low:.2f}, {high:.2f}] | {cell[0]:.2f} [{cell[1]:.2f}, {cell[2]:.2f}] | - | 3 |"
    assert row in text  # peak memory: grpo_int8 has no fresh-process peak, so no ratio
    assert "| task | variant | training / `grpo`'s | cell / `grpo`'s | peak memory / `grpo`'s | seeds both completed |" in text
    assert "cell / `grpo`'s |" in text.split("What a cell costs, by phase")[1].split("\n\n")[1].splitlines()[0]
    assert text.rstrip().endswith(f"grpo-bench report {directory} --cost-reference grpo`")
