"""grpo-bench run --config FILE (.toml, .yaml/.yml, .json): the flags' names, flags override the file; the
same run from a file and from flags writes the same config.json; bad files and keys are one line, exit 2."""

import json

import pytest

from benchmarks.harness.config import check_types, load_config_file
from tests.benchmarks.cli.test_main import assert_one_line_error

TOML = """\
task = "pizza"
algo = "grpo"
steps = 2
seed = 3
eval-samples = 32
learning_rate = 1e-3
group-size = 4
"""
FLAGS = ("--task", "pizza", "--algo", "grpo", "--steps", "2", "--seed", "3", "--eval-samples", "32",
         "--learning-rate", "1e-3", "--group-size", "4")


def _config(path):
    config = json.loads(path.read_text())
    config.pop("environment")
    config["run"].pop("command")  # the command as typed differs; cli/test_main_reproduce.py replays it
    return config


def test_file_and_flags_write_the_same_config(run_cli, tmp_path, monkeypatch):
    (tmp_path / "run.toml").write_text(TOML)
    for where, args in (("file", ("--config", tmp_path / "run.toml")), ("flags", FLAGS)):
        (tmp_path / where).mkdir()
        monkeypatch.chdir(tmp_path / where)  # the same relative --out in both
        code, _, err = run_cli("run", *args, "--out", "run")
        assert code == 0, err
    assert _config(tmp_path / "file" / "run" / "config.json") == _config(tmp_path / "flags" / "run" / "config.json")


def test_yaml_json_and_toml_read_alike(tmp_path):
    (tmp_path / "a.toml").write_text(TOML)
    (tmp_path / "b.yaml").write_text(TOML.replace(" = ", ": "))
    options = check_types(load_config_file(tmp_path / "a.toml"))
    (tmp_path / "c.json").write_text(json.dumps(options))
    read = [check_types(load_config_file(tmp_path / name)) for name in ("b.yaml", "c.json")]
    assert read == [options, options]  # YAML's "1e-3" (a string to PyYAML) becomes the float the field wants
    assert options["eval_samples"] == 32 and options["group_size"] == 4


def test_flags_override_the_file(run_cli, tmp_path):
    (tmp_path / "run.toml").write_text(TOML)
    code, _, err = run_cli("run", "--config", tmp_path / "run.toml", "--steps", "1", "--out", tmp_path / "run")
    assert code == 0, err
    settings = json.loads((tmp_path / "run" / "config.json").read_text())["settings"]
    assert settings["steps"] == 1 and settings["seed"] == 3


@pytest.mark.parametrize("text,fragments", [
    (TOML + "colour = 'red'\n", ["unknown option 'colour'", "run.toml"]),
    (TOML + "mu = 2\nkl_coef = 0.1\n", ["'kl_coef'", "ppo"]),
    (TOML.replace("steps = 2", "steps = 'two'"), ["'steps'", "must be a int"]),
    ("task = [\n", ["not valid toml"]),
    (TOML + "[grpo]\nbeta = 1\n", ["'grpo' must be a single value"]),
])
def test_bad_files_are_one_line(run_cli, tmp_path, text, fragments):
    (tmp_path / "run.toml").write_text(text)
    assert_one_line_error(run_cli("run", "--config", tmp_path / "run.toml", "--out", tmp_path / "run"), *fragments)


def test_missing_task_and_unknown_suffix(run_cli, tmp_path):
    assert_one_line_error(run_cli("run", "--algo", "grpo", "--out", tmp_path / "r"), "--task is required")
    (tmp_path / "run.ini").write_text("")
    assert_one_line_error(run_cli("run", "--config", tmp_path / "run.ini"), ".toml, .yaml")


def test_a_run_config_is_built_by_resolve_alone():
    """Every run's settings go through ``resolve`` (the command line, a config file, a matrix cell, a bench's workload,
    both sides of a comparison with TRL): no module but the harness's config builds a RunConfig by hand."""
    import ast

    from tests.conftest import ROOT

    builders = set()
    for package in ("algorithms", "tasks", "benchmarks"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and "RunConfig" in (getattr(node.func, "id", None), getattr(node.func, "attr", None)):
                    builders.add(str(path.relative_to(ROOT)))
    assert builders == {"benchmarks/harness/config.py"}
