import json
import os

import shutil
from pathlib import Path

import pytest
import torch

# Tests share one cache of pretrained task models; CI starts with an empty one and builds it once.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# No test reaches the network (the hub code paths are tested on local files). Offline, a missing hub file fails at
# once: online without a route, huggingface_hub retried for about 20 s per probe (the GSM8K probe in a checkout
# without the local copy).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# One torch thread in the test process, whatever ran before (several tests set it, and a test's numbers must not
# depend on which ones ran first), unless OMP_NUM_THREADS asks for more. The toy models gain nothing from a
# second thread, and on a shared 2-core machine two spinning threads made whole files 10x slower.
# Subprocesses (cells, the command line) keep their own defaults.
if "OMP_NUM_THREADS" not in os.environ:
    torch.set_num_threads(1)

# The checkout's root, for the tests that read its files (README.md, pyproject.toml, benchmarks/matrices/, results/):
# one place, whatever folder under tests/ a test file sits in.
ROOT = Path(__file__).resolve().parents[1]

TIME_KEYS = ("time/",)


def strip_timing(rows):
    """Metric rows without wall-clock fields, which legitimately differ between identical runs."""
    return [{k: v for k, v in r.items() if not k.startswith(TIME_KEYS)} for r in rows]


@pytest.fixture
def run_cli(capsys):
    """Run `grpo-bench ARGS...` in-process; returns (exit status, stdout, stderr)."""
    from benchmarks.cli.main import main

    def _run(*args):
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return _run


@pytest.fixture
def grpo_member_option(run_cli, capsys, tmp_path):
    """``check(selector, member, option, value, refused=None)``: the option of a registry member (a policy loss's,
    picked by loss_type; an advantage estimator's, by advantage_estimator) is a GRPO setting everywhere: a flag under
    the member in ``run --algo grpo --help``, a field of the recorded settings, a key of a matrix cell, and a value ``resolve``
    validates (``refused``: (a bad value, the message refusing it)). Returns the config ``resolve`` gives at
    ``value``, for the test to ask what the member reads."""
    from benchmarks.harness.config import flat_settings, resolve
    from benchmarks.matrix.plan import parse

    def check(selector: str, member: str, option: str, value, refused=None):
        with pytest.raises(SystemExit):
            run_cli("run", "--algo", "grpo", "--help")
        out = capsys.readouterr().out
        heading = out.index(f"grpo options of {selector} {member}")
        assert f"--{option.replace('_', '-')}" in out[heading:heading + 300]
        rc, config, _ = resolve({"task": "pizza", "algo": "grpo", selector: member, option: value})
        assert flat_settings(rc, config, {})[option] == value  # what config.json and a cell record
        if refused is not None:
            with pytest.raises(Exception, match=refused[1]):
                resolve({"task": "pizza", "algo": "grpo", option: refused[0]})
        matrix = tmp_path / "m.toml"
        matrix.write_text(f'name = "m"\nseeds = [0]\nbudget = 32\ndevice = "cpu"\n[tasks.pizza]\n[algorithms.plugin]\n'
                          f'algo = "grpo"\n{selector} = "{member}"\n{option} = {json.dumps(value)}\n')
        (cell,) = parse(matrix).cells
        assert cell.settings[option] == value and cell.settings[selector] == member
        return config

    return check


def gsm8k_unavailable() -> "str | None":
    """Why GSM8K's test split cannot be read here (neither the local copy nor the hub), or None when it can.

    Only the data is probed (``tasks.gsm8k.load_split``), so a test that builds the task still fails on any
    other TaskError. Remembered per data source: $GRPO_BENCH_GSM8K, $HF_HUB_OFFLINE, the local copy, and the
    functions that find and load the data (a test that replaces one, e.g. the hub's loader, gets its own probe, not
    the answer the real functions gave)."""
    from tasks import gsm8k
    from tasks.base import TaskError

    key = (os.environ.get(gsm8k.ENV_DATA), os.environ.get("HF_HUB_OFFLINE"), str(gsm8k.local_copy()),
           gsm8k.local_copy, gsm8k.load_split, gsm8k.load_file, gsm8k._load_hub)
    if key not in _GSM8K_PROBES:
        try:
            gsm8k.load_split(None, "test")
            _GSM8K_PROBES[key] = None
        except TaskError as exc:
            _GSM8K_PROBES[key] = f"GSM8K data unavailable: {exc}"
    return _GSM8K_PROBES[key]


_GSM8K_PROBES: dict = {}


@pytest.fixture
def gsm8k_data():
    """Skip the test, with the reason, when neither GSM8K's local copy nor the hub can be read."""
    reason = gsm8k_unavailable()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture
def run_dir(finished, tmp_path):
    """A copy of the module's finished run (its own ``finished`` fixture) to change."""
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    return out


@pytest.fixture(scope="module")
def pizza_model(tmp_path_factory):
    """The pizza task's starting policy as a save_pretrained directory."""
    from tasks.pizza import PizzaTask

    path = tmp_path_factory.mktemp("model") / "pizza"
    task = PizzaTask(eval_samples=1)
    task.load_policy("cpu").save_pretrained(path)
    task.tokenizer.save_pretrained(path)
    return path
