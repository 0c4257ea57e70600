"""GRPO: Group Relative Policy Optimization (Shao et al. 2024, "DeepSeekMath", Sec. 4, Eq. 21).

No critic: each prompt gets G completions, and a completion's advantage is its reward standardised
within its group. The defaults are GRPO as the paper defines it: token-level ratios, per-completion
mean then mean over completions (loss_type "grpo"), epsilon 0.2, beta 0.04 with the k3 estimator,
group-std scaling. The variants are options, not defaults: GSPO's sequence-level ratio; the bnpo /
dr_grpo / dapo / luspo aggregations and the cispo / sapo / vespo objectives (TRL 1.16's loss types);
clip-higher and two-sided clipping; Dr. GRPO's unscaled advantages; DAPO's overlong masking, overlong
reward shaping and dynamic sampling; training on high-entropy tokens only; DeepSeek-V3.2's off-policy
sequence mask; truncated importance sampling against the sampler's own log-probs when the sampler
runs at another precision than the update; and verl's registered variants: advantage estimators
(``advantage_estimator``: rloo, reinforce_plus_plus(_baseline), remax, gpg, opo, grpo_passk, and the
per-token optimal_token_baseline; algorithms/estimators.py), policy losses (``loss_type``: dual_clip, gmpo,
clip_cov, kl_cov, dppo_tv, dppo_kl), its loss aggregations (``loss_aggregation``) and KL estimators
(``kl_loss_type``); and an entropy bonus (``entropy_coef``, TRL's, verl's and OpenRLHF's knob; off in the paper).
From the 2026 frameworks: SkyRL's maxrl and OpenRLHF's flash_reinforce estimators, ms-swift's real and fipo
losses, and the sampler corrections (``importance_sampling_mode``, algorithms/sampler_corrections.py: SkyRL's
geometric-mean and outlier-token masks, OpenRLHF's gate, verl's bypass). Plug-ins add estimators and policy
losses by name.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Optional

import torch

from algorithms import rollout as rollout_lib
from algorithms.base import Algorithm, AlgoConfig, OptionGroup, init_config, register_algorithm
from algorithms.diagnostics import sampler_mismatch
from algorithms.estimators import ADVANTAGE_ESTIMATORS, AdvantageEstimator, EstimatorInputs, advantage_estimator
from algorithms.kl import KL_PENALTIES
from algorithms.losses import ADVANTAGE_SCALES, carries_signal, masked_mean_per_sequence, overlong_penalty
from algorithms.policy_losses import GRPO_LEVELS, LOSS_AGGREGATIONS, POLICY_LOSSES, GRPOLoss, policy_loss
from algorithms.sampler_corrections import SAMPLER_CORRECTIONS, sampler_correction

SAMPLING_PRECISIONS = ("same", "fp32", "bf16", "int8")
# Every registered policy loss's own options (algorithms/policy_losses.py): settings of GRPO like its fields.
POLICY_LOSS_OPTIONS = OptionGroup("loss_type", lambda: {name: cls.Options for name, cls in POLICY_LOSSES.items()})
# Every registered advantage estimator's own options (algorithms/estimators.py), likewise.
ESTIMATOR_OPTIONS = OptionGroup("advantage_estimator",
                                lambda: {name: cls.Options for name, cls in ADVANTAGE_ESTIMATORS.items()})
# Every registered sampler correction's own options (algorithms/sampler_corrections.py), likewise.
CORRECTION_OPTIONS = OptionGroup("importance_sampling_mode",
                                 lambda: {name: cls.Options for name, cls in SAMPLER_CORRECTIONS.items()})


# Every setting of the loss is a field here, its default stated once: a knob every policy loss shares is one field, a
# loss's own knobs are its ``Options`` (POLICY_LOSS_OPTIONS). ``loss()`` hands them to the loss, configured.
@dataclass(init=False)
class GRPOConfig(AlgoConfig):
    group_size: int = field(default=8, metadata={"help": "G, completions per prompt (>= 2; the paper uses 64)"})
    mu: int = field(default=1, metadata={"help": "policy updates per generation batch (TRL's num_iterations)"})
    level: str = field(default="token", metadata={"help": "importance ratio per token, or per sequence (GSPO; TRL's importance_sampling_level)", "choices": GRPO_LEVELS})
    # The two registries' choices are live views: a plug-in registered before the parser is built is a choice.
    advantage_estimator: str = field(default="grpo", metadata={"help": "advantage estimator, by its registered name (algorithms/estimators.py): grpo (paper: group-standardised), rloo, reinforce_plus_plus(_baseline), remax (greedy-completion baseline), gpg, opo, grpo_passk, optimal_token_baseline (verl's per-token baseline; an extra no-grad forward per step), maxrl (SkyRL: divided by the group mean), flash_reinforce (OpenRLHF: minus the batch mean); plug-ins. scale_rewards applies to grpo and grpo_passk", "choices": ADVANTAGE_ESTIMATORS.keys()})
    loss_type: str = field(default="grpo", metadata={"help": "policy loss, by its registered name: grpo (paper), bnpo, dr_grpo, dapo, cispo (MiniMax-M1), sapo (Qwen SAPO), luspo (LUSPO; use level sequence), vespo (VESPO): TRL 1.16's loss types; dual_clip, gmpo (epsilon is a log-ratio bound; paper: 0.4), clip_cov, kl_cov, dppo_tv, dppo_kl (epsilon, epsilon_high are divergence bounds; clip_ratio_c truncates the IS weight): verl's; real (group ranking loss), fipo (future-KL weighted clip): ms-swift's; plug-ins", "choices": POLICY_LOSSES.keys()})
    loss_aggregation: Optional[str] = field(default=None, metadata={"help": "replace the loss type's aggregation: grpo, bnpo, dr_grpo, dapo, luspo, or verl's token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm (default: the loss type's own)", "choices": tuple(LOSS_AGGREGATIONS)})
    kl_loss_type: str = field(default="k3", metadata={"help": "KL term's estimator (verl's kl_loss_type): k1, k2, k3 (paper), low_var_kl (verl's clamped k3), abs; a '+' suffix keeps the value with k2's gradient", "choices": tuple(KL_PENALTIES)})
    entropy_coef: float = field(default=0.0, metadata={"help": "entropy bonus: loss -= coef * mean entropy of the trained tokens (TRL's entropy_coef, verl's entropy_coeff; off in the paper; typical 1e-3)"})
    epsilon: float = field(default=0.2, metadata={"help": "lower clip range 1 - epsilon (PPO/GRPO: 0.2)"})
    epsilon_high: Optional[float] = field(default=None, metadata={"help": "upper clip range 1 + epsilon_high (default epsilon; DAPO: 0.28); cispo: the IS-weight cap itself (ScaleRL: 5.0)"})
    delta: Optional[float] = field(default=None, metadata={"help": "two-sided clipping: also cap the unclipped ratio at delta (INTELLECT-2; TRL default off; > 1 + epsilon_high)"})
    beta: float = field(default=0.04, metadata={"help": "k3 KL penalty weight to the reference (paper: 0.04; 0 skips the reference)"})
    scale_rewards: str = field(default="group", metadata={"help": "advantage scale: group std (paper), batch std, none (Dr. GRPO)", "choices": ADVANTAGE_SCALES})
    advantage_clip: Optional[float] = field(default=None, metadata={"help": "clip advantages to +/- this (the seed notebook: 2.0)"})
    kl_bias_correction: bool = field(default=False, metadata={"help": "weight the KL term by the importance ratio (TRL's use_bias_correction_kl; off in the paper)"})
    mask_truncated: bool = field(default=False, metadata={"help": "drop completions without EOS from the loss (DAPO overlong filtering)"})
    top_entropy_quantile: float = field(default=1.0, metadata={"help": "train on the top rho share of tokens by entropy (Beyond the 80/20 rule: 0.2; TRL default 1.0: all)"})
    off_policy_mask_threshold: Optional[float] = field(default=None, metadata={"help": "drop A < 0 completions whose mean sampler-to-policy KL exceeds this (DeepSeek-V3.2 Eq. 9; TRL default off)"})
    sampling_precision: str = field(default="same", metadata={"help": "precision of sampling; fp32, bf16 or int8 (W8A8, CPU, Llama policies) also records the sampler's log-probs for mismatch metrics and IS correction", "choices": SAMPLING_PRECISIONS})
    importance_sampling_correction: bool = field(default=True, metadata={"help": "weight the loss by the trainer/sampler IS ratio when the sampler's log-probs are recorded (TRL's vllm_importance_sampling_correction: on)"})
    importance_sampling_mode: str = field(default="sequence_mask", metadata={"help": "sampler correction, by its registered name (algorithms/sampler_corrections.py): token_truncate, token_mask, sequence_truncate, sequence_mask (TRL's vllm_importance_sampling_mode: sequence_mask; bounds importance_sampling_clip_min/max); sequence_geometric_mask, sequence_outlier_mask (SkyRL; verl's Geo-RS); gated (OpenRLHF's is_correction_*); bypass (verl: the sampler's log-probs as the old policy's, no weight)", "choices": SAMPLER_CORRECTIONS.keys()})
    importance_sampling_clip_min: Optional[float] = field(default=None, metadata={"help": "IS ratio lower bound C_min (TRL's vllm_importance_sampling_clip_min: none)"})
    importance_sampling_clip_max: Optional[float] = field(default=3.0, metadata={"help": "IS ratio upper bound C_max (TRL's vllm_importance_sampling_clip_max: 3.0)"})
    dynamic_sampling: bool = field(default=False, metadata={"help": "DAPO dynamic sampling: drop groups whose rewards all tie, sample more until prompts_per_step groups remain"})
    dynamic_sampling_max_rounds: int = field(default=10, metadata={"help": "generation rounds per step before training on what is kept (verl's DAPO recipe max_num_gen_batches: 10)"})
    overlong_buffer_len: int = field(default=0, metadata={"help": "DAPO overlong reward shaping: linear penalty over the last L_cache tokens before the limit (0: off; DAPO: 4096 of 20480)"})
    overlong_penalty_factor: float = field(default=1.0, metadata={"help": "DAPO overlong penalty at the length limit (DAPO, verl: 1.0)"})
    loss_options: dict = field(default_factory=dict, metadata={"option_group": POLICY_LOSS_OPTIONS})
    estimator_options: dict = field(default_factory=dict, metadata={"option_group": ESTIMATOR_OPTIONS})
    correction_options: dict = field(default_factory=dict, metadata={"option_group": CORRECTION_OPTIONS})

    def __init__(self, **settings):
        init_config(self, settings)

    def loss(self, max_completion_length: Optional[int] = None) -> GRPOLoss:
        """GRPO's loss at these settings (algorithms/policy_losses.py), its members with their options;
        ``max_completion_length`` the sampling limit (the normaliser of dr_grpo and seq-mean-token-sum-norm)."""
        policy = self.policy_loss()
        return GRPOLoss(
            policy=policy, correction=self.sampler_correction(), aggregation=self.loss_aggregation or policy.aggregation,
            level=self.level, epsilon=self.epsilon, epsilon_high=self.epsilon_high, delta=self.delta, beta=self.beta,
            kl_loss_type=self.kl_loss_type, kl_bias_correction=self.kl_bias_correction, entropy_coef=self.entropy_coef,
            top_entropy_quantile=self.top_entropy_quantile, off_policy_mask_threshold=self.off_policy_mask_threshold,
            importance_sampling_correction=self.importance_sampling_correction,
            importance_sampling_clip_min=self.importance_sampling_clip_min,
            importance_sampling_clip_max=self.importance_sampling_clip_max,
            group_size=self.group_size, max_completion_length=max_completion_length)

    def policy_loss(self):
        """The configured policy loss, with its options."""
        return policy_loss(self.loss_type).from_settings(self.loss_options)

    def estimator(self):
        """The configured advantage estimator, with its options."""
        return advantage_estimator(self.advantage_estimator).from_settings(self.estimator_options)

    def sampler_correction(self):
        """The configured sampler correction, with its options."""
        return sampler_correction(self.importance_sampling_mode).from_settings(self.correction_options)

    def validate(self) -> None:
        super().validate()
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 for group-relative advantages, got {self.group_size}")
        if self.mu < 1:
            raise ValueError(f"mu must be >= 1, got {self.mu}")
        for name, choices in (("level", GRPO_LEVELS), ("loss_type", POLICY_LOSSES), ("scale_rewards", ADVANTAGE_SCALES),
                              ("sampling_precision", SAMPLING_PRECISIONS),
                              ("importance_sampling_mode", SAMPLER_CORRECTIONS),
                              ("advantage_estimator", ADVANTAGE_ESTIMATORS), ("kl_loss_type", KL_PENALTIES)):
            if getattr(self, name) not in choices:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; choose from {', '.join(choices)}")
        if self.loss_aggregation is not None and self.loss_aggregation not in LOSS_AGGREGATIONS:
            raise ValueError(f"unknown loss_aggregation {self.loss_aggregation!r}; choose from {', '.join(LOSS_AGGREGATIONS)}")
        # every loss's and estimator's options, as every field is checked whatever it is used for
        for members, options in ((POLICY_LOSSES, self.loss_options), (ADVANTAGE_ESTIMATORS, self.estimator_options),
                                 (SAMPLER_CORRECTIONS, self.correction_options)):
            for member in members.values():
                member.from_settings(options).options.validate()
        for name in ("epsilon", "epsilon_high", "beta", "advantage_clip", "delta", "off_policy_mask_threshold", "entropy_coef",
                     "importance_sampling_clip_min", "importance_sampling_clip_max", "overlong_buffer_len",
                     "overlong_penalty_factor"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if not 0.0 <= self.top_entropy_quantile <= 1.0:
            raise ValueError(f"top_entropy_quantile must be in [0, 1], got {self.top_entropy_quantile}")
        if self.dynamic_sampling_max_rounds < 1:
            raise ValueError(f"dynamic_sampling_max_rounds must be >= 1, got {self.dynamic_sampling_max_rounds}")
        if ADVANTAGE_ESTIMATORS[self.advantage_estimator].needs_token_statistics:
            if POLICY_LOSSES[self.loss_type].per_completion_advantages:
                raise ValueError(f"loss_type {self.loss_type!r} needs one advantage per completion; advantage_estimator "
                                 f"{self.advantage_estimator!r} gives one per token")
            if self.off_policy_mask_threshold is not None:
                raise ValueError(f"off_policy_mask_threshold reads one advantage per completion; advantage_estimator "
                                 f"{self.advantage_estimator!r} gives one per token")
        if self.delta is not None and not POLICY_LOSSES[self.loss_type].takes_delta:
            capped = [name for name, loss in POLICY_LOSSES.items() if loss.takes_delta]
            raise ValueError(f"delta caps the clipped surrogate of {', '.join(capped)}; loss_type {self.loss_type!r} has none")
        # TRL 1.16's own refusals (GRPOConfig.__post_init__, GRPOTrainer.__init__):
        low, high = self.importance_sampling_clip_min, self.importance_sampling_clip_max
        if low is not None and high is not None and low >= high:
            raise ValueError(f"importance_sampling_clip_min ({low}) must be less than importance_sampling_clip_max ({high})")
        if self.importance_sampling_correction and self.importance_sampling_mode.endswith("truncate") and low is None and high is None:
            raise ValueError(f"importance_sampling_mode {self.importance_sampling_mode!r} needs importance_sampling_clip_min or importance_sampling_clip_max")
        if (POLICY_LOSSES[self.loss_type].folds_sampling_weight and self.records_sampling_logps()
                and self.importance_sampling_correction and self.sampler_correction().sequence_level):
            token_level = [name for name, member in SAMPLER_CORRECTIONS.items() if not member.sequence_level]
            raise ValueError(f"loss_type {self.loss_type!r} with importance_sampling_correction needs importance_sampling_mode "
                             f"{' or '.join(token_level)}, got {self.importance_sampling_mode!r}")

    def records_sampling_logps(self) -> bool:
        return self.sampling_precision != "same"

    def completions_per_step(self) -> int:
        """Completions per step; with dynamic sampling the minimum (one round), the step reports what it used."""
        return self.prompts_per_step * self.group_size

    def completions_per_step_vary(self) -> bool:
        return self.dynamic_sampling


@register_algorithm
class GRPO(Algorithm):
    name = "grpo"
    Config = GRPOConfig

    def __init__(self, policy, *args, **kwargs):
        super().__init__(policy, *args, **kwargs)
        if self.config.sampling_precision == "int8":
            rollout_lib.check_int8_sampling(policy)  # now, not at the first rollout

    def train_step(self, prompts: list[str]) -> dict[str, float]:
        c: GRPOConfig = self.config
        rollout, rewards, metrics = self.collect(prompts)  # 1 generate, 2 score (several rounds with dynamic sampling)
        mask = rollout.loss_mask(c.mask_truncated)
        # 3 reference log-probs. The old (sampling-policy) ones need no pass of their own: until the first
        # update the policy *is* the sampling policy, so they are the first iteration's log-probs, detached
        # (the same numbers as a separate no-grad pass, bit for bit: tested).
        ref_logps = self.frozen_logps(self.ref_policy, rollout) if c.beta > 0 else None
        old_logps = None
        advantages = self.batch_advantages(rollout, rewards)  # 4 advantages
        # No signal (every advantage 0 and no KL or entropy term): no step, which AdamW's momentum would still take.
        # Under data parallelism: a step when any rank has a signal (the gradient all-reduce needs every rank).
        signal = self.any_rank(carries_signal(advantages, mask) or ((c.beta > 0 or c.entropy_coef != 0.0) and bool(mask.any())))
        loss_fn = c.loss(self.sampling.max_new_tokens)
        # A token-mean aggregation divides by the global batch's token count (every rank's tokens).
        num_items = self.data_parallel_token_count(mask) if loss_fn.token_mean else None
        for iteration in range(1, c.mu + 1):  # 5 update(s) on the same batch
            with self.timer("update"):
                if iteration == 1 or loss_fn.reads_entropies:  # for the mask, and with their graph for the bonus
                    logps, entropy = self.logps(self.policy, rollout, with_entropy=True, entropy_grad=c.entropy_coef != 0.0)
                else:
                    logps = self.logps(self.policy, rollout)
                if iteration == 1:  # entropy, KL and mismatch describe the batch as sampled: the first iteration's
                    first_logps, first_entropy = logps.detach(), entropy.detach()
                    if c.mu > 1:
                        old_logps = first_logps
                loss, parts = loss_fn(logps, old_logps, ref_logps, advantages, mask, entropies=entropy,
                                      sampling_logps=rollout.sampling_logps, num_items_in_batch=num_items,
                                      generator=self.generator, return_parts=True)
                grad_norm = self.update(loss) if signal else 0.0
            metrics[f"loss/iter{iteration}"] = loss.item()
            for part, value in parts.items():
                metrics[f"loss/{part}"] = metrics.get(f"loss/{part}", 0.0) + value / c.mu
            metrics[f"grad_norm/iter{iteration}"] = grad_norm
            clipped = loss_fn.clip_fraction(logps, first_logps if old_logps is None else old_logps, advantages, mask,
                                            sampling_logps=rollout.sampling_logps)
            if clipped is not None:
                metrics[f"clipfrac/iter{iteration}"] = clipped.item()

        metrics.update(self.kl_metrics(first_logps, ref_logps, mask, c.kl_loss_type))  # 6 metrics
        metrics["entropy"] = masked_mean_per_sequence(first_entropy, mask).mean().item()
        if rollout.sampling_logps is not None:
            metrics.update(self.mismatch_metrics(first_logps, rollout, loss_fn))
        metrics.update(self.advantage_metrics(advantages))
        self.mean_over_updates(metrics, c.mu)
        metrics["skipped_update"] = float(not signal)
        return metrics

    def batch_advantages(self, rollout: rollout_lib.Rollout, rewards: torch.Tensor) -> torch.Tensor:
        """Step 4: the batch's advantages by the configured estimator, given what it declares it reads (the greedy
        completions' rewards, the sampling policy's token statistics), clipped to +/- advantage_clip where set."""
        c: GRPOConfig = self.config
        estimator = c.estimator()
        baseline_rewards = self.greedy_rewards(rollout) if estimator.needs_greedy_baseline else None
        token_statistics = self.token_statistics(rollout) if estimator.needs_token_statistics else None
        advantages = self.advantages(estimator, rewards, rollout.completion_mask.sum(1), baseline_rewards, token_statistics)
        if c.advantage_clip is not None:
            advantages = advantages.clamp(-c.advantage_clip, c.advantage_clip)
        return advantages

    def advantages(self, estimator: AdvantageEstimator, rewards: torch.Tensor, lengths: Optional[torch.Tensor] = None,
                   baseline_rewards: Optional[torch.Tensor] = None, token_statistics: Optional[dict] = None) -> torch.Tensor:
        """Advantages (B,) by ``estimator``, the configured one (algorithms/estimators.py; default: group-relative), or
        (B, T) from a per-token estimator, which gets ``token_statistics`` (``token_statistics()``).
        ``lengths`` (B,) completion lengths, ``baseline_rewards`` (B,) the greedy completions' rewards (ReMax).
        Groups are whole on every rank; under data parallelism anything batch-wide (scale_rewards "batch", any
        estimator but a ``group_local`` or per-token one) is computed over every rank's rows."""
        c: GRPOConfig = self.config
        lengths = torch.ones_like(rewards) if lengths is None else lengths.to(rewards.dtype)
        group_local = (estimator.group_local and c.scale_rewards != "batch") or token_statistics is not None
        if self.data_parallel is not None and not group_local:
            gather = self.data_parallel.gather
            rewards, lengths = gather(rewards), gather(lengths)
            baseline_rewards = None if baseline_rewards is None else gather(baseline_rewards)
        inputs = EstimatorInputs(rewards, c.group_size, lengths, c.scale_rewards, baseline_rewards, **(token_statistics or {}))
        with torch.no_grad():
            advantages = estimator.advantages(inputs)
        if self.data_parallel is None or group_local:
            return advantages
        return advantages.view(self.world_size, -1)[self.data_parallel.rank]

    def token_statistics(self, rollout: rollout_lib.Rollout) -> dict:
        """What a per-token estimator reads of the sampling policy (the policy before this step's update): the mask,
        the sampled tokens' log-probs and each position's sum of pi(v)^2 over the vocabulary, (B, T) each; one
        no-grad forward."""
        with self.timer("logprobs"), torch.inference_mode():
            old_logps, sum_pi_squared = self.logps(self.policy, rollout, with_sum_pi_squared=True)
        return {"mask": rollout.completion_mask, "old_logps": old_logps.clone(), "sum_pi_squared": sum_pi_squared.clone()}

    def greedy_rewards(self, rollout: rollout_lib.Rollout) -> torch.Tensor:
        """ReMax's baseline (Li et al. 2023): the reward of one greedy completion per prompt, repeated over the
        prompt's group; shaped like the sampled rewards (DAPO's overlong penalty). Not trained on. (B,)"""
        c: GRPOConfig = self.config
        prompts = rollout.prompts[:: c.group_size]
        with self.timer("generate"), self.autocast():
            greedy = rollout_lib.generate(self.policy, self.tokenizer, prompts, 1, max_new_tokens=self.sampling.max_new_tokens,
                                          temperature=0.0, generator=self.generator)
        rewards = self.score(greedy)
        if c.overlong_buffer_len:
            rewards = rewards + overlong_penalty(greedy.completion_mask.sum(1), self.sampling.max_new_tokens,
                                                 c.overlong_buffer_len, c.overlong_penalty_factor)
        return rewards.repeat_interleave(c.group_size)

    def set_data_parallel(self, data_parallel) -> None:
        if data_parallel is not None and self.config.dynamic_sampling:
            raise ValueError("dynamic_sampling with data parallelism is not supported: ranks would keep different "
                             "numbers of groups")
        super().set_data_parallel(data_parallel)

    # --- steps 1-2: generate and score, with DAPO's reward shaping and dynamic sampling --------------
    def collect(self, prompts: list[str]) -> tuple[rollout_lib.Rollout, torch.Tensor, dict[str, float]]:
        """The batch to train on, its rewards (overlong shaping included) and the metrics of everything
        generated for it.

        Dynamic sampling (DAPO, Yu et al. 2025, Sec. 3.2, Algorithm 1): a group whose rewards all tie has
        advantage 0 and no gradient, so it is dropped and fresh prompts (drawn from the task's training
        prompts with the algorithm's seeded generator) are sampled until ``prompts_per_step`` informative
        groups are kept, ``dynamic_sampling_max_rounds`` rounds have run, or the refills would pass the sample
        budget (``completions_allowed``: a last round of fewer prompts fills it exactly); then it trains on the
        groups it kept (if none, on the last round's, whose advantages are 0). ``completions``, ``tokens/generated``,
        ``reward/*`` and ``truncated`` count every completion generated, the discarded ones included.
        """
        c: GRPOConfig = self.config
        rounds = [self.generate_and_score(prompts)]
        kept: list[tuple[int, int]] = []  # (round, group)
        while c.dynamic_sampling:
            rewards = rounds[-1][2].view(-1, c.group_size)  # (n, G)
            informative = (rewards.max(1).values > rewards.min(1).values).nonzero().flatten().tolist()
            kept += [(len(rounds) - 1, g) for g in informative]
            if len(kept) >= c.prompts_per_step or len(rounds) == c.dynamic_sampling_max_rounds:
                break
            refill = self.refill_prompts(sum(r.num_completions for r, _, _ in rounds))
            if refill == 0:
                break  # the sample budget is spent: train on what is kept
            rounds.append(self.generate_and_score(self.fresh_prompts(refill)))

        everything = [r for r, _, _ in rounds]
        scores = torch.cat([s for _, s, _ in rounds])
        metrics = self.rollout_metrics(rollout_lib.concat_rollouts(everything) if len(rounds) > 1 else rounds[0][0], scores)
        if c.overlong_buffer_len:
            metrics["reward/overlong_penalty"] = (torch.cat([r for _, _, r in rounds]) - scores).mean().item()
        if not c.dynamic_sampling:
            return rounds[0][0], rounds[0][2], metrics

        groups = sum(r.num_completions for r in everything) // c.group_size
        tied = groups - len(kept)
        last = len(rounds) - 1
        kept = kept[:c.prompts_per_step] or [(last, g) for g in range(rounds[last][0].num_completions // c.group_size)]
        parts, rewards = [], []
        for index, (rollout, _, shaped) in enumerate(rounds):
            rows = [g * c.group_size + j for r, g in kept if r == index for j in range(c.group_size)]
            if rows:
                rows_t = torch.tensor(rows, device=self.device)
                parts.append(rollout.select(rows_t))
                rewards.append(shaped[rows_t])
        metrics["dynamic_sampling/rounds"] = float(len(rounds))
        metrics["dynamic_sampling/tied_groups"] = float(tied)
        metrics["dynamic_sampling/discarded_groups"] = float(groups - len(kept))
        return rollout_lib.concat_rollouts(parts), torch.cat(rewards), metrics

    def generate_and_score(self, prompts: list[str]) -> tuple[rollout_lib.Rollout, torch.Tensor, torch.Tensor]:
        """One round: the rollout, the task's scores (B,) and the rewards the advantages see (B,)."""
        c: GRPOConfig = self.config
        rollout = self.generate(prompts, c.group_size)
        scores = self.score(rollout)
        if not c.overlong_buffer_len:
            return rollout, scores, scores
        lengths = rollout.completion_mask.sum(1)
        return rollout, scores, scores + overlong_penalty(lengths, self.sampling.max_new_tokens, c.overlong_buffer_len,
                                                          c.overlong_penalty_factor)

    def refill_prompts(self, generated: int) -> int:
        """Prompts for the next dynamic-sampling round after ``generated`` completions this step: a full round,
        or as many whole groups as ``completions_allowed`` leaves (0: none), so refills never pass the budget."""
        c: GRPOConfig = self.config
        if self.completions_allowed is None:
            return c.prompts_per_step
        return max(0, min(c.prompts_per_step, (self.completions_allowed - generated) // c.group_size))

    def fresh_prompts(self, n: int) -> list[str]:
        pool = self.task.train_prompts()
        picks = torch.randint(len(pool), (n,), generator=self.generator, device=self.device)
        return [pool[i] for i in picks.tolist()]

    def generate(self, prompts: list[str], group_size: int) -> rollout_lib.Rollout:
        """Sampling at ``sampling_precision``; anything but "same" also records the sampler's log-probs."""
        c: GRPOConfig = self.config
        if not c.records_sampling_logps():
            return super().generate(prompts, group_size)
        bf16 = c.sampling_precision == "bf16"
        precision = torch.autocast(self.device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with self.timer("generate"), precision:
            return rollout_lib.generate(
                self.policy, self.tokenizer, prompts, group_size,
                max_new_tokens=self.sampling.max_new_tokens, temperature=self.sampling.temperature,
                generator=self.generator, record_logps=True, int8=c.sampling_precision == "int8",
            )

    def mismatch_metrics(self, logps: torch.Tensor, rollout: rollout_lib.Rollout, loss: GRPOLoss) -> dict[str, float]:
        """|log p_train - log p_sample| over the sampled tokens, the shared mismatch diagnostics (``sampler_mismatch``)
        and the IS ratios ``loss`` applies."""
        active = rollout.completion_mask.bool()
        gap = (logps - rollout.sampling_logps).abs()[active]
        metrics = {"mismatch/mean": gap.mean().item() if gap.numel() else 0.0,
                   "mismatch/max": gap.max().item() if gap.numel() else 0.0,
                   **sampler_mismatch(logps, rollout.sampling_logps, rollout.completion_mask)}
        ratio = loss.sampler_weight(logps, rollout.sampling_logps, rollout.completion_mask)
        if ratio is not None:  # correction off, bypass, gated at level off: no weight
            ratio = ratio.flatten() if loss.correction.sequence_level else ratio[active]
            if ratio.numel():
                metrics.update({"mismatch/is_ratio_min": ratio.min().item(), "mismatch/is_ratio_mean": ratio.mean().item(),
                                "mismatch/is_ratio_max": ratio.max().item()})
        return metrics
