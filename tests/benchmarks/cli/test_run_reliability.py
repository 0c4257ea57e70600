"""A run's reliability against an adversarial user: a data-parallel run whose rank fails is not complete, a
damaged checkpoint that still loads is refused, a run's files whose record is unreadable are not replaced unasked,
a diverged policy and a damaged summary are one line, inputs that cannot fit the machine are refused before any
work, a killed checkpoint write leaves no temporary file behind, and an empty algorithm, a config file's duplicate
key and an empty --out are refused. Bad input is one line and exit status 2; a failed run one line and status 1."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks.io import read_jsonl
from tests.benchmarks.cli.test_main import assert_one_line_error
from tests.benchmarks.cli.test_run import FAST, GRPO, finished, no_work  # noqa: F401 (fixtures)


def assert_one_line_failure(result, *fragments):
    """A run that broke: exit status 1 and one ``failed:`` line, no traceback."""
    code, _, err = result
    assert code == 1, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("grpo-bench: ")]
    assert len(lines) == 1 and lines[0].startswith("grpo-bench: failed: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# --- a data-parallel run is complete only when every rank finished ----------------------------------------------

REWARD = '''import inspect
import os


def reward(prompts, completions):
    # rank 1 breaks in its evaluation after training, when BREAK_RANK1 is set: after every step and collective
    if os.environ.get("BREAK_RANK1") and os.environ.get("RANK") == "1" and any(
            frame.function == "_finish" for frame in inspect.stack()):
        raise RuntimeError("rank 1 broke after its last step")
    return [float(len(c) % 2) for c in completions]
'''


def test_a_rank_that_fails_makes_the_data_parallel_run_fail_not_complete(run_cli, tmp_path, monkeypatch):
    (tmp_path / "rank_reward.py").write_text(REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))  # the spawned ranks import the reward function by its module's name
    monkeypatch.setenv("BREAK_RANK1", "1")
    out = tmp_path / "dp"
    args = ("run", "--task", "pizza", "--algo", "rloo", "--nproc", "2", "--reward-fn", "rank_reward:reward",
            "--steps", "2", "--eval-every", "0", "--checkpoint-every", "1", "--eval-samples", "8", "--device", "cpu",
            "--out", out)
    result = run_cli(*args)
    # Whichever rank torch finds failed first is named: rank 1 itself, or rank 0, which lost its peer.
    if "lost its peer" in result[2]:
        assert_one_line_failure(result, "rank 0 of 2 lost its peer (another rank stopped first)")
    else:
        assert_one_line_failure(result, "rank 1 of 2 failed", "rank 1 broke after its last step")
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    assert summary.get("status") != "complete"
    monkeypatch.delenv("BREAK_RANK1")
    code, printed, err = run_cli(*args, "--resume")  # continues the run: it was never complete
    assert code == 0, err
    assert "nothing to do" not in printed + err
    assert json.loads((out / "summary.json").read_text())["status"] == "complete"
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2]


# --- checkpoints carry a checksum ---------------------------------------------------------------------------------


def _zeroed_where_it_still_loads(data: bytes) -> bytes:
    """``data`` with 64 bytes zeroed from its middle on, where they were not all zeros and the checkpoint still
    loads (a tensor's bytes, not a zip header the reader would reject): damage only a checksum finds."""
    import io

    import torch

    start = len(data) // 2
    while True:
        damaged = bytearray(data)
        damaged[start:start + 64] = bytes(64)
        if damaged != data:
            try:
                torch.load(io.BytesIO(bytes(damaged)), weights_only=False)
                return bytes(damaged)
            except Exception:
                pass
        start += 64


def test_resume_from_a_checkpoint_damaged_in_its_middle_is_refused_naming_it(run_cli, run_dir):
    newest = run_dir / "checkpoints" / "step_0000002.pt"
    newest.write_bytes(_zeroed_where_it_still_loads(newest.read_bytes()))
    before = (run_dir / "metrics.jsonl").read_text()
    assert_one_line_error(run_cli(*GRPO, *FAST[2:], "--steps", "4", "--resume", "--out", run_dir),
                          f"{newest}: damaged checkpoint")
    assert (run_dir / "metrics.jsonl").read_text() == before


def test_resume_from_intact_checkpoints_checks_them_and_goes_on(run_cli, run_dir):
    code, _, err = run_cli(*GRPO, *FAST[2:], "--steps", "4", "--resume", "--out", run_dir)
    assert code == 0, err
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2, 3, 4]


# --- a run's files are not replaced unasked when its record cannot be read ---------------------------------------


def test_a_run_whose_config_and_summary_are_unreadable_is_not_overwritten(run_cli, run_dir):
    for name in ("config.json", "summary.json"):
        with open(run_dir / name, "r+") as f:
            f.truncate(50)
    before = (run_dir / "metrics.jsonl").read_text()
    assert_one_line_error(run_cli(*GRPO, *FAST, "--out", run_dir), f"{run_dir} holds a run's files",
                          "metrics.jsonl", "checkpoints", "--overwrite")
    assert (run_dir / "metrics.jsonl").read_text() == before
    code, _, err = run_cli(*GRPO, *FAST, "--out", run_dir, "--overwrite")
    assert code == 0, err


# --- one line, not a traceback ------------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ["reinforce", "grpo", "ppo"])
def test_a_diverging_learning_rate_is_one_line(run_cli, tmp_path, algo):
    result = run_cli("run", "--task", "pizza", "--algo", algo, "--learning-rate", "1e30", *FAST,
                     "--out", tmp_path / algo)
    assert_one_line_failure(result, f"{algo} on pizza: non-finite")
    assert json.loads((tmp_path / algo / "summary.json").read_text())["status"] == "failed"


def test_eval_from_a_run_with_a_truncated_summary_is_one_line(run_cli, run_dir):
    with open(run_dir / "summary.json", "r+") as f:
        f.truncate(50)
    assert_one_line_error(run_cli("eval", "--task", "pizza", "--from-run", run_dir),
                          f"{run_dir / 'summary.json'} is not a readable run summary")


# --- inputs that cannot fit the machine ---------------------------------------------------------------------------


def test_more_processes_than_cores_is_refused(run_cli, tmp_path, no_work):
    assert_one_line_error(run_cli(*GRPO, *FAST, "--nproc", "100000", "--out", tmp_path / "r"),
                          "--nproc 100000 on the CPU is more processes than the", "CPU cores")
    assert not (tmp_path / "r").exists()


def test_a_group_beyond_the_cap_is_refused_before_training(run_cli, tmp_path):
    out = tmp_path / "r"
    assert_one_line_error(run_cli("run", "--task", "pizza", "--algo", "grpo", "--group-size", "100000", *FAST,
                                  "--out", out), "400000 completions per step", "more than the 65536")
    assert not (out / "metrics.jsonl").exists()


def test_a_batch_beyond_the_available_memory_is_refused(run_cli, tmp_path, monkeypatch):
    from benchmarks.harness import measure

    monkeypatch.setattr(measure, "available_memory_bytes", lambda device: 2**20)  # 1 MiB left
    out = tmp_path / "r"
    # pizza: 2 layers x (2 x 64 + 64) + 30 vocabulary = 414 fp32 numbers a position; 512 x 12 positions: 9.7 MiB
    assert_one_line_error(run_cli("run", "--task", "pizza", "--algo", "grpo", "--group-size", "128", *FAST,
                                  "--out", out),
                          "512 completions per step x 12 new tokens need at least 9.7 MiB",
                          "more than the 1.0 MiB available on cpu")
    assert measure.rollout_memory_bytes(_pizza_policy(), 512, 12) == 512 * 12 * 4 * (2 * (2 * 64 + 64) + 30)


def _pizza_policy():
    from tasks.pizza import PizzaTask

    return PizzaTask(eval_samples=1).load_policy("cpu")


# --- a killed checkpoint write ------------------------------------------------------------------------------------


def test_resume_removes_the_temporary_files_of_a_killed_checkpoint_write(run_cli, run_dir):
    folder = run_dir / "checkpoints"
    stale = folder / ".step_0000003.pt.0123abcd.tmp"  # what atomic_write leaves when SIGKILL hits torch.save
    stale.write_bytes(b"half a checkpoint")
    others = [folder / "notes.tmp", folder / ".step_0000003.pt.not-ours.tmp", run_dir / ".step_0000001.pt.0123abcd.tmp"]
    for path in others:
        path.write_text("not ours")
    code, _, err = run_cli(*GRPO, *FAST[2:], "--steps", "4", "--resume", "--out", run_dir)
    assert code == 0, err
    assert not stale.exists() and f"{stale}: removed" in err
    assert all(path.exists() for path in others)


# --- names and files ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ["", "GRPO", "grpo "])
def test_an_empty_or_unknown_algorithm_is_refused_with_the_choices(run_cli, tmp_path, no_work, algo):
    assert_one_line_error(run_cli("run", "--task", "pizza", "--algo", algo, *FAST, "--out", tmp_path / "r"),
                          f"unknown algorithm {algo!r}", "choose from", "dpo", "grpo", "reinforce_pp", "rloo")


def test_an_empty_algorithm_from_python_is_refused(tmp_path):
    from benchmarks.api import train
    from benchmarks.errors import UsageError

    with pytest.raises(UsageError, match=r"unknown algorithm ''; choose from"):
        train(task="pizza", algo="", steps=1, out=str(tmp_path / "r"))


@pytest.mark.parametrize("suffix, text", [
    (".json", '{"task": "pizza", "algo": "grpo", "steps": 3, "steps": 200}'),
    (".yaml", "task: pizza\nalgo: grpo\nsteps: 3\nsteps: 200\n"),
    (".yml", "task: pizza\nsteps: 3\nalgo: grpo\nsteps: 3\n"),
])
def test_a_config_file_with_a_duplicate_key_is_refused(run_cli, tmp_path, no_work, suffix, text):
    path = tmp_path / f"run{suffix}"
    path.write_text(text)
    assert_one_line_error(run_cli("run", "--config", path, "--out", tmp_path / "r"),
                          f"--config {path}: the key 'steps' is given more than once")


def test_a_config_file_without_duplicates_still_loads(tmp_path):
    from benchmarks.harness.config import load_config_file

    (tmp_path / "a.json").write_text('{"task": "pizza", "nested-name": 1, "x": {"a": 1, "b": 2}}')
    with pytest.raises(Exception, match="must be a single value"):
        load_config_file(tmp_path / "a.json")
    (tmp_path / "b.yaml").write_text("task: pizza\nlearning-rate: 1e-3\n")
    assert load_config_file(tmp_path / "b.yaml") == {"task": "pizza", "learning_rate": "1e-3"}


@pytest.mark.parametrize("out", ["", "  "])
def test_an_empty_out_is_refused(run_cli, tmp_path, no_work, monkeypatch, out):
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(run_cli(*GRPO, *FAST, "--out", out), "--out must name a folder for the run")
    assert os.listdir(tmp_path) == []
