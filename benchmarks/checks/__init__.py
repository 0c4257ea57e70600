"""Correctness checks: our losses against TRL's (``trl``) and the other frameworks' (``references``, on ``engine`` with
the case modules of ``cases``), the GRPO step's loss on TRL's sampled batches (``same_batch``) and the mu = 1
behaviour (``mu1``), each a ``grpo-bench check`` command (``commands``)."""
