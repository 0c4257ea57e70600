"""Performance: one step of ours against TRL's trainer of it, side by side (``vs_trl``; its report: ``vs_trl_report``)
and generation against its roof (``roof``), each a ``grpo-bench bench`` command (``commands``)."""
