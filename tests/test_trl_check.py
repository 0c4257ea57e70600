"""Our GRPO loss, advantages and DPO loss against TRL's own trainers (benchmarks/trl_check.py)."""

import tempfile

import pytest
import torch

pytest.importorskip("trl")

from benchmarks.checks import trl as trl_check  # noqa: E402
from benchmarks.cli.main import main  # noqa: E402


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    base, tokenizer = trl_check.load_model()
    inputs = trl_check.grpo_inputs(base, tokenizer)
    with tempfile.TemporaryDirectory() as out_dir:
        yield base, tokenizer, inputs, out_dir


def test_inputs_are_ragged_and_left_padded(setup):
    _, tokenizer, inputs, _ = setup
    lengths = inputs["completion_mask"].sum(1)
    assert len(set(lengths.tolist())) >= 5  # ragged completions, one truncated at T
    assert (inputs["prompt_mask"] == 0).any()  # a left-padded prompt
    ratio = (inputs["old_per_token_logps"] - inputs["ref_per_token_logps"]).abs()
    assert ratio[inputs["completion_mask"].bool()].min() > 0  # old, ref and current all differ


@pytest.mark.parametrize("cfg", trl_check.loss_configs(), ids=trl_check.config_name)
def test_grpo_loss_matches_trl(setup, cfg):
    base, tokenizer, inputs, out_dir = setup
    row = trl_check.check_grpo_loss(base, tokenizer, inputs, cfg, out_dir)
    assert row.diff <= trl_check.LOSS_TOL, row
    assert row.grad_rel_err <= trl_check.GRAD_TOL, row
    if cfg["mu"] == 1 and cfg["beta"] == 0 and cfg["loss_type"] == "grpo":
        assert abs(row.trl) < 1e-7 and abs(row.ours) < 1e-7  # both read 0 on-policy ...
    else:
        assert abs(row.trl) > 1e-4  # ... and nothing else is trivially 0 = 0


@pytest.mark.parametrize("scale", trl_check.SCALES)
def test_group_advantages_match_trl(setup, scale):
    base, tokenizer, _, out_dir = setup
    rows = trl_check.check_advantages(base, tokenizer, scale, out_dir)
    assert all(r.passed for r in rows), [r for r in rows if not r.passed]
    assert rows[-1].trl != 0 and (scale != "group" or abs(rows[5].trl - 0.5) < 1e-3)


def test_dpo_loss_matches_trl(setup):
    base, tokenizer, _, out_dir = setup
    row = trl_check.check_dpo(base, tokenizer, out_dir)
    assert row.passed, row
    assert abs(row.trl - torch.log(torch.tensor(2.0)).item()) > 1e-3  # reference differs from policy


def test_command_writes_results_and_fails_on_mismatch(tmp_path, monkeypatch, capsys):
    rows = [trl_check.CheckRow("grpo_loss", "a", 1.0, 1.0, 0.0, 0.0, True)]
    monkeypatch.setattr(trl_check, "run_checks", lambda progress=None: rows)
    assert main(["check", "trl", "--out", str(tmp_path)]) == 0
    assert {p.name for p in tmp_path.iterdir()} == {"report.md", "results.csv", "results.json"}
    assert "1/1 checks pass" in (tmp_path / "report.md").read_text()
    rows.append(trl_check.CheckRow("dpo_loss", "b", 1.0, 2.0, 1.0, 0.5, False))
    assert main(["check", "trl", "--out", str(tmp_path)]) == 1
    assert "**NO**" in (tmp_path / "report.md").read_text()
