"""The policy losses' shape (algorithms/policy_losses.py): a plug-in loss with an option of its own is a GRPO setting
like any other, as a flag under the loss in --help, a key of a matrix cell, a field of the recorded config, and the
value its objective reads; and the loss's parts and KL column name what the loss used."""

from dataclasses import dataclass, field

import pytest
import torch

from algorithms import GRPO, GRPOConfig, Sampling
from algorithms.policy_losses import POLICY_LOSSES, LossInputs, PolicyLoss, grpo_loss, register_policy_loss

SEEN: list[float] = []


class ScaledReinforce(PolicyLoss):
    """A test loss: REINFORCE times a scale of its own, -s A log pi, token mean."""

    name, aggregation = "scaled_reinforce_test", "token-mean"

    @dataclass
    class Options:
        scaled_reinforce_scale: float = field(default=2.0, metadata={"help": "the test loss's own scale s"})

        def validate(self) -> None:
            if self.scaled_reinforce_scale <= 0:
                raise ValueError(f"scaled_reinforce_scale must be > 0, got {self.scaled_reinforce_scale}")

    def objective(self, x: LossInputs) -> torch.Tensor:
        SEEN.append(self.options.scaled_reinforce_scale)
        return -self.options.scaled_reinforce_scale * x.adv * x.logps


@pytest.fixture
def plugin():
    register_policy_loss(ScaledReinforce)
    SEEN.clear()
    yield ScaledReinforce
    del POLICY_LOSSES[ScaledReinforce.name]


def test_a_plugin_loss_option_is_a_flag_a_matrix_key_a_recorded_setting_and_what_the_loss_reads(plugin, grpo_member_option):
    config = grpo_member_option("loss_type", "scaled_reinforce_test", "scaled_reinforce_scale", 0.5,
                                refused=(-1.0, "scaled_reinforce_scale must be > 0"))
    assert config.policy_loss().options.scaled_reinforce_scale == 0.5

    # the loss reads its own value: the same batch at scale 0.5 and 1.5 gives losses in the ratio 1 : 3
    logps = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]])
    mask, adv = torch.ones(2, 2), torch.tensor([1.0, -0.5])
    half = grpo_loss(logps, None, None, adv, mask, loss_type="scaled_reinforce_test", scaled_reinforce_scale=0.5)
    three_halves = grpo_loss(logps, None, None, adv, mask, loss_type="scaled_reinforce_test", scaled_reinforce_scale=1.5)
    assert half.item() == pytest.approx(-0.5 * (-3.0 + 0.5 * 3.5) / 4) and three_halves.item() == pytest.approx(3 * half.item())
    with pytest.raises(TypeError, match="has no option sapo_temperature_pos"):
        grpo_loss(logps, None, None, adv, mask, loss_type="scaled_reinforce_test", sapo_temperature_pos=1.0)


def test_a_grpo_step_hands_the_configured_option_to_the_loss(plugin):
    from benchmarks.harness.loop import make_evaluated_task

    torch.manual_seed(0)
    task = make_evaluated_task("pizza", eval_samples=16)
    config = GRPOConfig(learning_rate=1e-3, prompts_per_step=2, group_size=4, beta=0.04, loss_type="scaled_reinforce_test",
                        scaled_reinforce_scale=0.25)
    config.validate()
    sampling = Sampling(max_new_tokens=task.generation.max_new_tokens, temperature=task.generation.temperature)
    policy = task.load_policy(torch.device("cpu"))
    metrics = GRPO(policy, task.load_policy(torch.device("cpu")), task, config, sampling, seed=0).step(["ravin likes "] * 2)
    assert SEEN == [0.25]
    # the parts add up to the loss, and the KL column names the estimator the loss used
    assert metrics["loss/policy"] + metrics["loss/kl"] == pytest.approx(metrics["loss"], abs=1e-6)
    assert "kl/k3" in metrics


def test_an_option_name_keeps_one_default_across_losses():
    class Clash(PolicyLoss):
        name = "clash_test"

        @dataclass
        class Options:
            clip_ratio_c: float = 10.0  # dual_clip's and DPPO's option, with another default

    with pytest.raises(ValueError, match="option 'clip_ratio_c' is declared by policy loss 'dual_clip' with default 3.0"):
        register_policy_loss(Clash)
    assert "clash_test" not in POLICY_LOSSES


def test_what_a_loss_needs_is_declared_not_named_in_the_pipeline():
    assert [n for n, c in POLICY_LOSSES.items() if c.takes_delta] == ["grpo", "bnpo", "dr_grpo", "dapo", "luspo"]
    assert {n for n, c in POLICY_LOSSES.items() if c.per_completion_advantages} == {"vespo", "gmpo"}
    assert [n for n, c in POLICY_LOSSES.items() if c.folds_sampling_weight] == ["vespo"]
    assert {n for n, c in POLICY_LOSSES.items() if c.clip_fraction} == {"grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo",
                                                                      "dual_clip", "clip_cov"}
    config = GRPOConfig(learning_rate=1e-3, loss_type="gmpo", advantage_estimator="optimal_token_baseline")
    with pytest.raises(ValueError, match="needs one advantage per completion"):
        config.validate()
