"""The policy losses' shape (algorithms/policy_losses.py): a plug-in loss with an option of its own is a GRPO setting
like any other, as a flag under the loss in --help, a key of a matrix cell, a field of the recorded config, and the
value its objective reads; and the loss's parts and KL column name what the loss used. What the pipeline passes is
declared, not named: every setting of the loss reaches the loss a step computes (``GRPOConfig.loss()``), and an
aggregation declared ``token_mean`` gets the data-parallel token count."""

from dataclasses import dataclass, field, fields

import pytest
import torch

from algorithms import GRPO, GRPOConfig, Sampling
from algorithms.policy_losses import (
    LOSS_AGGREGATIONS, POLICY_LOSSES, GRPOLoss, LossInputs, PolicyLoss, register_aggregation, register_policy_loss,
)

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

    def loss(**options):
        return GRPOConfig(loss_type="scaled_reinforce_test", beta=0.0, **options).loss()(logps, None, None, adv, mask)

    half, three_halves = loss(scaled_reinforce_scale=0.5), loss(scaled_reinforce_scale=1.5)
    assert half.item() == pytest.approx(-0.5 * (-3.0 + 0.5 * 3.5) / 4) and three_halves.item() == pytest.approx(3 * half.item())
    # another loss's option is that loss's: this one keeps its own default (s = 2)
    assert loss(sapo_temperature_pos=3.0).item() == pytest.approx(4 * half.item())


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
    takes_delta = ["grpo", "bnpo", "dr_grpo", "dapo", "luspo", "fipo"]
    assert [n for n, c in POLICY_LOSSES.items() if c.takes_delta] == takes_delta
    assert {n for n, c in POLICY_LOSSES.items() if c.per_completion_advantages} == {"vespo", "gmpo", "real"}
    assert [n for n, c in POLICY_LOSSES.items() if c.folds_sampling_weight] == ["vespo"]
    assert {n for n, c in POLICY_LOSSES.items() if c.clip_fraction} == {"grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo",
                                                                      "dual_clip", "clip_cov", "fipo"}
    config = GRPOConfig(learning_rate=1e-3, loss_type="gmpo", advantage_estimator="optimal_token_baseline")
    with pytest.raises(ValueError, match="needs one advantage per completion"):
        config.validate()
    assert [n for n, aggregate in LOSS_AGGREGATIONS.items() if aggregate.token_mean] == ["bnpo", "dapo", "token-mean"]


def _grpo_step(monkeypatch, **options) -> tuple[GRPO, list[tuple[GRPOLoss, dict]]]:
    """One GRPO step on pizza at ``options``, with a data-parallel token count of 123: the algorithm, and the loss
    and the keyword arguments of each loss call it made."""
    from benchmarks.harness.loop import make_evaluated_task

    torch.manual_seed(0)
    task = make_evaluated_task("pizza", eval_samples=16)
    config = GRPOConfig(**{"learning_rate": 1e-3, "prompts_per_step": 2, "group_size": 4, **options})
    config.validate()
    sampling = Sampling(max_new_tokens=task.generation.max_new_tokens, temperature=task.generation.temperature)
    ref = task.load_policy(torch.device("cpu")) if config.beta > 0 else None
    algo = GRPO(task.load_policy(torch.device("cpu")), ref, task, config, sampling, seed=0)
    algo.data_parallel_token_count = lambda mask: 123.0
    calls = []
    call = GRPOLoss.__call__
    monkeypatch.setattr(GRPOLoss, "__call__", lambda self, *args, **kwargs: calls.append((self, kwargs)) or
                        call(self, *args, **kwargs))
    algo.step(["ravin likes "] * 2)
    return algo, calls


def test_every_setting_of_the_loss_reaches_the_loss_a_step_computes(monkeypatch):
    """Every field of the configured loss but four is the GRPO setting of the same name, and a step's loss holds the
    config's value (each set here to another value than its default); the four are the members and the aggregation
    those settings pick, and the sampling limit."""
    values = dict(level="sequence", epsilon=0.3, epsilon_high=0.31, delta=2.0, beta=0.0, kl_bias_correction=True,
                  top_entropy_quantile=0.9, off_policy_mask_threshold=0.5, importance_sampling_correction=False,
                  importance_sampling_clip_min=0.1, importance_sampling_clip_max=4.0, kl_loss_type="k2",
                  entropy_coef=0.01, group_size=4)
    picks = dict(loss_type="bnpo", importance_sampling_mode="token_mask", loss_aggregation="seq-mean-token-sum")
    assert {f.name for f in fields(GRPOLoss)} == set(values) | {"policy", "correction", "aggregation",
                                                                "max_completion_length"}
    defaults = {f.name: f.default for f in fields(GRPOConfig)}
    assert all(value != defaults[name] for name, value in {**values, **picks}.items())
    algo, ((loss, _),) = _grpo_step(monkeypatch, **values, **picks)
    assert {name: getattr(loss, name) for name in values} == values
    assert (loss.policy.name, loss.correction.name, loss.aggregation) == tuple(picks.values())
    assert loss.max_completion_length == algo.sampling.max_new_tokens


@pytest.fixture
def plugin_aggregations():
    seen = {}

    @register_aggregation("token_mean_test", token_mean=True)
    def token_mean(per_token, mask, max_len, n_items):
        seen["token_mean_test"] = n_items
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)

    @register_aggregation("sum_test")
    def summed(per_token, mask, max_len, n_items):
        seen["sum_test"] = n_items
        return (per_token * mask).sum()

    yield seen
    del LOSS_AGGREGATIONS["token_mean_test"], LOSS_AGGREGATIONS["sum_test"]


@pytest.mark.parametrize("aggregation, count", [("token_mean_test", 123.0), ("sum_test", None)])
def test_an_aggregation_declared_token_mean_gets_the_data_parallel_token_count(monkeypatch, plugin_aggregations,
                                                                               aggregation, count):
    _, ((_, kwargs),) = _grpo_step(monkeypatch, beta=0.0, loss_aggregation=aggregation)
    assert kwargs["num_items_in_batch"] == count and plugin_aggregations[aggregation] == count


def test_an_aggregation_name_and_its_declaration_are_kept(plugin_aggregations):
    with pytest.raises(ValueError, match="loss aggregation name 'dapo' is taken by algorithms.policy_losses._aggregate_dapo"):
        register_aggregation("dapo")(LOSS_AGGREGATIONS["sum_test"])
    register_aggregation("token-mean", token_mean=True)(LOSS_AGGREGATIONS["bnpo"])  # the same again: a no-op
    with pytest.raises(ValueError, match="another token_mean needs another function"):
        register_aggregation("bnpo_summed")(LOSS_AGGREGATIONS["bnpo"])
    assert "bnpo_summed" not in LOSS_AGGREGATIONS
