"""The reference frameworks, one adapter module each: ``trl`` (TRL 1.16: GRPOConfig from our settings, its loss code),
``trl_ppo`` (TRL 1.12's PPO), ``verl`` (verl 0.9.1's core_algos and rollout correction), ``openrlhf`` (OpenRLHF
0.11.2's losses and advantages), ``skyrl`` (SkyRL 0.4.0's estimators and off-policy correction), ``swift`` (ms-swift
4.6.0's GRPO loss) and ``tinker`` (Tinker's loss menu, from its documentation: a column of the feature table only);
``install`` fetches and imports them, ``features`` renders what each implements. A check, a perf bench and a LoRA
bench build TRL's config in one place; every adapter maps our names to the framework's in tables that the reference
check and the feature table both read.

Each adapter registers itself (``adapters.register_adapter``) when its module is imported; importing this package
imports them in the feature table's column order (TRL, its 1.12 PPO, verl, OpenRLHF, SkyRL, ms-swift, Tinker),
whichever one is asked for first. None of them imports its framework until a function of it runs."""

from benchmarks.references import trl, trl_ppo, verl, openrlhf, skyrl, swift, tinker  # noqa: F401,I001  in this order
