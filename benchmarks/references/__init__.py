"""The reference frameworks, one adapter module each: ``trl`` (TRL 1.16: GRPOConfig from our settings, its loss code),
``trl_ppo`` (TRL 1.12's PPO), ``verl`` (verl 0.9.1's core_algos), ``openrlhf`` (OpenRLHF 0.11.2's losses and
advantages); ``install`` fetches and imports them, ``features`` renders what each implements. A check, a perf bench
and a LoRA bench build TRL's config in one place; every adapter maps our names to the framework's in tables that
the reference check and the feature table both read.

Each adapter registers itself (``adapters.register_adapter``) when its module is imported; importing this package
imports them in the feature table's column order (TRL, its 1.12 PPO, verl, OpenRLHF), whichever one is asked for
first. None of them imports its framework until a function of it runs."""

from benchmarks.references import trl, trl_ppo, verl, openrlhf  # noqa: F401,I001  registers them, in this order
