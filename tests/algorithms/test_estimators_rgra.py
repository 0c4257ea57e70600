"""RGRA's ablation (arXiv 2603.18756): the ``rgra_positive`` estimator, GRPO's advantages with the negative ones
set to 0, by hand: one that dropped the wrong sign, rescaled what it kept or ignored ``scale`` fails.
"""

import pytest
import torch

from algorithms.estimators import advantages


def test_rgra_positive_keeps_only_the_positive_advantages():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    # group 1 [1, 0, 0, 0]: mean 1/4, unbiased std 1/2: the success (3/4) / (1/2 + 1e-4) = 1.49970, the failures
    # -0.49990 -> 0; group 2 [1, 1, 0, 1]: the successes 0.49990, the failure -1.49970 -> 0; group 3 ties: 0
    got = advantages("rgra_positive", rewards, group_size=4)
    a, b = 0.75 / 0.5001, 0.25 / 0.5001
    assert got.tolist() == pytest.approx([a, 0, 0, 0, b, b, 0, b, 0, 0, 0, 0], rel=1e-6)
    # what it keeps is GRPO's own advantage, not rescaled
    grpo = advantages("grpo", rewards, group_size=4)
    assert torch.equal(got[grpo > 0], grpo[grpo > 0]) and bool((grpo < 0).any())
    # the scale follows ``scale``: none leaves r - mean, [1, 0, 0, 0] -> [0.75, 0, 0, 0]
    assert advantages("rgra_positive", rewards[:4], group_size=4, scale="none").tolist() == [0.75, 0.0, 0.0, 0.0]
