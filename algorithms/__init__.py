"""Learning: pure losses, shared rollouts and log-probs, one small module per algorithm.

Never imports ``tasks``: an algorithm only calls a task's ``score``, ``tokenizer`` and
``train_prompts`` (and, for DPO, ``preference_pairs``).
"""

from algorithms.base import Algorithm, AlgoConfig, Sampling
from algorithms.grpo import GRPO, GRPOConfig

ALGORITHMS: dict[str, type[Algorithm]] = {"grpo": GRPO}

__all__ = ["ALGORITHMS", "Algorithm", "AlgoConfig", "GRPO", "GRPOConfig", "Sampling"]
