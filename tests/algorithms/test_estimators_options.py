"""The advantage estimators' shape (algorithms/estimators.py), as the policy losses': a plug-in estimator with an option
of its own is a GRPO setting like any other, as a flag under the estimator in --help, a key of a matrix cell, a field
of the recorded config, and the value its method reads in a GRPO step; what an estimator needs is declared, and GRPO
passes what it declares; a taken name and a second default for an option name are refused."""

from dataclasses import dataclass, field

import pytest
import torch

from algorithms import GRPO, GRPOConfig, Sampling
from algorithms.estimators import (
    ADVANTAGE_ESTIMATORS, AdvantageEstimator, EstimatorInputs, advantages, register_advantage_estimator,
)
from benchmarks.store import same_experiment_spec

SEEN: list[dict] = []


class ScaledCentred(AdvantageEstimator):
    """A test estimator: the group-centred reward times a scale of its own, A_i = s (r_i - mean(r_group))."""

    name = "scaled_centred_test"

    @dataclass
    class Options:
        scaled_centred_scale: float = field(default=2.0, metadata={"help": "the test estimator's own scale s"})

        def validate(self) -> None:
            if self.scaled_centred_scale <= 0:
                raise ValueError(f"scaled_centred_scale must be > 0, got {self.scaled_centred_scale}")

    def advantages(self, x: EstimatorInputs) -> torch.Tensor:
        SEEN.append({"scale": self.options.scaled_centred_scale, "mask": x.mask, "baseline_rewards": x.baseline_rewards})
        grouped = x.rewards.view(-1, x.group_size)
        return (self.options.scaled_centred_scale * (grouped - grouped.mean(1, keepdim=True))).view(-1)


class TokenCounter(AdvantageEstimator):
    """A test per-token estimator: r_i on each of its tokens, weighted by pi_old of the token; records what it got."""

    name, needs_token_statistics = "token_counter_test", True

    def advantages(self, x: EstimatorInputs) -> torch.Tensor:
        SEEN.append({"mask": x.mask, "old_logps": x.old_logps, "sum_pi_squared": x.sum_pi_squared, "rewards": x.rewards})
        return x.rewards.unsqueeze(1) * torch.exp(x.old_logps) * x.mask


@pytest.fixture
def plugins():
    saved = dict(ADVANTAGE_ESTIMATORS)
    register_advantage_estimator(ScaledCentred)
    register_advantage_estimator(TokenCounter)
    SEEN.clear()
    yield
    ADVANTAGE_ESTIMATORS.clear()
    ADVANTAGE_ESTIMATORS.update(saved)


def _grpo(**options) -> GRPO:
    from benchmarks.harness.loop import make_evaluated_task

    torch.manual_seed(0)
    task = make_evaluated_task("pizza", eval_samples=16)
    config = GRPOConfig(learning_rate=1e-3, prompts_per_step=2, group_size=4, beta=0.0, **options)
    config.validate()
    sampling = Sampling(max_new_tokens=task.generation.max_new_tokens, temperature=task.generation.temperature)
    return GRPO(task.load_policy(torch.device("cpu")), None, task, config, sampling, seed=0)


def test_a_plugin_estimator_option_is_a_flag_a_matrix_key_a_recorded_setting(plugins, grpo_member_option):
    config = grpo_member_option("advantage_estimator", "scaled_centred_test", "scaled_centred_scale", 0.5,
                                refused=(-1.0, "scaled_centred_scale must be > 0"))
    assert config.estimator().options.scaled_centred_scale == 0.5
    # the built-in one's: optimal_token_baseline's handle_zero_tail (verl's knob)
    config = grpo_member_option("advantage_estimator", "optimal_token_baseline", "handle_zero_tail", False)
    assert config.estimator().options.handle_zero_tail is False

    # the estimator reads its own value: the same rewards at 0.5 and 1.5 give advantages in the ratio 1 : 3
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5])
    half = advantages("scaled_centred_test", rewards, group_size=2, scaled_centred_scale=0.5)
    assert half.tolist() == [0.25, -0.25, 0.0, 0.0]
    assert torch.equal(advantages("scaled_centred_test", rewards, group_size=2, scaled_centred_scale=1.5), 3 * half)
    with pytest.raises(TypeError, match="advantage_estimator 'scaled_centred_test' has no option handle_zero_tail"):
        advantages("scaled_centred_test", rewards, group_size=2, handle_zero_tail=False)


def test_a_grpo_step_hands_the_configured_option_to_the_estimator(plugins):
    metrics = _grpo(advantage_estimator="scaled_centred_test", scaled_centred_scale=0.25).step(["ravin likes "] * 2)
    (seen,) = SEEN
    assert seen["scale"] == 0.25
    assert seen["mask"] is None and seen["baseline_rewards"] is None  # it declares neither need: GRPO passes neither
    assert metrics["skipped_update"] in (0.0, 1.0) and "advantage/mean" in metrics


def test_what_an_estimator_declares_is_what_grpo_passes(plugins):
    algo = _grpo(advantage_estimator="token_counter_test", mu=2)
    metrics = algo.step(["ravin likes "] * 2)
    (seen,) = SEEN  # one call per step, before the updates
    B = 8
    assert seen["rewards"].shape == (B,)
    width = seen["mask"].size(1)
    for name in ("mask", "old_logps", "sum_pi_squared"):
        assert seen[name].shape == (B, width), name
    assert bool((seen["sum_pi_squared"] > 0).all()) and bool((seen["old_logps"] <= 0).all())
    assert metrics["advantage/mean"] == pytest.approx(
        (seen["rewards"].unsqueeze(1) * torch.exp(seen["old_logps"]) * seen["mask"]).mean().item(), rel=1e-6)
    # a per-token estimator with a loss that reads one advantage per completion is refused, as the built-in one
    with pytest.raises(ValueError, match="gives one per token"):
        GRPOConfig(learning_rate=1e-3, advantage_estimator="token_counter_test", loss_type="gmpo").validate()


def test_a_plain_function_gets_what_its_registration_declares(plugins):
    got = {}

    @register_advantage_estimator("greedy_gap_test", needs_greedy_baseline=True)
    def greedy_gap(rewards, *, baseline_rewards, **rest):
        got["rest"] = sorted(rest)
        return rewards - baseline_rewards

    assert ADVANTAGE_ESTIMATORS["greedy_gap_test"].needs_greedy_baseline
    _grpo(advantage_estimator="greedy_gap_test").step(["ravin likes "] * 2)
    assert got["rest"] == ["group_size", "lengths", "scale"]  # no token statistics: it did not ask for them
    register_advantage_estimator(greedy_gap, name="greedy_gap_test")  # an entry point naming it again: a no-op
    with pytest.raises(ValueError, match="another needs_greedy_baseline needs another name"):
        register_advantage_estimator(greedy_gap, name="greedy_gap_test", needs_greedy_baseline=False)


def test_the_needs_are_declared_not_named(plugins):
    declared = lambda prop: [n for n, c in ADVANTAGE_ESTIMATORS.items() if getattr(c, prop)]  # noqa: E731
    assert declared("needs_greedy_baseline") == ["remax"]
    assert declared("needs_token_statistics") == ["optimal_token_baseline", "token_counter_test"]
    assert declared("group_local") == ["grpo", "optimal_token_baseline", "maxrl"]


def test_a_taken_name_and_a_second_default_are_refused(plugins):
    class Other(ScaledCentred):
        name = "grpo"

    with pytest.raises(ValueError, match="advantage estimator name 'grpo' is taken by algorithms.estimators.GRPOEstimator"):
        register_advantage_estimator(Other)
    with pytest.raises(ValueError, match="advantage estimator name 'scaled_centred_test' is taken by"):
        register_advantage_estimator(lambda rewards, **_: rewards, name="scaled_centred_test")
    with pytest.raises(ValueError, match="ScaledCentred is named 'scaled_centred_test', not 'other'"):
        register_advantage_estimator(ScaledCentred, name="other")
    register_advantage_estimator(ScaledCentred)  # the same class again: a no-op

    class Clash(AdvantageEstimator):
        name = "clash_test"

        @dataclass
        class Options:
            handle_zero_tail: bool = False  # optimal_token_baseline's option, with another default

    with pytest.raises(ValueError, match="option 'handle_zero_tail' is declared by advantage estimator "
                                         "'optimal_token_baseline' with default True"):
        register_advantage_estimator(Clash)
    assert "clash_test" not in ADVANTAGE_ESTIMATORS


def test_handle_zero_tail_is_a_setting_that_stored_cells_ran_at():
    assert GRPOConfig().estimator_options == {"handle_zero_tail": True}
    # a cell stored before the option was a setting ran with it on: the same experiment as a planned cell at True
    stored = {"algo": "grpo", "settings": {"advantage_estimator": "optimal_token_baseline"}}
    planned = {"algo": "grpo", "settings": {"advantage_estimator": "optimal_token_baseline", "handle_zero_tail": True}}
    assert same_experiment_spec(stored, planned)
    assert not same_experiment_spec(stored, {**planned, "settings": {**planned["settings"], "handle_zero_tail": False}})


def test_an_estimator_option_named_as_a_loss_option_or_a_shared_setting_is_refused_where_settings_are_read(plugins):
    """One flat name, two meanings (an estimator's option named as a GRPO field or a loss's option): which one a
    flag or a matrix key would set is a guess, so reading GRPO's settings refuses it, naming both holders."""
    from algorithms.base import config_fields

    class TakesBeta(AdvantageEstimator):
        name = "takes_beta_test"

        @dataclass
        class Options:
            beta: float = 0.5  # GRPOConfig's own KL coefficient

    class TakesLossOption(AdvantageEstimator):
        name = "takes_loss_option_test"

        @dataclass
        class Options:
            clip_ratio_c: float = 3.0  # the dual-clip loss's option

    assert "beta" in config_fields(GRPOConfig) and "clip_ratio_c" in config_fields(GRPOConfig)
    for plugin, name in ((TakesBeta, "beta"), (TakesLossOption, "clip_ratio_c")):
        register_advantage_estimator(plugin)
        with pytest.raises(TypeError, match=f"GRPOConfig: the setting '{name}' is declared by both"):
            config_fields(GRPOConfig)
        del ADVANTAGE_ESTIMATORS[plugin.name]
    assert "beta" in config_fields(GRPOConfig)  # without the plug-ins, the settings read again
