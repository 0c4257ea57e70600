"""Correctness checks: our losses against TRL's (``trl``), the mu = 1 behaviour (``mu1``), TRL's GRPOTrainer end to end (``trl_train``)."""
