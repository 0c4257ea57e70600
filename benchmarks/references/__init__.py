"""The reference frameworks, one adapter module each: ``trl`` (TRL 1.16: GRPOConfig from our settings, its loss code),
``trl_ppo`` (TRL 1.12's PPO), ``verl`` (verl 0.9.1's core_algos), ``openrlhf`` (OpenRLHF 0.11.2's losses and
advantages); ``install`` fetches and imports them, ``features`` renders what each implements. A check, a perf bench
and a LoRA bench build TRL's config in one place; every adapter maps our names to the framework's in tables that
the reference check and the feature table both read."""
