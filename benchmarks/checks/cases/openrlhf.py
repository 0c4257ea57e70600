"""OpenRLHF 0.11.2's cases: its PolicyLoss (PPO, dual-clip, GSPO; token- and sequence-level; its train/rollout
correction), compute_approx_kl, ValueLoss, and the experience maker's reward shaping, returns, whitening and
advantages (FlashREINFORCE's among them)
(benchmarks/references/openrlhf.py calls OpenRLHF's own code)."""

from __future__ import annotations

from algorithms import estimators, kl, losses
from benchmarks.checks.cases.tensors import (Grid, TensorCases, knobs, loss_pair, missing, ours_loss,
                                             sampler_corrections, token_adv, value_pair)
from benchmarks.checks.engine import register_cases
from benchmarks.references import openrlhf

CLIP_RANGES = ((0.2, None), (0.2, 0.28))
EMPTY_ROWS = ("OpenRLHF's per-sample mean leaves all-masked rows out; ours grpo (1/G) counts them as zeros; with "
              "loss_aggregation=seq-mean-token-mean ours drops them too (row above)")
GROUP_NORM_EPS = ("OpenRLHF's group_norm divides by std + 1e-9; ours by std + 1e-4 (TRL's); group_advantages(eps=1e-9) "
                  "is OpenRLHF's (next row)")
BIASED_WHITENING = ("OpenRLHF whitens GAE advantages with the biased token variance (clamped at 1e-8); PPO here uses "
                    "the unbiased one, TRL's and verl's; batch_whiten is OpenRLHF's (row above)")
# (ours, OpenRLHF's estimator, group baseline)
REINFORCE_PP = (("reinforce_plus_plus", "reinforce", False), ("reinforce_plus_plus_baseline", "reinforce_baseline", True))


def _far_clamp(what: str):
    return lambda case: (f"OpenRLHF clamps {what}; ours does not" if case == "far" else None)


def _kl_of(b):
    return kl.approx_kl(b.old_logps, b.ref_logps, "k1")


def _policy(**options):
    return lambda b: openrlhf.policy_loss(b.logps, b.old_logps, b.advantages, b.mask, **options)


def _policy_losses(grid: Grid) -> None:
    """PolicyLoss at the token level (bnpo), per sequence (grpo: all-masked rows by design), with dual-clip."""
    for eps, eps_high in CLIP_RANGES:
        kw = dict(epsilon=eps, epsilon_high=eps_high)
        names = knobs(epsilon=eps, epsilon_high=eps_high or eps)
        per_sequence = _policy(token_level_loss=False, **kw)
        grid.add("policy_loss", "bnpo", "PolicyLoss(ppo, token_level_loss=True)", names,
                 loss_pair(ours_loss("bnpo", **kw), _policy(**kw)))
        grid.add("policy_loss", "grpo(loss_aggregation=seq-mean-token-mean)", "PolicyLoss(ppo, token_level_loss=False)",
                 names, loss_pair(ours_loss("grpo", loss_aggregation="seq-mean-token-mean", **kw), per_sequence))
        grid.add("policy_loss", "grpo", "PolicyLoss(ppo, token_level_loss=False)", names,
                 loss_pair(ours_loss("grpo", **kw), per_sequence), lambda case: EMPTY_ROWS if case == "empty" else None)
        for c in (3.0, 10.0):
            grid.add("policy_loss", "dual_clip", "PolicyLoss(ppo, dual_clip)", f"{names}, clip_ratio_c={c}",
                     loss_pair(ours_loss("dual_clip", clip_ratio_c=c, **kw), _policy(dual_clip=c, **kw)))


def _ppo_and_gspo(grid: Grid) -> None:
    """PPO's clipped surrogate on per-token advantages; GSPO's sequence-level ratio."""
    for eps, eps_high in CLIP_RANGES:
        grid.add("ppo_policy_loss", "ppo_policy_loss", "PolicyLoss(ppo)", knobs(epsilon=eps, epsilon_high=eps_high or eps),
                 loss_pair(lambda b, e=eps, eh=eps_high: losses.ppo_policy_loss(b.logps, b.old_logps, token_adv(b),
                                                                                b.mask, e, eh),
                           lambda b, e=eps, eh=eps_high: openrlhf.policy_loss(b.logps, b.old_logps, token_adv(b),
                                                                              b.mask, epsilon=e, epsilon_high=eh)))
    for eps in (3e-4, 0.2):
        grid.add("policy_loss", "grpo(level=sequence)", "PolicyLoss(gspo)", knobs(epsilon=eps),
                 loss_pair(ours_loss("grpo", level="sequence", epsilon=eps, loss_aggregation="seq-mean-token-mean"),
                           _policy(epsilon=eps, policy_loss_type="gspo")))


def _kl(grid: Grid) -> None:
    """The suite's OpenRLHF estimator (approx_kl) and its KL_PENALTIES names, biased and unbiased gradient."""
    for est in ("k1", "k2", "k3"):
        clamp = None if est == "k1" else _far_clamp("every KL estimate to [-10, 10] (approx_kl is OpenRLHF's)")
        grid.add("kl", f"approx_kl({est})", f"compute_approx_kl({est})", "-",
                 loss_pair(lambda b, e=est: kl.approx_kl(b.logps, b.ref_logps, e),
                           lambda b, e=est: openrlhf.approx_kl(b.logps, b.ref_logps, e)))
        grid.add("kl", est, f"compute_approx_kl({est})", "-",
                 loss_pair(lambda b, e=est: kl.KL_PENALTIES[e](b.logps, b.ref_logps),
                           lambda b, e=est: openrlhf.approx_kl(b.logps, b.ref_logps, e)), clamp)
        grid.add("kl", f"{est}+", f"compute_approx_kl({est}, unbiased_gradient=True)", "-",
                 loss_pair(lambda b, e=est: kl.KL_PENALTIES[f"{e}+"](b.logps, b.ref_logps),
                           lambda b, e=est: openrlhf.approx_kl(b.logps, b.ref_logps, e, unbiased_gradient=True)),
                 None if est == "k1" else _far_clamp("every KL estimate to [-10, 10]"))


def _value_loss_and_rewards(grid: Grid) -> None:
    """ValueLoss (clipped and not) and compute_reward's shaping: the KL penalty and the reward clip."""
    for clip in (0.2, None):
        grid.add("value_loss", "ppo_value_loss", "ValueLoss", knobs(value_clip=clip), loss_pair(
            lambda b, c=clip: losses.ppo_value_loss(b.values, b.old_values, b.returns, b.mask, 1e12 if c is None else c),
            lambda b, c=clip: openrlhf.value_loss(b.values, b.old_values, b.returns, b.mask, c), wrt="values"))
    for coef, clip in ((0.05, (-10.0, 10.0)), (0.2, (-0.5, 0.5)), (0.05, None)):
        grid.add("kl_in_reward", "kl_penalised_rewards", "compute_reward", knobs(kl_coef=coef, reward_clip=clip),
                 value_pair(lambda b, c=coef, r=clip: losses.kl_penalised_rewards(b.rewards, _kl_of(b), b.mask, c,
                                                                                  *(r or (None, None))),
                            lambda b, c=coef, r=clip: openrlhf.compute_reward(b.rewards, c, _kl_of(b), b.mask, r)))


def _advantages(name: str, **options):
    return lambda b: openrlhf.advantages(name, b.rewards, b.mask, b.group_size, **options)[0]


def _estimators(grid: Grid) -> None:
    """The experience maker's advantages: REINFORCE++ (with the KL in the reward), RLOO, group_norm, dr_grpo and
    FlashREINFORCE (the batch mean as the baseline)."""
    for kl_coef in (0.0, 0.05):
        for name, theirs_name, baseline in REINFORCE_PP:
            grid.add("estimator", f"reinforce_pp_advantages(group_baseline={baseline})", theirs_name,
                     knobs(kl_coef=kl_coef), value_pair(
                         lambda b, bl=baseline, kc=kl_coef: losses.reinforce_pp_advantages(
                             b.rewards, _kl_of(b), b.mask, kl_coef=kc, group_size=b.group_size, group_baseline=bl)[0],
                         lambda b, n=theirs_name, kc=kl_coef: openrlhf.advantages(
                             n, b.rewards, b.mask, b.group_size, kl=_kl_of(b), kl_coef=kc)[0]))
    for name, theirs_name in (*((n, t) for n, t, _ in REINFORCE_PP), ("rloo", "rloo")):
        grid.add("estimator", name, theirs_name, "-", value_pair(
            lambda b, n=name: estimators.advantages(n, b.rewards, group_size=b.group_size, lengths=b.lengths),
            _advantages(theirs_name)))
    grid.add("estimator", "grpo", "group_norm", "scale=group",
             value_pair(lambda b: estimators.advantages("grpo", b.rewards, group_size=b.group_size),
                        _advantages("group_norm")), GROUP_NORM_EPS)
    grid.add("estimator", "group_advantages(eps=1e-9)", "group_norm", "scale=group",
             value_pair(lambda b: losses.group_advantages(b.rewards, b.group_size, "group", eps=1e-9),
                        _advantages("group_norm")))
    grid.add("estimator", "flash_reinforce", "flash_reinforce", "-", value_pair(
        lambda b: estimators.advantages("flash_reinforce", b.rewards, group_size=b.group_size),
        _advantages("flash_reinforce")), skip=missing(estimators.ADVANTAGE_ESTIMATORS, "flash_reinforce",
                                                      "advantage estimator"))
    grid.add("estimator", "grpo", "dr_grpo", "scale=none",
             value_pair(lambda b: estimators.advantages("grpo", b.rewards, group_size=b.group_size, scale="none"),
                        _advantages("dr_grpo")))


def _gae(grid: Grid) -> None:
    """GAE on the experience maker's shaped rewards: its batch whitening, ours (by design), and the returns."""
    for gamma, lam in ((1.0, 0.95), (0.99, 0.9)):
        def ours(b, g=gamma, lam_=lam):
            rewards = losses.kl_penalised_rewards(b.rewards, _kl_of(b), b.mask, 0.05, -10.0, 10.0)
            return losses.gae(rewards, b.old_values, b.mask, g, lam_)

        def theirs(b, g=gamma, lam_=lam):
            return openrlhf.advantages("gae", b.rewards, b.mask, b.group_size, kl=_kl_of(b), kl_coef=0.05,
                                       values=b.old_values, gamma=g, lambd=lam_)

        names = ("gae", knobs(gamma=gamma, lam=lam))
        advantages = lambda b, t=theirs: t(b)[0]  # noqa: E731
        grid.add("gae", "gae + batch_whiten", *names,
                 value_pair(lambda b, o=ours: losses.batch_whiten(o(b)[0], b.mask), advantages))
        grid.add("gae", "gae + masked_whiten", *names,
                 value_pair(lambda b, o=ours: losses.masked_whiten(o(b)[0], b.mask), advantages), BIASED_WHITENING)
        grid.add("gae", "gae (returns)", *names, value_pair(lambda b, o=ours: o(b)[1], lambda b, t=theirs: t(b)[1]))


# OpenRLHF's is_correction settings compared: (level, mode, gating, (low, high)); a divergence is bounded above only.
GATES = (("token", "mask", "ratio", (0.97, 1.03)), ("token", "mask", "ratio", (0.5, 5.0)),
         ("token", "clip", "ratio", (0.97, 1.03)), ("seq", "mask", "ratio", (0.99, 1.01)),
         ("token", "mask", "binary_kl", (0.0, 1e-4)), ("seq", "mask", "binary_kl", (0.0, 1e-3)),
         ("token", "mask", "tv", (0.0, 0.005)), ("seq", "mask", "tv", (0.0, 0.02)))


def _gated(grid: Grid) -> None:
    """PolicyLoss with its train/rollout correction (is_correction_level / _mode / _gating / _threshold: TIS, ICEPOP,
    the sequence mask, FlashREINFORCE's binary-KL trust region, TV) against our bnpo under importance_sampling_mode
    gated; the sampler's log-probs are the rollout's."""
    skip = missing(sampler_corrections(), "gated", "sampler correction")
    for level, mode, gating, (low, high) in GATES:
        ours = ours_loss("bnpo", with_sampling=True, importance_sampling_mode="gated", is_correction_level=level,
                         is_correction_mode=mode, is_correction_gating=gating, is_correction_threshold_low=low,
                         is_correction_threshold_high=high)
        theirs = (lambda b, lv=level, md=mode, gt=gating, th=(low, high): openrlhf.policy_loss(
            b.logps, b.old_logps, b.advantages, b.mask, rollout_logps=b.sampling_logps, level=lv, mode=md, gating=gt,
            threshold=th))
        grid.add("sampler_correction", "gated (bnpo)", "PolicyLoss(ppo, is_correction)",
                 knobs(level=level, mode=mode, gating=gating, threshold=f"{low}_{high}"), loss_pair(ours, theirs),
                 skip=skip)


def _tis_and_icepop(grid: Grid) -> None:
    """Its token-level ratio gate against TRL's token modes, which ours has: clip is TIS (token_truncate), mask is
    ICEPOP (token_mask, the survivors keep their IS weight)."""
    for mode, ours_mode in (("clip", "token_truncate"), ("mask", "token_mask")):
        for low, high in ((0.97, 1.03), (0.5, 2.0)):
            ours = ours_loss("bnpo", with_sampling=True, importance_sampling_mode=ours_mode,
                             importance_sampling_clip_min=low, importance_sampling_clip_max=high)
            theirs = (lambda b, md=mode, th=(low, high): openrlhf.policy_loss(
                b.logps, b.old_logps, b.advantages, b.mask, rollout_logps=b.sampling_logps, level="token", mode=md,
                gating="ratio", threshold=th))
            grid.add("sampler_correction", f"{ours_mode} (bnpo)", f"PolicyLoss(ppo, is_correction token {mode})",
                     knobs(clip_min=low, clip_max=high), loss_pair(ours, theirs))


@register_cases
class OpenRLHFCases(TensorCases):
    name, adapter = openrlhf.FRAMEWORK, openrlhf.OpenRLHF

    def add_configs(self, grid: Grid) -> None:
        for part in (_policy_losses, _ppo_and_gspo, _kl, _value_loss_and_rewards, _estimators, _gae, _gated,
                     _tis_and_icepop):
            part(grid)
