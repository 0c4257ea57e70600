"""Correctness checks: our losses against TRL's (``trl``) and the other frameworks' (``references``, on ``engine`` with
the case modules of ``cases``), each a ``grpo-bench check`` command (``commands``)."""
