"""The GPU path (benchmarks/matrices/gpu_reasoning_gym.toml, gpu_gsm8k.toml), run on CPU with a tiny version of each
file: the same tasks, algorithms and options, with the device, precision, seeds, budgets and evaluation sizes cut
down, and GSM8K on SmolLM2-135M instead of the 1.7B hub model. Every substitution must find its text, so a change
to a GPU file that this test no longer covers fails here instead of going untested."""

from pathlib import Path

import pytest

from tests.conftest import ROOT

MATRICES = ROOT / "benchmarks" / "matrices"

COMMON = [('device = "cuda"', 'device = "cpu"'), ('precision = "bf16"', 'precision = "fp32"'),
          ("num_gpus = 1\n", "")]
REASONING_GYM = COMMON + [
    ("seeds = [0, 1, 2]", "seeds = [0]"),
    ("budget = 5120 ", "budget = 32 "),
    ("eval_every = 1280 ", "eval_every = 0 "),
    ("eval_problems = 500", "eval_problems = 4"),
    (",\n           'products:{\"min_terms\": 2, \"max_terms\": 2, \"min_digits\": 1, \"max_digits\": 2}']", "]"),
    ("[algorithms.dpo]\n", "[algorithms.dpo]\npairs = 4\npairs_per_step = 2\n"),  # 256 pairs take rounds of 1024 samples
]
GSM8K = COMMON + [
    ("budget = 32000 ", "budget = 2 "),
    ("eval_every = 6400", "eval_every = 0"),
    ("checkpoint_every = 3200", "checkpoint_every = 0"),
    ('model = "HuggingFaceTB/SmolLM2-1.7B-Instruct"\n', ""),
    ("eval_questions = 1319", "eval_questions = 2"),
    ("eval_max_new_tokens = 512", "eval_max_new_tokens = 8"),
    ("eval_batch = 128", "eval_batch = 2"),
    ("group_size = 8", "group_size = 2"),
    ("prompts_per_step = 8", "prompts_per_step = 1"),
]


def tiny(name: str, substitutions, tmp_path: Path) -> Path:
    text = (MATRICES / name).read_text()
    for old, new in substitutions:
        assert old in text, f"{name} no longer has {old!r}: update the tiny version in this test"
        text = text.replace(old, new)
    assert "cuda" not in text.split("\nname", 1)[1] and "bf16" not in text.split("\nname", 1)[1]
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.slow
def test_gpu_reasoning_gym_matrix_runs_tiny_on_cpu(run_cli, tmp_path):
    path = tiny("gpu_reasoning_gym.toml", REASONING_GYM, tmp_path)
    out = tmp_path / "rg"
    code, stdout, err = run_cli("matrix", path, "--out", out, "--allow-dirty")
    assert code == 0, stdout[-2000:] + err[-2000:]
    assert "6 run and complete, 0 already complete, 0 failed" in stdout, stdout[-1500:]
    text = (out / "README.md").read_text()
    for variant in ("grpo", "dapo", "rloo", "reinforce_pp", "ppo", "dpo"):
        assert f"| {variant} |" in text, variant


@pytest.mark.slow
def test_gpu_gsm8k_matrix_runs_tiny_on_cpu(run_cli, tmp_path, gsm8k_data):
    path = tiny("gpu_gsm8k.toml", GSM8K, tmp_path)
    out = tmp_path / "gsm8k"
    code, stdout, err = run_cli("matrix", path, "--out", out, "--allow-dirty")
    assert code == 0, stdout[-2000:] + err[-2000:]
    assert "1 run and complete, 0 already complete, 0 failed" in stdout, stdout[-1500:]
    assert "| grpo |" in (out / "README.md").read_text()


def test_the_gpu_verdict_is_the_cpu_verdicts_design_at_its_tuned_settings():
    """gpu_verdict_chain_sum.toml replicates the chain_sum verdict on a GPU: every variant's cells have the settings
    of the CPU verdict's evaluation cells, with the learning rate (DPO also beta) its tuning chose (the committed
    store's matrix.json), and only the device, the seeds and the cores differ."""
    import json

    from benchmarks.matrix.plan import parse

    chosen = {}
    for entry in json.loads((ROOT / "results/reasoning-gym/verdict-chain-sum/matrix.json").read_text())["tuning"]["table"]:
        chosen[entry["variant"]] = entry["points"][entry["chosen"]]["settings"]
    cpu = {c.relpath: c.spec() for c in parse(MATRICES / "rg_verdict_chain_sum.toml").cells if not c.relpath.startswith("tune/")}
    gpu = {c.relpath: c.spec() for c in parse(MATRICES / "gpu_verdict_chain_sum.toml").cells}
    assert set(chosen) == {c.split("/")[1] for c in gpu} and len(chosen) == 8
    assert {c for c in gpu if c.endswith("/seed15")} and set(cpu) < set(gpu)  # 16 seeds, the CPU's 8 among them
    for relpath, spec in cpu.items():
        variant, mine = relpath.split("/")[1], gpu[relpath]
        expected = {**spec["settings"], **chosen[variant], "device": "cuda"}
        assert mine["settings"] == expected, relpath
        assert {k: v for k, v in mine.items() if k not in ("settings", "device", "algo_options")} == \
            {k: v for k, v in spec.items() if k not in ("settings", "device", "algo_options")}, relpath


def test_the_gpu_checks_script_asks_for_what_the_suite_accepts(run_cli, tmp_path):
    """benchmarks/perf/gpu_checks.sh runs where it cannot be tried first (a lent GPU, minutes at a time): its
    bench and matrix commands, read from the script itself, parse here (the matrix as a dry run; the bench stops at
    its one line about CUDA on a machine without it), and it is valid bash."""
    import re
    import shlex
    import subprocess

    import torch

    script = ROOT / "benchmarks" / "perf" / "gpu_checks.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text().replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        if re.search(r"^\s*(timeout .*)?\$GB ", line):
            words = shlex.split(line.split("$GB", 1)[1])
            commands.append(words[: words.index("||")] if "||" in words else words)  # the command, not its fallback
    assert [c[0] for c in commands] == ["bench", "matrix"]
    for command, name in zip(commands, ("roof", "verdict")):
        command[command.index("--out") + 1] = str(tmp_path / name)
    roof, matrix = commands
    if not torch.cuda.is_available():
        code, _, err = run_cli(*roof)
        assert code == 2 and "CUDA is not available here" in err, err
    code, stdout, err = run_cli(*matrix, "--dry-run")
    assert code == 0, err[-1500:]
    assert "chain_sum/ppo/seed15" in stdout and "chain_sum/dpo/seed15" in stdout
