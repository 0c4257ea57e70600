"""Tinker's loss menu as a column of the feature table: the losses its ``forward_backward`` offers by name and the two
sampler/trainer KL metrics of its cookbook, as its documentation (tinker-docs.thinkingmachines.ai, "Loss Functions",
and tinker-cookbook's RL metrics) describes them. Tinker runs its losses on its own service, so there is no code of
it to call here: the column is a mapping only, no row of ``grpo-bench check references`` compares it.

Every Tinker loss is a sum over a Datum's tokens (``loss:sum``); the aggregation is the client's, folded into the
advantages it sends. Its policy-gradient losses read the sampler's log-probs q as the old policy:

* ``importance_sampling``: -sum r A, r = p_theta / q (no clip);
* ``ppo``: -sum min(r A, clip(r, clip_low_threshold, clip_high_threshold) A) (the thresholds 0.8, 1.2 by default);
* ``cispo``: -sum sg(clip(r, low, high)) log p_theta A;
* ``dro``: -sum (log p_theta A - beta/2 (log p_theta - log q)^2).

Its cookbook logs ``kl_sample_train_v1`` = mean(log q - log p_train) (k1 of the sampler against the trainer) and
``kl_sample_train_v2`` = 1/2 mean((log q - log p_train)^2) (k2), over the action tokens.
"""

from __future__ import annotations

from benchmarks.references.adapters import Adapter, register_adapter

FRAMEWORK = "tinker"
# Our policy loss -> Tinker's loss_fn (its clip on r = p_theta / q, the sampler standing for the old policy).
POLICY_LOSSES = {"bnpo": "ppo (token sum; token mean through the advantages)",
                 "dapo": "ppo (loss_fn_config clip thresholds)", "cispo": "cispo"}
POLICY_LOSSES_THEIRS_ONLY = ("importance_sampling", "dro", "cross_entropy")
AGGREGATIONS = {"token-mean": "sum; the client scales the advantages"}
# Our KL estimator -> the cookbook's sampler/trainer metric of the same estimator (a metric, not a loss term).
KL = {"k1": "kl_sample_train_v1 (metric: sampler vs trainer)", "k2": "kl_sample_train_v2 (metric: sampler vs trainer)"}
KNOBS = {"epsilon": "loss_fn_config.clip_low_threshold (1 - eps)",
         "epsilon_high": "loss_fn_config.clip_high_threshold (1 + eps_high)"}


@register_adapter
class Tinker(Adapter):
    """Tinker in the feature table (from its documentation; nothing of it runs here)."""

    name, column, heading = FRAMEWORK, "Tinker", "Tinker (docs)"
    has = {"policy_losses": POLICY_LOSSES, "aggregations": AGGREGATIONS, "kl": KL}
    theirs_only = {"policy_losses": POLICY_LOSSES_THEIRS_ONLY}
    cells = {"algorithms": {"grpo": "cookbook RL loop: group-centred advantages, loss_fn=importance_sampling / ppo"}}
    options = KNOBS
    note = ("Tinker's column is its documented loss menu (loss_fn: importance_sampling, ppo, cispo, dro, "
            "cross_entropy) and its cookbook's kl_sample_train_v1/v2 metrics; its losses run on its service, so "
            "none is compared.")
    summary_note = "Tinker's column is its documented loss menu (not run)"
