"""One case module per reference framework, each registered with ``engine.register_cases``: verl, OpenRLHF, TRL
1.12's PPO, SkyRL and ms-swift on float64 batches (``grpo-bench check references``; what they share is ``tensors``,
their planted errors ``plants``), and TRL 1.16's trainers (``grpo-bench check trl``). Importing this package
registers them in this order, which is ``check references``'s default order of frameworks."""

from benchmarks.checks.cases import verl, openrlhf, trl_ppo, skyrl, swift, trl  # noqa: F401,I001  in this order
