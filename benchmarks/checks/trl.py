"""``grpo-bench check trl``: our GRPO and RLOO losses, their advantages and the DPO loss against TRL's own code.

Every TRL number comes out of a real ``trl.GRPOTrainer`` / ``trl.RLOOTrainer`` / ``trl.DPOTrainer`` built on
the pizza task's tiny Llama (no hub access), fp32 on CPU. For each GRPO configuration a fresh GRPOTrainer
with that configuration runs TRL's own ``_generate_and_score_completions`` on one fixed batch (TRL's
``rollout_func`` hook returns our fixed completions and the sampler's log-probs instead of sampling), so
TRL itself computes the old log-probs, the reference log-probs, the advantages, ``num_items_in_batch``
and the sampler importance-sampling ratio; then ``GRPOTrainer.compute_loss`` gives the loss and its
gradient. Ours is ``algorithms.losses.grpo_loss`` on the same inputs dict and on the current log-probs
and entropies of TRL's own forward (with gradient), so a loss row compares loss formulas alone; our
forward (``algorithms.rollout.per_token_logps``, which skips left padding in the positions) is compared
with TRL's in a row of its own (``check_forward``).

- mu > 1: after TRL has computed the old log-probs, the policy's weights move (seeded noise, as an
  optimizer step would), so the ratio differs from 1 and clipping binds on a share of the tokens.
- beta > 0: TRL's reference model is perturbed the same way, so the KL term is not trivially 0.
- Sampler log-probs (TRL's vLLM path): TRL computes the IS ratio only when ``use_vllm`` is on, and no
  vLLM server exists here, so the trainer's ``use_vllm`` attribute is set after construction and its
  generation goes through ``rollout_func``; everything after generation is TRL's code unchanged. The
  sampler's log-probs are the policy's plus noise, with one token NaN (vLLM's "could not score").
- RLOO: ``RLOOTrainer.compute_loss`` on a prepared inputs dict (its old log-probs are sequence sums of
  the same per-token tensor ours gets), and its advantages from a whole ``_generate_and_score_completions``.

TRL's defaults are not DeepSeekMath's GRPO, so every setting that differs is set explicitly
(``TRL_PINNED``). Every TRL config and trainer here is built by the TRL adapter (``benchmarks/references/trl.py``)
from our names; where they differ from TRL's (``TRL_NAMES``, from the adapter's ``KNOBS``: the vllm_ prefix dropped,
num_iterations -> mu, ...) the report lists them. Combinations that one side refuses or where the two deliberately
differ are skipped with the reason (``skip_reason``) and counted in the report.

Gradient agreement is max_i |g_ours_i - g_trl_i| / max_i |g_trl_i| over the flattened gradient of all
model parameters (an element-wise relative error is undefined where a gradient entry is ~0).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from algorithms.grpo import GRPOConfig
from algorithms.losses import dpo_loss, group_advantages, rloo_advantages, rloo_loss
from algorithms.policy_losses import CLIPPED_LOSS_TYPES, GRPO_LOSS_TYPES, IMPORTANCE_SAMPLING_MODES, grpo_loss
from algorithms.rollout import per_token_logps, tokenize_prompts
from benchmarks.io import atomic_write_json, atomic_write_text
from benchmarks.markdown import markdown_table
from benchmarks.references import trl as trl_ref
from benchmarks.study import StudySettings, option
from tasks.pizza import RECIPE, build_pizza_model
from tasks.tiny_lm import cached_model

LOSS_TOL = 1e-6
GRAD_TOL = 1e-5
ADV_TOL = 1e-6
FORWARD_TOL = 1e-5  # our forward skips left padding in the positions, TRL's counts it: RoPE rounding
LEVELS = ("token", "sequence")
BETAS = (0.0, 0.04)
MUS = (1, 2)
SCALES = ("group", "batch", "none")
# epsilon_high per loss type: the clip's upper range (None: epsilon; DAPO's 0.28), cispo's IS-weight cap
# itself (1.1 binds on many tokens here; ScaleRL's 5.0 almost never), unused by sapo and vespo.
EPSILON_HIGHS = {**{lt: (None, 0.28) for lt in CLIPPED_LOSS_TYPES}, "cispo": (1.1, 5.0), "sapo": (None,), "vespo": (None,)}
DELTA = 1.5  # two-sided clipping's cap, > 1 + epsilon_high
ENTROPY_QUANTILES = (0.2, 0.5)
OFF_POLICY_THRESHOLD = 0.05  # drops some A < 0 completions here, keeps others
# IS bounds (C_min, C_max) that bind on this batch: token ratios spread ~exp(+-0.3), sequence ratios wider.
IS_BOUNDS = {"token": (0.8, 1.25), "sequence": (0.5, 2.0)}
TRL_DEFAULT_IS_BOUNDS = (None, 3.0)

POLICY_NOISE = 0.004  # weight noise standing in for one update at mu > 1: token log-ratios of std ~0.3
REF_NOISE = 0.004
SAMPLER_NOISE = 0.3  # sampler log-probs = policy log-probs + N(0, 0.3^2)

# Settings where TRL's defaults differ from DeepSeekMath's GRPO (or that could silently change numbers);
# each is passed explicitly to every GRPOTrainer built here.
TRL_PINNED = {
    "bf16": False,  # TRL default True: the loss would run under bf16 autocast
    "use_cpu": True,
    "temperature": 1.0,  # log-probs are computed from logits / temperature
    "epsilon": 0.2,
    "use_bias_correction_kl": False,  # TRL default True: multiplies the KL term by the ratio; off in the paper
    "disable_dropout": True,
    "top_entropy_quantile": 1.0,
    "entropy_coef": 0.0,
    "mask_truncated_completions": False,
    "multi_objective_aggregation": "sum_then_normalize",
    "gradient_accumulation_steps": 1,
    "scale_rewards": "group",
}

G = 4  # completions per prompt
T = 7  # completion width = max_completion_length (dr_grpo's constant normaliser)
PROMPTS = ("ravin likes ", "bob likes ")  # different lengths: the shorter one is left-padded
LENGTHS = (1, 3, 7, 5, 2, 7, 4, 6)  # tokens up to and including EOS; 7 without EOS = truncated
REWARDS = (4.0, 0.0, 0.0, 4.0, 0.0, 0.0, 0.0, 4.0)
ADV_REWARDS = (4.0, 0.0, 0.0, 1.5, 2.0, 2.0, 2.0, -1.0)  # two distinct values, a three-way tie, a zero-std group


@dataclass
class CheckRow:
    check: str  # "grpo_loss", "rloo_loss", "advantages", "rloo_advantages" or "dpo_loss"
    config: str
    ours: float
    trl: float
    diff: float
    grad_rel_err: Optional[float]
    passed: bool
    family: str = "core"  # the option a row exercises, for the counts
    loss_type: str = "-"
    skipped: Optional[str] = None  # the reason, when the combination is not compared


@dataclass(frozen=True)
class LossConfig:
    """One GRPO configuration, in our GRPOConfig's names (the TRL adapter maps them to TRL's)."""

    loss_type: str
    level: str = "token"
    beta: float = 0.0
    mu: int = 1
    epsilon_high: Optional[float] = None
    kl_bias_correction: bool = False
    delta: Optional[float] = None
    top_entropy_quantile: float = 1.0
    off_policy_mask_threshold: Optional[float] = None
    sampler: bool = False  # the sampler's own log-probs recorded (TRL: its vLLM path)
    importance_sampling_correction: bool = True
    importance_sampling_mode: str = "sequence_mask"
    importance_sampling_clip_min: Optional[float] = None
    importance_sampling_clip_max: Optional[float] = 3.0
    family: str = "core"

    OPTIONS = ("level", "loss_type", "epsilon_high", "delta", "beta", "kl_bias_correction", "top_entropy_quantile",
               "off_policy_mask_threshold", "importance_sampling_correction", "importance_sampling_mode",
               "importance_sampling_clip_min", "importance_sampling_clip_max")

    @property
    def name(self) -> str:
        eh = "-" if self.epsilon_high is None else f"{self.epsilon_high:g}"
        parts = [f"{self.loss_type}/{self.level} beta={self.beta:g} mu={self.mu} eps_high={eh}"]
        if self.kl_bias_correction:
            parts.append("kl_bias_correction")
        if self.delta is not None:
            parts.append(f"delta={self.delta:g}")
        if self.top_entropy_quantile < 1.0:
            parts.append(f"top_entropy_quantile={self.top_entropy_quantile:g}")
        if self.off_policy_mask_threshold is not None:
            parts.append(f"off_policy_mask={self.off_policy_mask_threshold:g}")
        if self.sampler:
            if self.importance_sampling_correction:
                lo, hi = self.importance_sampling_clip_min, self.importance_sampling_clip_max
                parts.append(f"IS {self.importance_sampling_mode} [{'-' if lo is None else f'{lo:g}'}, "
                             f"{'-' if hi is None else f'{hi:g}'}]")
            else:
                parts.append("sampler log-probs, IS correction off")
        return " ".join(parts)

    def ours(self) -> dict:
        """grpo_loss keyword arguments (the same names as our GRPOConfig's fields)."""
        return {name: getattr(self, name) for name in self.OPTIONS}


# Our GRPOConfig name -> TRL's GRPOConfig name, for the options the check varies whose names differ.
TRL_NAMES = {ours: theirs for ours, theirs in trl_ref.KNOBS.items()
             if ours != theirs and ours in (*LossConfig.OPTIONS, "mu")}


def skip_reason(cfg: LossConfig) -> Optional[str]:
    """Why a combination is not compared: our GRPOConfig refuses it (as TRL does, or where TRL silently
    ignores the option), or the two sides differ there by design."""
    try:
        GRPOConfig(learning_rate=1e-3, mu=cfg.mu, sampling_precision="bf16" if cfg.sampler else "same",
                   **cfg.ours()).validate()
    except ValueError as exc:
        trl_side = ("TRL ignores delta outside the clipped surrogate" if "delta" in str(exc)
                    else "TRL refuses it too (GRPOTrainer.__init__)")
        return f"ours refuses: {exc}; {trl_side}"
    low = cfg.importance_sampling_clip_min
    if (cfg.loss_type == "vespo" and cfg.sampler and cfg.importance_sampling_correction and low is not None
            and low > 1):
        return ("deliberate difference: ours keeps padding out of vespo's log IS weights; TRL sums them, "
                "which differs only when C_min > 1 (padding's ratio 1 is then truncated or masked)")
    return None


def loss_configs() -> list[LossConfig]:
    """Every TRL 1.16 loss type and option, each family over the loss types (``CheckRow.family``)."""
    cfgs = [
        LossConfig(lt, level, beta, mu, eh)
        for lt in GRPO_LOSS_TYPES
        for level, beta, mu, eh in itertools.product(LEVELS, BETAS, MUS, EPSILON_HIGHS[lt])
    ]
    cfgs += [LossConfig(lt, level, 0.04, mu, kl_bias_correction=True, family="kl_bias_correction")
             for lt, level, mu in itertools.product(GRPO_LOSS_TYPES, LEVELS, MUS)]
    cfgs += [LossConfig(lt, level, 0.0, 2, 0.28 if lt in CLIPPED_LOSS_TYPES else None, delta=DELTA, family="delta")
             for lt in GRPO_LOSS_TYPES for level in (LEVELS if lt in CLIPPED_LOSS_TYPES else ("token",))]
    cfgs += [LossConfig(lt, "token", 0.0, 2, top_entropy_quantile=q, family="top_entropy_quantile")
             for lt, q in itertools.product(GRPO_LOSS_TYPES, ENTROPY_QUANTILES)]
    cfgs += [LossConfig("grpo", "token", 0.04, 1, top_entropy_quantile=q, family="top_entropy_quantile")
             for q in ENTROPY_QUANTILES]
    cfgs += [LossConfig(lt, "token", 0.0, 2, off_policy_mask_threshold=OFF_POLICY_THRESHOLD, family="off_policy_mask")
             for lt in GRPO_LOSS_TYPES]
    # The sampler/trainer IS correction: every mode, bounds that bind, every loss type, mu 1 and 2.
    for lt, mode, mu in itertools.product(GRPO_LOSS_TYPES, IMPORTANCE_SAMPLING_MODES, MUS):
        lo, hi = IS_BOUNDS[mode.split("_")[0]]
        cfgs.append(LossConfig(lt, "token", 0.0, mu, sampler=True, importance_sampling_mode=mode,
                               importance_sampling_clip_min=lo, importance_sampling_clip_max=hi,
                               family="importance_sampling"))
    for mode in IMPORTANCE_SAMPLING_MODES:  # TRL's default bounds; and with the KL term
        cfgs.append(LossConfig("grpo", "token", 0.0, 2, sampler=True, importance_sampling_mode=mode,
                               importance_sampling_clip_min=TRL_DEFAULT_IS_BOUNDS[0],
                               importance_sampling_clip_max=TRL_DEFAULT_IS_BOUNDS[1], family="importance_sampling"))
        lo, hi = IS_BOUNDS[mode.split("_")[0]]
        cfgs.append(LossConfig("grpo", "sequence", 0.04, 2, sampler=True, importance_sampling_mode=mode,
                               importance_sampling_clip_min=lo, importance_sampling_clip_max=hi,
                               family="importance_sampling"))
    for mode in ("token_truncate", "token_mask"):  # the documented vespo difference
        cfgs.append(LossConfig("vespo", "token", 0.0, 2, sampler=True, importance_sampling_mode=mode,
                               importance_sampling_clip_min=1.05, importance_sampling_clip_max=3.0,
                               family="importance_sampling"))
    # The off-policy mask against the sampler's log-probs, with and without the IS correction.
    for lt in GRPO_LOSS_TYPES:
        cfgs.append(LossConfig(lt, "token", 0.0, 2, off_policy_mask_threshold=OFF_POLICY_THRESHOLD, sampler=True,
                               importance_sampling_mode="token_truncate", importance_sampling_clip_min=0.8,
                               importance_sampling_clip_max=1.25, family="off_policy_mask"))
    for lt in ("grpo", "vespo"):
        cfgs.append(LossConfig(lt, "token", 0.0, 1, off_policy_mask_threshold=OFF_POLICY_THRESHOLD, sampler=True,
                               importance_sampling_correction=False, family="off_policy_mask"))
    return cfgs


def config_name(cfg) -> str:
    return cfg.name if isinstance(cfg, LossConfig) else str(cfg)


# --------------------------------------------------------------------------------------------
# The fixed batch, the models and the trainers
# --------------------------------------------------------------------------------------------


def load_model():
    model, tokenizer = cached_model("pizza", RECIPE, lambda: build_pizza_model(RECIPE))
    return model.float().train(), tokenizer


@dataclass
class Batch:
    """One generation batch: two prompts (one left-padded) x G ragged completions, rewards, and the
    sampler's log-probs. ``rollout`` is TRL's ``rollout_func`` returning exactly these."""

    prompt_ids: torch.Tensor  # (B, P) left-padded
    prompt_mask: torch.Tensor  # (B, P)
    completion_ids: torch.Tensor  # (B, T) right-padded
    completion_mask: torch.Tensor  # (B, T)
    rewards: torch.Tensor  # (B,)
    sampler_logps: torch.Tensor  # (B, T) the policy's log-probs + noise, one NaN token, 0 on padding

    def examples(self) -> list[dict]:
        return [{"prompt": PROMPTS[i // G], "reward": r} for i, r in enumerate(self.rewards.tolist())]

    def rollout(self, prompts, trainer) -> dict:
        rows = range(self.prompt_ids.size(0))
        return {
            "prompt_ids": [self.prompt_ids[i][self.prompt_mask[i].bool()].tolist() for i in rows],
            "completion_ids": [self.completion_ids[i][self.completion_mask[i].bool()].tolist() for i in rows],
            "logprobs": [self.sampler_logps[i][self.completion_mask[i].bool()].tolist() for i in rows],
        }


def make_batch(model, tokenizer, seed: int = 0) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    prompt_ids, prompt_mask = tokenize_prompts(tokenizer, [p for p in PROMPTS for _ in range(G)], "cpu")
    B = prompt_ids.size(0)
    first_real = len(tokenizer.all_special_tokens)  # char tokens follow <pad> <eos> <unk>
    ids = torch.randint(first_real, len(tokenizer), (B, T), generator=gen)
    lengths = torch.tensor(LENGTHS)
    positions = torch.arange(T)
    mask = (positions < lengths.unsqueeze(1)).long()  # (B, T)
    eos_at = (positions == (lengths - 1).unsqueeze(1)) & (lengths < T).unsqueeze(1)
    ids = torch.where(eos_at, torch.full_like(ids, tokenizer.eos_token_id), ids)
    ids = torch.where(mask.bool(), ids, torch.full_like(ids, tokenizer.pad_token_id))
    with torch.no_grad():
        logps = per_token_logps(model, prompt_ids, prompt_mask, ids, mask)
    sampler = (logps + SAMPLER_NOISE * torch.randn(B, T, generator=gen)) * mask
    sampler[2, 1] = float("nan")  # a token the sampler could not score: no correction there
    return Batch(prompt_ids, prompt_mask, ids, mask, torch.tensor(REWARDS), sampler)


def perturb_(model, scale: float, seed: int) -> None:
    """Seeded weight noise in place: the policy after an update (mu > 1), or a reference that differs."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))


def _dataset():
    from datasets import Dataset

    return Dataset.from_dict({"prompt": list(PROMPTS) * 4, "reward": [0.0] * (len(PROMPTS) * 4)})


def grpo_trainer(model, tokenizer, out_dir: str, rollout_func=None, **ours):
    """A real GRPOTrainer on ``model`` with TRL_PINNED, and ``ours`` (our names) over them."""
    trl_ref.silence()
    args = trl_ref.config(out_dir, {"group_size": G, "prompts_per_step": len(PROMPTS), "max_new_tokens": T, **ours},
                          **TRL_PINNED)
    return trl_ref.trainer(args, model=model, reward_funcs=preset_reward, train_dataset=_dataset(),
                           processing_class=tokenizer, rollout_func=rollout_func)


def rloo_trainer(model, tokenizer, out_dir: str, **ours):
    """A real RLOOTrainer on ``model`` (fp32, CPU, temperature 1, no dropout) with ``ours`` (our names)."""
    trl_ref.silence()
    args = trl_ref.config(out_dir, {"group_size": G, "prompts_per_step": len(PROMPTS), "max_new_tokens": T,
                                    "temperature": 1.0, **ours},
                          trainer="rloo", disable_dropout=True, gradient_accumulation_steps=1)
    return trl_ref.trainer(args, model=model, reward_funcs=preset_reward, train_dataset=_dataset(),
                           processing_class=tokenizer)


def preset_reward(prompts, completions, reward, **kwargs):
    """TRL reward function returning the dataset's ``reward`` column: lets the check choose the rewards."""
    return list(reward)


def _grads(loss: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)])


def grad_rel_err(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours - theirs).abs().max() / theirs.abs().max().clamp(min=1e-30))


def _skipped(check: str, name: str, family: str, loss_type: str, reason: str) -> CheckRow:
    nan = float("nan")
    return CheckRow(check, name, nan, nan, nan, None, True, family, loss_type, reason)


# --------------------------------------------------------------------------------------------
# The checks
# --------------------------------------------------------------------------------------------


def trl_logps(trainer, model, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's own forward for the current per-token log-probs (with gradient) and entropies, (B, T) each:
    the loss rows compare loss formulas on identical log-probs; ``check_forward`` compares the forwards."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    logps, entropies, _ = trainer._get_per_token_logps_and_entropies(model, ids, attention, ids.size(1) - inputs["prompt_ids"].size(1),
                                                                     compute_entropy=True)
    return logps, entropies


def check_forward(base_model, tokenizer, batch: Batch, out_dir: str) -> CheckRow:
    """Our ``per_token_logps`` (padding skipped in the positions) against TRL's forward (padding counted)
    on the batch, policy moved as at mu > 1: the largest |log-prob diff| over active tokens, and the
    gradient of their sum."""
    model = copy.deepcopy(base_model).train()
    trainer = grpo_trainer(model, tokenizer, out_dir, beta=0.0)
    perturb_(model, POLICY_NOISE, seed=2)
    inputs = {"prompt_ids": batch.prompt_ids, "prompt_mask": batch.prompt_mask, "completion_ids": batch.completion_ids,
              "completion_mask": batch.completion_mask}
    mask = batch.completion_mask
    params = [p for p in model.parameters() if p.requires_grad]
    theirs, their_entropy = trl_logps(trainer, model, inputs)
    their_grad = _grads((theirs * mask).sum(), params)
    ours, our_entropy = per_token_logps(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, mask,
                                        with_entropy=True)
    our_grad = _grads((ours * mask).sum(), params)
    diff = float(((ours - theirs) * mask).abs().max())
    entropy_diff = float(((our_entropy - their_entropy) * mask).abs().max())
    rel = grad_rel_err(our_grad, their_grad)
    name = f"per-token log-probs, left-padded prompt (entropy max diff {entropy_diff:.1e})"
    return CheckRow("logprobs", name, float((ours * mask).sum()), float((theirs * mask).sum()), diff, rel,
                    diff <= FORWARD_TOL and entropy_diff <= FORWARD_TOL and rel <= GRAD_TOL, "forward", "-")


def check_grpo_loss(base_model, tokenizer, batch: Batch, cfg: LossConfig, out_dir: str) -> CheckRow:
    """TRL prepares the inputs (old/ref log-probs, advantages, IS ratio) and computes its loss; ours is
    ``grpo_loss`` on that same inputs dict. TRL's dict holds old log-probs where TRL computed them (mu > 1,
    or its vLLM path); where it holds none, both sides take the current ones, detached."""
    reason = skip_reason(cfg)
    if reason:
        return _skipped("grpo_loss", cfg.name, cfg.family, cfg.loss_type, reason)
    model = copy.deepcopy(base_model).train()
    trainer = grpo_trainer(model, tokenizer, out_dir, rollout_func=batch.rollout, mu=cfg.mu, **cfg.ours())
    if cfg.beta > 0:
        perturb_(trainer.ref_model, REF_NOISE, seed=1)
    if cfg.sampler:  # TRL's vLLM path without a vLLM server: generation is rollout_func's, the rest TRL's own
        trainer.use_vllm = True
        trainer._last_loaded_step = trainer.state.global_step  # no weight sync to a server
    with torch.no_grad():
        inputs = trainer._generate_and_score_completions(batch.examples())
    if not cfg.sampler:
        inputs.pop("sampling_per_token_logps", None)
    if cfg.mu > 1:
        perturb_(model, POLICY_NOISE, seed=2)  # the policy has moved since TRL computed the old log-probs
    params = [p for p in model.parameters() if p.requires_grad]

    trl_loss = trainer.compute_loss(model, inputs)
    trl_grad = _grads(trl_loss, params)

    mask = inputs["completion_mask"]
    logps, entropies = trl_logps(trainer, model, inputs)
    ours = grpo_loss(
        logps, inputs.get("old_per_token_logps"), inputs.get("ref_per_token_logps"),
        inputs["advantages"], mask, **cfg.ours(), epsilon=TRL_PINNED["epsilon"], max_completion_length=T,
        num_items_in_batch=float(inputs["num_items_in_batch"]),
        entropies=entropies if cfg.top_entropy_quantile < 1.0 else None,
        sampling_logps=inputs.get("sampling_per_token_logps"),
    )
    our_grad = _grads(ours, params)
    diff = abs(ours.item() - trl_loss.item())
    rel = grad_rel_err(our_grad, trl_grad)
    return CheckRow("grpo_loss", cfg.name, ours.item(), trl_loss.item(), diff, rel,
                    diff <= LOSS_TOL and rel <= GRAD_TOL, cfg.family, cfg.loss_type)


def check_advantages(base_model, tokenizer, scale: str, out_dir: str) -> CheckRow:
    """TRL's advantages from a full generate-and-score step whose reward function returns our rewards;
    one row per scale, the largest difference over the batch."""
    trainer = grpo_trainer(copy.deepcopy(base_model), tokenizer, out_dir, loss_type="grpo", beta=0.0,
                           scale_rewards=scale)
    rewards = torch.tensor(ADV_REWARDS)
    batch = [{"prompt": PROMPTS[i // G], "reward": r} for i, r in enumerate(rewards.tolist())]
    with torch.no_grad():
        theirs = trainer._generate_and_score_completions(batch)["advantages"].float()
    ours = group_advantages(rewards, G, scale)
    return _vector_row("advantages", f"scale_rewards={scale}", ours, theirs, "group_advantages", "grpo")


def _vector_row(check: str, name: str, ours: torch.Tensor, theirs: torch.Tensor, family: str, loss_type: str) -> CheckRow:
    """A row for a (B,) result: ours/TRL columns show the largest |A|, diff the largest |A_ours - A_TRL|."""
    diff = float((ours - theirs).abs().max())
    return CheckRow(check, name, float(ours.abs().max()), float(theirs.abs().max()), diff, None, diff <= ADV_TOL,
                    family, loss_type)


def rloo_loss_configs() -> list[dict]:
    return [dict(mu=mu, epsilon_high=eh) for mu, eh in itertools.product(MUS, (None, 0.28))]


def rloo_advantage_configs() -> list[dict]:
    return [dict(beta=b, normalize_advantages=n, reward_clip=c)
            for b, n, c in itertools.product((0.0, 0.05), (False, True), (None, (-0.5, 3.0)))]


def _rloo_name(cfg: dict) -> str:
    parts = [f"{k}={'-' if v is None else v}" for k, v in cfg.items()]
    return "rloo " + " ".join(parts)


def check_rloo_loss(base_model, tokenizer, batch: Batch, cfg: dict, out_dir: str) -> CheckRow:
    """RLOOTrainer.compute_loss on a prepared inputs dict; its old log-probs are the sequence sums of the
    per-token tensor ours gets (at mu = 1 ours takes the current ones, detached, as RLOO.step does).
    Both losses see TRL's forward (``trl_logps``)."""
    model = copy.deepcopy(base_model).train()
    trainer = rloo_trainer(model, tokenizer, out_dir, beta=0.0, mu=cfg["mu"], epsilon_high=cfg["epsilon_high"])
    mask = batch.completion_mask
    inputs = {"prompt_ids": batch.prompt_ids, "prompt_mask": batch.prompt_mask, "completion_ids": batch.completion_ids,
              "completion_mask": mask, "advantages": rloo_advantages(batch.rewards, G)}
    with torch.no_grad():  # the old log-probs as TRL's generation step computes them
        old, _ = trl_logps(trainer, model, inputs)
    inputs["old_logps"] = (old * mask).sum(1)
    if cfg["mu"] > 1:
        perturb_(model, POLICY_NOISE, seed=2)
    params = [p for p in model.parameters() if p.requires_grad]
    trl_loss = trainer.compute_loss(model, inputs)
    trl_grad = _grads(trl_loss, params)
    logps, _ = trl_logps(trainer, model, inputs)
    ours = rloo_loss(logps, old if cfg["mu"] > 1 else None, inputs["advantages"], mask, epsilon=0.2,
                     epsilon_high=cfg["epsilon_high"])
    our_grad = _grads(ours, params)
    diff = abs(ours.item() - trl_loss.item())
    rel = grad_rel_err(our_grad, trl_grad)
    return CheckRow("rloo_loss", _rloo_name(cfg), ours.item(), trl_loss.item(), diff, rel,
                    diff <= LOSS_TOL and rel <= GRAD_TOL, "rloo", "rloo")


def check_rloo_advantages(base_model, tokenizer, cfg: dict, out_dir: str) -> CheckRow:
    """RLOOTrainer's advantages from a whole ``_generate_and_score_completions`` (it samples; the reward
    function returns preset rewards), against ``rloo_advantages`` with the k1 KL from our own forwards of
    the policy and TRL's (perturbed) reference on TRL's completions."""
    clip = cfg["reward_clip"]
    trainer = rloo_trainer(copy.deepcopy(base_model), tokenizer, out_dir, beta=cfg["beta"],
                           normalize_advantages=cfg["normalize_advantages"],
                           reward_clip_min=None if clip is None else clip[0],
                           reward_clip_max=None if clip is None else clip[1])
    if cfg["beta"] > 0:
        perturb_(trainer.ref_model, REF_NOISE, seed=1)
    rewards = torch.tensor(ADV_REWARDS)
    batch = [{"prompt": PROMPTS[i // G], "reward": r} for i, r in enumerate(rewards.tolist())]
    with torch.no_grad():
        out = trainer._generate_and_score_completions(batch)
        kl = None
        if cfg["beta"] > 0:
            args = (out["prompt_ids"], out["prompt_mask"], out["completion_ids"], out["completion_mask"])
            kl = ((per_token_logps(trainer.model, *args) - per_token_logps(trainer.ref_model, *args))
                  * out["completion_mask"]).sum(1)
    ours = rloo_advantages(rewards, G, kl=kl, beta=cfg["beta"], normalize=cfg["normalize_advantages"],
                           reward_clip_min=None if clip is None else clip[0],
                           reward_clip_max=None if clip is None else clip[1])
    return _vector_row("rloo_advantages", _rloo_name(cfg), ours, out["advantages"].float(), "rloo", "rloo")


def check_dpo(base_model, tokenizer, out_dir: str, beta: float = 0.1) -> CheckRow:
    """DPO sigmoid loss: TRL's DPOTrainer.compute_loss (policy and reference forwards inside TRL) vs ours."""
    from datasets import Dataset

    trl_ref.silence()
    model = copy.deepcopy(base_model)
    ref = copy.deepcopy(base_model).eval()
    perturb_(ref, 0.02, seed=1)  # a reference that differs from the policy, so the log-ratios are not 0
    pairs = Dataset.from_dict({"prompt": ["ravin likes "] * 2, "chosen": ["pizza"] * 2, "rejected": ["pasta"] * 2})
    args = trl_ref.config(out_dir, {"beta": beta}, trainer="dpo", loss_type=["sigmoid"], precompute_ref_log_probs=False)
    trainer = trl_ref.trainer(args, model=model, ref_model=ref, train_dataset=pairs, processing_class=tokenizer)

    # Two pairs, chosen rows first, then rejected rows (TRL's batch layout); equal-length prompts, and
    # completions of different lengths, each ending in EOS and right-padded.
    prompt = ["ravin likes ", "carol likes "]
    chosen, rejected = ["pizza", "sushi"], ["pasta", "burgers"]
    completions = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in chosen + rejected]
    width = max(map(len, completions))
    c_ids = torch.tensor([c + [tokenizer.pad_token_id] * (width - len(c)) for c in completions])
    c_mask = torch.tensor([[1] * len(c) + [0] * (width - len(c)) for c in completions])
    p_ids = tokenizer(prompt * 2, add_special_tokens=False, return_tensors="pt")["input_ids"]
    p_mask = torch.ones_like(p_ids)
    inputs = {
        "input_ids": torch.cat([p_ids, c_ids], 1),
        "attention_mask": torch.cat([p_mask, c_mask], 1),
        "completion_mask": torch.cat([torch.zeros_like(p_ids), c_mask], 1),
    }
    params = [q for q in model.parameters() if q.requires_grad]
    model.train()
    trl_loss = trainer.compute_loss(model, inputs)
    trl_grad = _grads(trl_loss, params)

    def seq_logps(m):
        return (per_token_logps(m, p_ids, p_mask, c_ids, c_mask) * c_mask).sum(-1)

    pol = seq_logps(model)
    with torch.no_grad():
        reference = seq_logps(ref)
    n = len(prompt)
    ours = dpo_loss(pol[:n], pol[n:], reference[:n], reference[n:], beta=beta)
    our_grad = _grads(ours, params)
    diff = abs(ours.item() - trl_loss.item())
    rel = grad_rel_err(our_grad, trl_grad)
    return CheckRow("dpo_loss", f"sigmoid beta={beta}, 2 pairs", ours.item(), trl_loss.item(), diff, rel,
                    diff <= LOSS_TOL and rel <= GRAD_TOL, "dpo", "dpo")


def run_checks(progress=None, configs: Optional[list[LossConfig]] = None, *, extras: bool = True) -> list[CheckRow]:
    """Every GRPO loss configuration (or ``configs``), then (``extras``) RLOO, the advantages and DPO."""
    torch.manual_seed(0)
    base, tokenizer = load_model()
    batch = make_batch(base, tokenizer)
    rows: list[CheckRow] = []

    def add(row):
        rows.append(row)
        if progress:
            progress(row)

    with tempfile.TemporaryDirectory() as out_dir:
        for cfg in loss_configs() if configs is None else configs:
            add(check_grpo_loss(base, tokenizer, batch, cfg, out_dir))
        if extras:
            add(check_forward(base, tokenizer, batch, out_dir))
            for cfg in rloo_loss_configs():
                add(check_rloo_loss(base, tokenizer, batch, cfg, out_dir))
            for cfg in rloo_advantage_configs():
                add(check_rloo_advantages(base, tokenizer, cfg, out_dir))
            for scale in SCALES:
                add(check_advantages(base, tokenizer, scale, out_dir))
            add(check_dpo(base, tokenizer, out_dir))
    return rows


# --------------------------------------------------------------------------------------------
# Report and command
# --------------------------------------------------------------------------------------------


def _fmt(x: Optional[float]) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.3e}" if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e4) else f"{x:.6f}"


def _verdict(r: CheckRow) -> str:
    return "skipped" if r.skipped else ("yes" if r.passed else "**NO**")


def check_rows_table(rows: list[CheckRow]) -> str:
    return markdown_table(
        ["check", "config", "ours", "TRL", "abs diff", "grad rel err", "pass"],
        [[r.check, r.config, _fmt(r.ours), _fmt(r.trl), _fmt(r.diff), _fmt(r.grad_rel_err), _verdict(r)] for r in rows])


def counts_table(rows: list[CheckRow]) -> str:
    """Compared / skipped configurations by check and option family, and by GRPO loss type."""
    by_family = Counter((r.check, r.family, bool(r.skipped)) for r in rows)
    keys = list(dict.fromkeys((r.check, r.family) for r in rows))  # in the order the rows run
    by_type = Counter((r.loss_type, bool(r.skipped)) for r in rows if r.check == "grpo_loss")
    return "\n\n".join([
        markdown_table(["check", "option", "compared", "skipped"],
                       [[c, f, by_family[(c, f, False)], by_family[(c, f, True)]] for c, f in keys]),
        markdown_table(["GRPO loss type", "compared", "skipped"],
                       [[lt, by_type[(lt, False)], by_type[(lt, True)]] for lt in GRPO_LOSS_TYPES]),
    ])


def _worst(rows: list[CheckRow], key: str, checks: tuple[str, ...]) -> float:
    values = [getattr(r, key) for r in rows if r.check in checks and not r.skipped and getattr(r, key) is not None]
    return max(values, default=0.0)


def report(rows: list[CheckRow], trl_version: str) -> str:
    compared = [r for r in rows if not r.skipped]
    failed = [r for r in compared if not r.passed]
    skipped = [r for r in rows if r.skipped]
    losses = ("grpo_loss", "rloo_loss", "dpo_loss")
    pinned = ", ".join(f"{k}={v}" for k, v in TRL_PINNED.items())
    names = ", ".join(f"{ours} -> {theirs}" for ours, theirs in TRL_NAMES.items())
    reasons = Counter(r.skipped for r in skipped)
    return "\n".join([
        f"# GRPO, RLOO and DPO losses against TRL {trl_version}",
        "",
        "Generated by `grpo-bench check trl`. TRL numbers come from real `trl.GRPOTrainer`, `trl.RLOOTrainer` and "
        "`trl.DPOTrainer` objects on the pizza task's tiny Llama, fp32 on CPU. For each GRPO configuration a fresh "
        "GRPOTrainer runs its own `_generate_and_score_completions` on one fixed batch (TRL's `rollout_func` hook "
        "returns the fixed completions and the sampler's log-probs), so TRL computes the old and reference "
        "log-probs, advantages, `num_items_in_batch` and the sampler IS ratio; then `compute_loss` gives the loss "
        "and gradient, and ours is `grpo_loss` on the same inputs dict and on the current log-probs and entropies "
        "of TRL's own forward (with gradient), so a loss row compares the loss formulas alone; our forward "
        "(`per_token_logps`) is compared with TRL's in the `logprobs` row. mu > 1: the policy's weights move (seeded noise) after TRL computed the old "
        "log-probs. beta > 0: TRL's reference model is perturbed likewise. Sampler log-probs: TRL computes the IS "
        "ratio only on its vLLM path, so `use_vllm` is set on the trainer after construction (no vLLM server; "
        "generation is `rollout_func`'s, all else TRL's code); the sampler's log-probs are the policy's plus "
        f"N(0, {SAMPLER_NOISE:g}^2) noise with one NaN token. RLOO: `RLOOTrainer.compute_loss` on a prepared batch, "
        "and its advantages from a whole `_generate_and_score_completions`.",
        "",
        f"TRL settings pinned explicitly (its defaults differ from DeepSeekMath's GRPO): {pinned}; the rest as in "
        f"each row. Our names map to TRL's as {names}; RLOO's reward_clip_min/max -> reward_clip_range.",
        "",
        "The inputs include a left-padded prompt. TRL's log-prob forward passes no position ids (padding "
        "counts as positions) while ours skip the padding; the pizza model uses RoPE, where only relative "
        f"positions matter, so both agree to float rounding (the `logprobs` row, tolerance {FORWARD_TOL:g}).",
        "",
        f"Tolerances: loss |diff| <= {LOSS_TOL:g}, gradient max|diff|/max|g_TRL| <= {GRAD_TOL:g}, "
        f"advantage max |diff| <= {ADV_TOL:g}.",
        "",
        f"**{len(compared) - len(failed)}/{len(compared)} configurations agree, {len(skipped)} skipped.** Largest "
        f"loss diff {_worst(rows, 'diff', losses):.2e}, largest gradient rel err "
        f"{_worst(rows, 'grad_rel_err', losses):.2e} (GRPO, RLOO, DPO); largest advantage diff "
        f"{_worst(rows, 'diff', ('advantages', 'rloo_advantages')):.2e}.",
        "",
        counts_table(rows),
        "",
        "Skipped combinations and why:",
        "",
        *[f"- {n} x {reason}" for reason, n in reasons.items()],
        "",
        check_rows_table(rows),
        "",
    ])


def write_results(rows: list[CheckRow], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "report.md", report(rows, trl_ref.version()))
    atomic_write_json(out / "results.json", {
        "trl_version": trl_ref.version(), "torch_version": torch.__version__, "trl_pinned": TRL_PINNED,
        "trl_names": TRL_NAMES, "tolerances": {"loss": LOSS_TOL, "grad_rel": GRAD_TOL, "advantage": ADV_TOL},
        "rows": [dataclasses.asdict(r) for r in rows],
    })
    header = "check,family,loss_type,config,ours,trl,abs_diff,grad_rel_err,passed,skipped\n"
    body = "".join(f"{r.check},{r.family},{r.loss_type},\"{r.config}\",{r.ours!r},{r.trl!r},{r.diff!r},"
                   f"{'' if r.grad_rel_err is None else repr(r.grad_rel_err)},{r.passed},"
                   f"\"{r.skipped or ''}\"\n" for r in rows)
    atomic_write_text(out / "results.csv", header + body)


def _progress_line(r: CheckRow) -> str:
    if r.skipped:
        return f"skip {r.config}: {r.skipped}"
    return (f"{'ok  ' if r.passed else 'FAIL'} {r.check} {r.config}: ours {r.ours:.8f} TRL {r.trl:.8f} "
            f"diff {r.diff:.1e} grad {_fmt(r.grad_rel_err)}")


@dataclass
class TrlCheckSettings(StudySettings):
    """Where the check writes; what it compares is fixed (``loss_configs`` and the RLOO / DPO extras)."""

    out: str = option("out", "results/trl_check")  # report.md, results.csv and results.json


def run_trl_check(settings: TrlCheckSettings) -> int:
    """Every configuration against TRL, written to OUT; 1 when any compared configuration disagrees."""
    print(f"TRL {trl_ref.version()}; pinned TRL settings: {TRL_PINNED}")
    rows = run_checks(progress=lambda r: print(_progress_line(r), flush=True))
    write_results(rows, Path(settings.out))
    compared = [r for r in rows if not r.skipped]
    failed = sum(not r.passed for r in compared)
    print(counts_table(rows))
    print(f"{len(compared) - failed}/{len(compared)} configurations agree, {len(rows) - len(compared)} skipped; "
          f"max loss diff {_worst(rows, 'diff', ('grpo_loss', 'rloo_loss', 'dpo_loss')):.2e}, max grad rel err "
          f"{_worst(rows, 'grad_rel_err', ('grpo_loss', 'rloo_loss', 'dpo_loss')):.2e} -> {settings.out}")
    return 1 if failed else 0
