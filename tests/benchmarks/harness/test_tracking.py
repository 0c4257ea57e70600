"""--report-to: TensorBoard's event files hold metrics.jsonl's scalars; wandb (offline) and trackio write
their local run directories under --out; a tracker that is not installed is one line, exit 2, before any work.
The first two need the integrations extra (pytest -m integration); the missing-tracker ones run in the fast tier."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks.io import read_jsonl
from tests.benchmarks.cli.test_main import assert_one_line_error
from tests.conftest import ROOT

PIZZA = ("run", "--task", "pizza", "--algo", "grpo", "--steps", "3", "--eval-samples", "32", "--eval-every", "2")


@pytest.mark.integration
def test_tensorboard_scalars_equal_metrics_jsonl(run_cli, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    code, _, err = run_cli(*PIZZA, "--report-to", "tensorboard", "--out", tmp_path)
    assert code == 0, err
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0}).Reload()
    logged = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}
    expected = {}
    for row in rows:
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)):
                expected.setdefault(key, {})[row["step"]] = value
    assert set(logged) == set(expected)
    assert "eval/accuracy" in logged and "reward/mean" in logged
    for tag, by_step in expected.items():
        assert logged[tag].keys() == by_step.keys(), tag
        for step, value in by_step.items():  # event files store float32
            assert logged[tag][step] == pytest.approx(value, rel=1e-6, abs=1e-30), (tag, step)
    assert "config/text_summary" in events.Tags()["tensors"]  # the resolved config, as text


@pytest.mark.integration
def test_wandb_offline_and_trackio_write_local_runs(tmp_path):
    # A fresh process: trackio reads its directory ($TRACKIO_DIR, set to OUT/trackio) when first imported.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "TRACKIO_"))}
    env["WANDB_SILENT"] = "true"
    out = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "benchmarks.cli.main", *PIZZA, "--report-to", "wandb,trackio",
                    "--run-name", "cell-a", "--tracker-group", "matrix-x", "--tracker-tags", "pizza,grpo,seed0",
                    "--out", str(out)], cwd=ROOT, env=env, check=True, capture_output=True)
    (run_dir,) = (out / "wandb").glob("offline-run-*")
    assert list(run_dir.glob("*.wandb")) and (run_dir / "files").is_dir()
    assert (out / "trackio" / "grpo-bench.db").stat().st_size > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["run"]["report_to"] == "wandb,trackio"


@pytest.mark.parametrize("tracker", ["tensorboard", "wandb", "trackio"])
def test_missing_tracker_is_one_line_before_any_work(run_cli, tmp_path, monkeypatch, tracker):
    monkeypatch.setitem(sys.modules, tracker, None)  # `import tracker` now fails as if it were not installed
    out = tmp_path / "run"
    result = run_cli(*PIZZA, "--report-to", f"none,{tracker}", "--out", out)
    assert_one_line_error(result, f'pip install -e ".[{tracker}]"', tracker)
    assert not out.exists()


def test_unknown_tracker(run_cli, tmp_path):
    assert_one_line_error(run_cli(*PIZZA, "--report-to", "mlflow", "--out", tmp_path), "mlflow", "tensorboard")
