"""The mu = 1 checks' core assertions on the pizza model and real rollouts (benchmarks/checks/mu1.py), and the
settings the command line hands them."""

import copy

import pytest
import torch

from algorithms.losses import group_advantages
from benchmarks.checks import mu1 as mu1_check
from benchmarks.cli.main import main


@pytest.fixture(scope="module")
def batch():
    torch.manual_seed(0)
    task, policy, algo, _ = mu1_check.build_grpo(mu1_check.Setup(), seed=0, steps=1, mu=1, beta=0.0)
    prompts = task.train_prompts() * algo.config.prompts_per_step
    rollout, rewards = mu1_check.varied_rollout(algo, prompts, algo.config.group_size)
    return policy, rollout, group_advantages(rewards, algo.config.group_size), algo


def test_mu1_gradient_is_reinforce_gradient_and_loss_is_zero(batch):
    policy, rollout, adv, algo = batch
    r = mu1_check.reinforce_equivalence(policy, rollout, adv, algo.sampling.temperature)
    assert abs(r["loss"]) <= 1e-6
    assert r["grad_norm"] > 1e-3
    assert r["grad_rel_err"] <= 1e-5
    assert abs(r["reinforce_surrogate"]) > 1e-4  # the surrogates differ in value, not in gradient


def test_kl_term_is_zero_for_same_weights_and_beta_kl_otherwise(batch):
    policy, rollout, adv, algo = batch
    same = mu1_check.kl_term(policy, policy, rollout, adv, algo.sampling.temperature)
    assert same["mean_kl"] == 0 and abs(same["loss"]) <= 1e-6
    moved = copy.deepcopy(policy)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.005 * torch.randn_like(p))
    r = mu1_check.kl_term(moved, policy, rollout, adv, algo.sampling.temperature)
    assert r["mean_kl"] > 1e-4
    assert r["loss"] == pytest.approx(mu1_check.BETA * r["mean_kl"], rel=1e-5, abs=1e-6)


def test_token_weighted_losses_are_length_weighted_advantages(batch):
    policy, rollout, adv, algo = batch
    L = algo.sampling.max_new_tokens
    d = mu1_check.length_decomposition(policy, rollout, adv, algo.sampling.temperature, L)
    lengths = rollout.completion_mask.sum(1).float()
    by_hand = -(adv * lengths).sum().item()
    assert d["losses"]["bnpo"] == pytest.approx(by_hand / lengths.sum().item(), abs=1e-6)
    assert d["losses"]["dapo"] == pytest.approx(d["losses"]["bnpo"], abs=1e-7)
    assert d["losses"]["dr_grpo"] == pytest.approx(by_hand / (len(lengths) * L), abs=1e-6)
    assert d["bnpo_from_rows"] == pytest.approx(d["losses"]["bnpo"], abs=1e-6)
    assert abs(d["losses"]["grpo"]) <= 1e-6
    if len(d["rows"]) > 1 and abs(by_hand) > 1e-3:
        assert abs(d["losses"]["bnpo"]) > 1e-6


def test_later_iterations_of_mu2_are_not_zero():
    rows, evals, _ = mu1_check.train(mu1_check.Setup(), steps=2, seed=0, mu=2, beta=0.0, learning_rate=1e-3)
    assert all(abs(r["loss/iter1"]) <= 1e-6 for r in rows)
    assert any(abs(r["loss/iter2"]) > 1e-4 for r in rows)
    assert [e["step"] for e in evals] == [0, 2]


def _result(**training) -> dict:
    """A check result in which every verdict passes, except what ``training`` overrides."""
    return {
        "training": {"max_abs_loss": 0.0, "steps": 3, "min_grad_norm_with_variance": 1.0, "steps_with_reward_variance": 3,
                     "accuracy_before": 0.1, "accuracy_after": 0.2, **training},
        "reinforce": {"grad_rel_err": 0.0, "grad_norm": 1.0},
        "kl_step0": {"loss": 0.0, "mean_kl": 0.0},
        "kl_trained": {"loss": 0.01, "beta_kl": 0.01, "mean_kl": 0.25, "diff": 0.0},
        "lengths": {"losses": {"grpo": 0.0, "bnpo": 0.1, "dapo": 0.1, "dr_grpo": 0.05}},
        "multi": {"mu": 2, "per_iteration": [{"iteration": 1, "mean_abs_loss": 0.0, "mean_clipfrac": 0.0, "max_clipfrac": 0.0},
                                             {"iteration": 2, "mean_abs_loss": 0.01, "mean_clipfrac": 0.1, "max_clipfrac": 0.2}]},
    }


def test_verdicts_flag_a_non_zero_mu1_loss():
    assert all(ok for *_, ok in mu1_check.verdicts(_result()))
    failed = [c for c, _, ok in mu1_check.verdicts(_result(max_abs_loss=0.3)) if not ok]
    assert failed == ["1. mu=1, beta=0, grpo: |loss| <= 1e-6 at every step"]


def test_the_rising_metric_can_be_the_reward():
    """GSM8K at 135M has ~0 accuracy: the check then asks the task reward (format) to rise, and says so."""
    result = _result(accuracy_before=0.0, accuracy_after=0.0, metric="reward", metric_before=0.05, metric_after=0.04)
    failed = [(c, v) for c, v, ok in mu1_check.verdicts(result) if not ok]
    assert failed == [("1. ... and reward rises", "0.050 -> 0.040")]
    result["training"]["metric_after"] = 0.06
    assert all(ok for *_, ok in mu1_check.verdicts(result))


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--task", "nope"], ["--group-size", "1"], ["--eval-k", "2"],
                                  ["--learning-rate", "0"]])
def test_bad_input_is_one_line_exit_2(argv, capsys):
    assert main(["check", "mu1", *argv]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_the_command_line_hands_the_check_typed_settings_and_the_command_as_typed(monkeypatch):
    from benchmarks.checks import commands

    seen = []
    monkeypatch.setattr(commands, "run_mu1_check", lambda settings, command, write: seen.append((settings, command)) or 0)
    assert main(["check", "mu1", "--task", "gsm8k", "--eval-k", "2", "--readme", ""]) == 0
    assert seen == [(mu1_check.Mu1Settings(task="gsm8k", eval_k=2, readme=""),
                     "grpo-bench check mu1 --task gsm8k --eval-k 2 --readme ''")]
