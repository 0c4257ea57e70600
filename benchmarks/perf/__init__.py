"""Performance: one GRPO step of ours against TRL's GRPOTrainer, side by side (``grpo_vs_trl``; its report:
``grpo_vs_trl_report``)."""
