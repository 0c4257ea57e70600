"""Performance: one step of ours against TRL's trainer of it, side by side (``vs_trl``; its report: ``vs_trl_report``),
generation against its roof (``roof``) and one step at several revisions (``revisions``), each a ``grpo-bench bench``
command (``commands``)."""
