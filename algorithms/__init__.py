"""Learning: pure losses, shared rollouts and log-probs, one small module per algorithm.

Never imports ``tasks``: an algorithm only calls a task's ``score``, ``tokenizer`` and
``train_prompts`` (and, for DPO, ``preference_pairs``). Each algorithm registers itself by name with
``@register_algorithm`` where it is defined; importing this package registers the built-in ones.
"""

from algorithms.base import ALGORITHMS, Algorithm, AlgoConfig, Sampling, algorithm_class, register_algorithm
from algorithms.dpo import DPO, DPOConfig
from algorithms.estimators import ADVANTAGE_ESTIMATORS, AdvantageEstimator, advantage_estimator, register_advantage_estimator
from algorithms.grpo import GRPO, GRPOConfig
from algorithms.policy_losses import POLICY_LOSSES, PolicyLoss, policy_loss, register_policy_loss
from algorithms.ppo import PPO, PPOConfig
from algorithms.reinforce import REINFORCE, REINFORCEConfig
from algorithms.reinforce_pp import REINFORCEPP, REINFORCEPPConfig
from algorithms.rloo import RLOO, RLOOConfig

__all__ = [
    "ADVANTAGE_ESTIMATORS", "ALGORITHMS", "AdvantageEstimator", "Algorithm", "AlgoConfig", "DPO", "DPOConfig", "GRPO", "GRPOConfig", "PPO", "PPOConfig",
    "POLICY_LOSSES", "PolicyLoss", "REINFORCE", "REINFORCEConfig", "REINFORCEPP", "REINFORCEPPConfig", "RLOO", "RLOOConfig", "Sampling",
    "advantage_estimator", "algorithm_class", "policy_loss", "register_advantage_estimator", "register_algorithm",
    "register_policy_loss",
]
