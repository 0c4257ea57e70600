"""MaxRL (SkyRL) and FlashREINFORCE (OpenRLHF) advantage estimators, and REINFORCE's batch-mean baseline.

Every expected number is worked out by hand in the comments, so a wrong normaliser (std instead of the mean),
a wrong baseline (the group's instead of the batch's) or a missing guard fails.
"""

import pytest
import torch

from algorithms.estimators import advantages
from algorithms.reinforce import REINFORCE, REINFORCEConfig


def est(name, rewards, group_size, **kw):
    return advantages(name, torch.tensor(rewards), group_size=group_size, **kw)


def test_maxrl_normalises_by_the_group_mean():
    # group 1: [1, 0, 0, 0], mean 1/4: the success (1 - 1/4) / (1/4 + 1e-6) = 2.99998800..., failures
    #   (-1/4) / (1/4 + 1e-6) = -0.99999600...; group 2: [1, 1, 0, 1], mean 3/4: (1/4) / (3/4 + 1e-6) = 0.333332889,
    #   (-3/4) / (3/4 + 1e-6) = -0.999998667. A std normaliser (GRPO) would give 1.5 and -0.5 in group 1.
    got = est("maxrl", [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0], 4)
    want = [0.75 / 0.250001, -0.25 / 0.250001, -0.25 / 0.250001, -0.25 / 0.250001,
            0.25 / 0.750001, 0.25 / 0.750001, -0.75 / 0.750001, 0.25 / 0.750001]
    assert got.tolist() == pytest.approx(want, rel=1e-6)
    # each group's advantages sum to 0 (centred), and the rare success weighs 3x as much as the common one's
    assert got[:4].sum().item() == pytest.approx(0.0, abs=1e-6) and got[0] / got[4] == pytest.approx(9.0, rel=1e-5)


def test_maxrl_all_zero_and_tied_groups_get_zero_and_g1_the_raw_reward():
    got = est("maxrl", [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.3, 0.3, 0.3], 3)
    assert torch.equal(got, torch.zeros(9))  # mean 0 (all failures), mean 1 (all successes), a tie at 0.3
    # G = 1: SkyRL's lone completion has mean 0, so A = r itself (not 0, as a group-centred estimator would give)
    assert est("maxrl", [1.0, 0.0, 0.5], 1).tolist() == [1.0, 0.0, 0.5]


def test_flash_reinforce_subtracts_the_batch_mean_not_the_group_mean():
    # OpenRLHF's own case: [1, 0, 0, 0], batch mean 1/4 -> [0.75, -0.25, -0.25, -0.25], no whitening
    assert est("flash_reinforce", [1.0, 0.0, 0.0, 0.0], 1).tolist() == [0.75, -0.25, -0.25, -0.25]
    # with groups of 2, [1, 1 | 0, 0]: the batch mean 1/2 gives +-0.5, where a group baseline would give 0
    assert est("flash_reinforce", [1.0, 1.0, 0.0, 0.0], 2).tolist() == [0.5, 0.5, -0.5, -0.5]
    # a tied batch is 0 exactly (eight 0.3s have a float32 mean off by an ulp)
    assert torch.equal(est("flash_reinforce", [0.3] * 8, 1), torch.zeros(8))


def test_reinforce_batch_mean_baseline_is_flash_reinforce():
    algo = REINFORCE.__new__(REINFORCE)  # the advantage step alone, no model
    algo.config, algo.data_parallel, algo.baseline = REINFORCEConfig(baseline="batch_mean"), None, None
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert algo.advantages(rewards).tolist() == [0.75, -0.25, -0.25, -0.25]
    assert algo.baseline == 0.25  # the step's "baseline" metric: what was subtracted
    assert algo.advantages(torch.tensor([1.0, 1.0])).tolist() == [0.0, 0.0]  # no memory of the last batch
    assert algo.baseline == 1.0
    # the default is unchanged: a first batch centres on its own mean ...
    algo.config, algo.baseline = REINFORCEConfig(), None
    assert algo.advantages(rewards).tolist() == [0.75, -0.25, -0.25, -0.25]
    # ... and the next one on the moving average 0.9 * 0.25 + 0.1 * 0.25 = 0.25, not on its own mean 1
    assert algo.advantages(torch.tensor([1.0, 1.0])).tolist() == [0.75, 0.75]


def test_run_help_offers_the_new_estimators_and_the_batch_mean_baseline(run_cli, capsys):
    with pytest.raises(SystemExit):
        run_cli("run", "--algo", "grpo", "--help")
    out = capsys.readouterr().out
    estimators = out[out.index("--advantage-estimator {"):]
    assert "maxrl" in estimators[:400] and "flash_reinforce" in estimators[:400]
    with pytest.raises(SystemExit):
        run_cli("run", "--algo", "reinforce", "--help")
    assert "--baseline {moving_average,batch_mean,none}" in capsys.readouterr().out


def test_grpo_config_takes_the_new_estimators_by_name():
    from algorithms.grpo import GRPOConfig

    for name in ("maxrl", "flash_reinforce"):
        config = GRPOConfig(learning_rate=1e-3, advantage_estimator=name)
        config.validate()
        assert config.estimator().name == name


class _TwoRanks:
    """Rank 1 of 2 whose peer (rank 0) drew ``peer``: gather puts rank 0's rows first."""

    world_size, rank = 2, 1

    def __init__(self, peer):
        self.peer = peer

    def gather(self, tensor):
        return torch.cat([self.peer, tensor])


def test_the_batch_mean_is_the_global_batch_s_under_data_parallelism():
    # rank 0 drew [1, 1], this rank [0, 0]: the global mean is 1/2, so this rank's advantages are -1/2 (its own
    # mean would give 0, a wrong, silent no-op)
    algo = REINFORCE.__new__(REINFORCE)
    algo.config, algo.data_parallel, algo.baseline = REINFORCEConfig(baseline="batch_mean"), _TwoRanks(
        torch.tensor([1.0, 1.0])), None
    assert algo.advantages(torch.tensor([0.0, 0.0])).tolist() == [-0.5, -0.5]
    assert algo.baseline == 0.5  # the metric is the global batch's mean too

    from algorithms.grpo import GRPO, GRPOConfig

    grpo = GRPO.__new__(GRPO)
    grpo.config, grpo.data_parallel = GRPOConfig(group_size=2, advantage_estimator="flash_reinforce"), _TwoRanks(
        torch.tensor([1.0, 1.0]))
    assert grpo.advantages(grpo.config.estimator(), torch.tensor([0.0, 0.0])).tolist() == [-0.5, -0.5]
