"""Learning: pure losses, shared rollouts and log-probs, one small module per algorithm.

Never imports ``tasks``: an algorithm only calls a task's ``score``, ``tokenizer`` and
``train_prompts`` (and, for DPO, ``preference_pairs``).
"""

from algorithms.base import Algorithm, AlgoConfig, Sampling
from algorithms.dpo import DPO, DPOConfig
from algorithms.grpo import GRPO, GRPOConfig
from algorithms.ppo import PPO, PPOConfig
from algorithms.reinforce import REINFORCE, REINFORCEConfig

ALGORITHMS: dict[str, type[Algorithm]] = {"reinforce": REINFORCE, "ppo": PPO, "dpo": DPO, "grpo": GRPO}

__all__ = [
    "ALGORITHMS", "Algorithm", "AlgoConfig", "DPO", "DPOConfig", "GRPO", "GRPOConfig", "PPO", "PPOConfig",
    "REINFORCE", "REINFORCEConfig", "Sampling",
]
