"""The KL to the reference policy, in one table: every estimator by name, per token, for every algorithm.

``KL_PENALTIES`` holds the estimators of Schulman (2020), "Approximating KL divergence", as verl's ``kl_penalty``
names them, with log r = log pi - log pi_ref: k1, k2, k3 (DeepSeekMath's and TRL's, the GRPO default), verl's
clamped k3 ("low_var_kl") and |log r| ("abs"), and each with a "+" suffix: its value with k2's gradient. GRPO
puts one in the loss (``kl_loss_type``), PPO and RLOO put k1 in the reward, ``kl_estimate`` logs any of them as
``kl/<name>``, and ``approx_kl`` is OpenRLHF's view of the table (fp32, clamped to [-10, 10]), which REINFORCE++
puts in its reward or loss.
"""

from __future__ import annotations

from typing import Callable

import torch

from algorithms.registry import lookup_named


def k3_kl(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Per-token unbiased KL estimator k3 (Schulman 2020), DeepSeekMath Eq. 4:

        KL[pi || pi_ref] ~= pi_ref/pi - log(pi_ref/pi) - 1 = exp(ref - logp) - (ref - logp) - 1  (>= 0)
    """
    delta = ref_logps - logps
    return torch.exp(delta) - delta - 1


# The KL term's estimators (Schulman 2020, "Approximating KL divergence"), per token, as verl's
# ``kl_penalty`` names them (its actor's kl_loss_type); log r = log pi - log pi_ref. "k3" is DeepSeekMath's
# and TRL's as written (``k3_kl``, the GRPO default); "low_var_kl" is verl's k3, clamped for stability.


def kl_k1(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """k1 = log r: unbiased in value, high variance, can be negative."""
    return logps - ref_logps


def kl_abs(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """|log r| (verl's "abs")."""
    return (logps - ref_logps).abs()


def kl_k2(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """k2 = (log r)^2 / 2 (verl's "mse"): biased in value, but its gradient is the KL's gradient in expectation."""
    return 0.5 * (logps - ref_logps).square()


def kl_low_var(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """verl's "low_var_kl": k3 = exp(-log r) + log r - 1 with -log r clamped to [-20, 20] and k3 to [-10, 10]."""
    delta = torch.clamp(ref_logps - logps, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(delta) - delta - 1, min=-10.0, max=10.0)


def straight_through_k2(estimator: Callable) -> Callable:
    """verl's "+" variants: the value of ``estimator``, the gradient of k2,  k2 - sg(k2) + sg(kN), because k1's
    and k3's expected gradients are not the KL's gradient while k2's is."""

    def kl(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
        k2 = kl_k2(logps, ref_logps)
        return k2 - k2.detach() + estimator(logps, ref_logps).detach()

    kl.__name__ = kl.__qualname__ = f"{estimator.__name__}_straight_through"
    kl.__doc__ = f"Value of {estimator.__name__}, gradient of k2 (``straight_through_k2``)."
    return kl


_KL_VALUES = {"k1": kl_k1, "k2": kl_k2, "k3": k3_kl, "low_var_kl": kl_low_var, "abs": kl_abs}
KL_PENALTIES: dict[str, Callable] = {**_KL_VALUES, **{f"{name}+": straight_through_k2(fn) for name, fn in _KL_VALUES.items()}}


@torch.no_grad()
def kl_estimate(name: str, logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Per-token value of the KL estimator ``name`` (a ``KL_PENALTIES`` name; a "+" variant's value is its base's),
    for logging: what a metric named ``kl/<name>`` reports."""
    return lookup_named(KL_PENALTIES, "KL estimator", name)(logps, ref_logps)


# OpenRLHF's compute_approx_kl: every estimate clamped to [-KL_CLAMP, KL_CLAMP] (``approx_kl``).
KL_CLAMP = 10.0


def k3_kl_bounded(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """k3 as OpenRLHF writes it, exp(-log r) - 1 + log r, with log r bounded below at -KL_CLAMP first: log r < -10
    already gives k3 > 10, the clamp, and bounding it keeps exp from overflowing into a 0 * inf = NaN gradient
    (OpenRLHF does the same). Not ``k3_kl`` bit for bit: the terms are added in another order."""
    bounded = (logps - ref_logps).clamp(min=-KL_CLAMP)
    return torch.exp(-bounded) - 1 + bounded


# The table's k3 in OpenRLHF's form: what ``approx_kl`` computes for "k3" (an estimator without ``bounded``: itself).
k3_kl.bounded = k3_kl_bounded

# The table's names OpenRLHF's compute_approx_kl has (its kl_estimator): REINFORCE++'s choices.
KL_ESTIMATORS = ("k1", "k2", "k3")


def approx_kl(logps: torch.Tensor, ref_logps: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token estimates of KL[pi || pi_ref] as OpenRLHF's ``compute_approx_kl`` gives them, a view of the table:
    the ``KL_PENALTIES`` estimator ``estimator`` (its ``bounded`` form where it has one: k3's) on fp32 log-probs,
    clamped to [-KL_CLAMP, KL_CLAMP]; with log r = log pi - log pi_ref:

        k1 = log r        k2 = (log r)^2 / 2        k3 = exp(-log r) - 1 + log r   (``k3_kl_bounded``)
    """
    kl = lookup_named(KL_PENALTIES, "KL estimator", estimator)
    kl = getattr(kl, "bounded", kl)
    return kl(logps.float(), ref_logps.float()).clamp(min=-KL_CLAMP, max=KL_CLAMP)
