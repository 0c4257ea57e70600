import os

import shutil

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


def gsm8k_unavailable() -> "str | None":
    """Why GSM8K's test split cannot be read here (neither the local copy nor the hub), or None when it can.

    Only the data is probed (``tasks.gsm8k.load_split``), so a test that builds the task still fails on any
    other TaskError. Remembered per data source: $GRPO_BENCH_GSM8K, $HF_HUB_OFFLINE and the local copy."""
    from tasks import gsm8k
    from tasks.base import TaskError

    key = (os.environ.get(gsm8k.ENV_DATA), os.environ.get("HF_HUB_OFFLINE"), str(gsm8k.local_copy()))
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
