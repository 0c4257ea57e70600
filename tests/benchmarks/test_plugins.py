"""A plug-in distribution (a ``*.dist-info`` with ``entry_points.txt`` on the path, as pip would install
it) adds an algorithm and a task that work everywhere built-in ones do: ``run``, ``--help``, a
two-cell ``matrix`` whose cells run in their own processes, and ``report``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT

PLUGIN = '''
"""An example plug-in: REINFORCE without a baseline under its own name, and pizza with a reward bonus option."""
from dataclasses import dataclass, field

from algorithms.reinforce import REINFORCE, REINFORCEConfig
from tasks.pizza import PizzaTask


@dataclass
class PlainConfig(REINFORCEConfig):
    baseline: str = field(default="none", metadata={"help": "no baseline: plain REINFORCE"})


class PlainReinforce(REINFORCE):
    name = "plain_reinforce"
    Config = PlainConfig


class BonusPizza(PizzaTask):
    name = "bonus_pizza"
    option_help = {"bonus": "added to every reward (a plug-in task's own option)"}

    def __init__(self, reward_mode=None, reward_fn=None, eval_samples: int = 256, model=None, bonus: float = 0.0):
        super().__init__(reward_mode, reward_fn, eval_samples=eval_samples, model=model)
        self.bonus = bonus

    def reward(self, prompts, completions):
        return [r + self.bonus for r in super().reward(prompts, completions)]
'''


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    (site / "grpo_bench_example_plugin.py").write_text(PLUGIN)
    info = site / "grpo_bench_example_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: grpo-bench-example-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent("""\
        [grpo_bench.algorithms]
        plain_reinforce = grpo_bench_example_plugin:PlainReinforce

        [grpo_bench.tasks]
        bonus_pizza = grpo_bench_example_plugin:BonusPizza
        """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]))
    return env


def _grpo_bench(env, *args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "benchmarks.cli.main", *args], env=env, cwd=cwd,
                          capture_output=True, text=True)


def test_plugin_algorithm_and_task_in_help_and_run(plugin_env, tmp_path):
    done = _grpo_bench(plugin_env, "run", "--help")
    assert done.returncode == 0, done.stderr
    assert "  plain_reinforce " in done.stdout and "--bonus" in done.stdout  # listed among the algorithms and tasks
    done = _grpo_bench(plugin_env, "run", "--algo", "plain_reinforce", "--task", "bonus_pizza", "--help")
    assert done.returncode == 0, done.stderr
    assert "plain_reinforce options:" in done.stdout and "bonus_pizza options:" in done.stdout
    out = tmp_path / "run"
    done = _grpo_bench(plugin_env, "run", "--task", "bonus_pizza", "--algo", "plain_reinforce", "--bonus", "1.5",
                       "--steps", "3", "--eval-samples", "16", "--eval-every", "0", "--out", str(out))
    assert done.returncode == 0, done.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["settings"]["bonus"] == 1.5 and config["algo_config"]["baseline"] == "none"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["reward/mean"] >= 1.5 for r in rows)  # the bonus reached the reward
    # An option of the plug-in task is refused on another task, with one line.
    done = _grpo_bench(plugin_env, "run", "--task", "pizza", "--algo", "grpo", "--bonus", "1", "--out", str(tmp_path / "x"))
    assert done.returncode == 2 and done.stderr.strip() == "grpo-bench: error: --bonus is an option of task bonus_pizza, not of pizza"


@pytest.mark.slow  # a two-cell matrix in a worker process, then its report: about 19 s
def test_plugin_cells_in_a_matrix(plugin_env, tmp_path):
    toml = tmp_path / "plugin.toml"
    toml.write_text("seeds = [0, 1]\nbudget = 24\ndevice = \"cpu\"\n\n[tasks.bonus_pizza]\neval_samples = 16\nbonus = 0.5\n\n"
                    "[algorithms.plain_reinforce]\n")
    out = tmp_path / "out"
    # One warm worker runs both cells (one process to start, not two), then the matrix writes its report.
    done = _grpo_bench(plugin_env, "matrix", str(toml), "--out", str(out), "--no-progress", "--jobs", "1",
                       "--allow-dirty")
    assert done.returncode == 0, done.stdout + done.stderr
    summaries = sorted(out.glob("*/*/seed*/summary.json"))
    assert len(summaries) == 2
    assert all(json.loads(p.read_text())["status"] == "complete" for p in summaries)
    assert "report: " in done.stdout  # written by the matrix command, in the process that registered the plug-ins
    assert "plain_reinforce" in (out / "tables" / "summary.md").read_text()


def test_a_duplicate_name_is_refused():
    from algorithms import register_algorithm
    from algorithms.reinforce import REINFORCE

    class Other(REINFORCE):
        name = "grpo"

    with pytest.raises(ValueError, match="algorithm name 'grpo' is taken by algorithms.grpo.GRPO"):
        register_algorithm(Other)
    register_algorithm(REINFORCE)  # the same class again is a no-op
