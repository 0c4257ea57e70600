"""TRL 1.16's cases: our GRPO and RLOO losses, their advantages, our forward and the DPO loss against TRL's own
trainers (checked by ``grpo-bench check trl``, benchmarks/checks/trl.py, on this engine).

Every TRL number comes out of a real ``trl.GRPOTrainer`` / ``trl.RLOOTrainer`` / ``trl.DPOTrainer`` built on
the pizza task's tiny Llama (no hub access), fp32 on CPU. For each GRPO configuration a fresh GRPOTrainer
with that configuration runs TRL's own ``_generate_and_score_completions`` on one fixed batch (TRL's
``rollout_func`` hook returns our fixed completions and the sampler's log-probs instead of sampling), so
TRL itself computes the old log-probs, the reference log-probs, the advantages, ``num_items_in_batch``
and the sampler importance-sampling ratio; then ``GRPOTrainer.compute_loss`` gives the loss and its
gradient. Ours is GRPO's loss (``GRPOConfig.loss()``) on the same inputs dict and on the current log-probs
and entropies of TRL's own forward (with gradient), so a loss row compares loss formulas alone; our
forward (``algorithms.rollout.per_token_logps``, which skips left padding in the positions) is compared
with TRL's in a row of its own (``forward``).

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

import contextlib
import copy
import dataclasses
import itertools
import tempfile
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import torch

from algorithms import policy_losses
from algorithms.grpo import GRPOConfig
from algorithms.losses import dpo_loss, group_advantages, rloo_advantages, rloo_loss
from algorithms.policy_losses import CLIPPED_LOSS_TYPES, GRPO_LOSS_TYPES, IMPORTANCE_SAMPLING_MODES
from algorithms.rollout import per_token_logps, tokenize_prompts
from benchmarks.checks.engine import CaseModule, Comparison, Config, Fixture, Plant, Tolerance, patched, register_cases
from benchmarks.references import trl as trl_ref
from tasks.pizza import RECIPE, build_pizza_model
from tasks.tiny_lm import cached_model

LOSS_TOL = 1e-6
GRAD_TOL = 1e-5
ADV_TOL = 1e-6
FORWARD_TOL = 1e-5  # our forward skips left padding in the positions, TRL's counts it: RoPE rounding
LOSS = Tolerance(LOSS_TOL, GRAD_TOL, relative_grad=True)
ADVANTAGES = Tolerance(ADV_TOL)
FORWARD = Tolerance(FORWARD_TOL, GRAD_TOL, relative_grad=True)  # the entropies too
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
        """Our GRPOConfig's settings (its fields' names)."""
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


def _core() -> list[LossConfig]:
    return [LossConfig(lt, level, beta, mu, eh) for lt in GRPO_LOSS_TYPES
            for level, beta, mu, eh in itertools.product(LEVELS, BETAS, MUS, EPSILON_HIGHS[lt])]


def _options() -> list[LossConfig]:
    """KL bias correction, two-sided clipping, the entropy mask and the off-policy mask, over the loss types."""
    cfgs = [LossConfig(lt, level, 0.04, mu, kl_bias_correction=True, family="kl_bias_correction")
            for lt, level, mu in itertools.product(GRPO_LOSS_TYPES, LEVELS, MUS)]
    cfgs += [LossConfig(lt, level, 0.0, 2, 0.28 if lt in CLIPPED_LOSS_TYPES else None, delta=DELTA, family="delta")
             for lt in GRPO_LOSS_TYPES for level in (LEVELS if lt in CLIPPED_LOSS_TYPES else ("token",))]
    cfgs += [LossConfig(lt, "token", 0.0, 2, top_entropy_quantile=q, family="top_entropy_quantile")
             for lt, q in itertools.product(GRPO_LOSS_TYPES, ENTROPY_QUANTILES)]
    cfgs += [LossConfig("grpo", "token", 0.04, 1, top_entropy_quantile=q, family="top_entropy_quantile")
             for q in ENTROPY_QUANTILES]
    cfgs += [LossConfig(lt, "token", 0.0, 2, off_policy_mask_threshold=OFF_POLICY_THRESHOLD, family="off_policy_mask")
             for lt in GRPO_LOSS_TYPES]
    return cfgs


def _sampled(lt: str, mode: str, mu: int, level: str = "token", beta: float = 0.0, bounds=None) -> LossConfig:
    """The sampler/trainer IS correction in ``mode`` with ``bounds`` (default: ones that bind on this batch)."""
    lo, hi = IS_BOUNDS[mode.split("_")[0]] if bounds is None else bounds
    return LossConfig(lt, level, beta, mu, sampler=True, importance_sampling_mode=mode,
                      importance_sampling_clip_min=lo, importance_sampling_clip_max=hi, family="importance_sampling")


def _importance_sampling() -> list[LossConfig]:
    """Every mode, bounds that bind, every loss type, mu 1 and 2; TRL's default bounds and the KL term; the
    documented vespo difference; the off-policy mask against the sampler's log-probs, with and without the IS
    correction."""
    cfgs = [_sampled(lt, mode, mu) for lt, mode, mu in itertools.product(GRPO_LOSS_TYPES, IMPORTANCE_SAMPLING_MODES, MUS)]
    for mode in IMPORTANCE_SAMPLING_MODES:
        cfgs += [_sampled("grpo", mode, 2, bounds=TRL_DEFAULT_IS_BOUNDS), _sampled("grpo", mode, 2, "sequence", 0.04)]
    cfgs += [_sampled("vespo", mode, 2, bounds=(1.05, 3.0)) for mode in ("token_truncate", "token_mask")]
    cfgs += [LossConfig(lt, "token", 0.0, 2, off_policy_mask_threshold=OFF_POLICY_THRESHOLD, sampler=True,
                        importance_sampling_mode="token_truncate", importance_sampling_clip_min=0.8,
                        importance_sampling_clip_max=1.25, family="off_policy_mask") for lt in GRPO_LOSS_TYPES]
    cfgs += [LossConfig(lt, "token", 0.0, 1, off_policy_mask_threshold=OFF_POLICY_THRESHOLD, sampler=True,
                        importance_sampling_correction=False, family="off_policy_mask") for lt in ("grpo", "vespo")]
    return cfgs


def loss_configs() -> list[LossConfig]:
    """Every TRL 1.16 loss type and option, each family over the loss types (``LossConfig.family``)."""
    return _core() + _options() + _importance_sampling()


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


def _dataset(columns: Optional[dict] = None):
    """A TRL train dataset of ``columns`` (default: the prompts, each with a reward column for ``preset_reward``)."""
    from datasets import Dataset  # noqa: PLC0415  seconds to import; `grpo-bench check --help` never needs it

    return Dataset.from_dict(columns or {"prompt": list(PROMPTS) * 4, "reward": [0.0] * (len(PROMPTS) * 4)})


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


@dataclass
class Setup:
    """What every TRL comparison runs on: the pizza model (a fresh copy per trainer), its tokenizer, the fixed batch
    and the folder TRL's trainers are given."""

    base: torch.nn.Module
    tokenizer: object
    batch: Batch
    out_dir: str


@contextlib.contextmanager
def setup() -> Iterator[Setup]:
    """The fixture: seeded, the model loaded, the batch sampled, a temporary folder for TRL."""
    torch.manual_seed(0)
    base, tokenizer = load_model()
    batch = make_batch(base, tokenizer)
    with tempfile.TemporaryDirectory() as out_dir:
        yield Setup(base, tokenizer, batch, out_dir)


SETUP = Fixture(setup)


def _loss(ours: torch.Tensor, theirs: torch.Tensor, params: list[torch.Tensor], their_grad: torch.Tensor) -> Comparison:
    """Two scalar losses (float64, so their difference is that of the printed numbers) and their gradients over
    ``params``; TRL's gradient was taken first."""
    return Comparison(torch.tensor(ours.item(), dtype=torch.float64), torch.tensor(theirs.item(), dtype=torch.float64),
                      _grads(ours, params), their_grad, shown=(ours.item(), theirs.item()))


def _vector(ours: torch.Tensor, theirs: torch.Tensor) -> Comparison:
    """A (B,) result: the report shows each side's largest |A|."""
    return Comparison(ours, theirs, shown=(float(ours.abs().max()), float(theirs.abs().max())))


# --------------------------------------------------------------------------------------------
# The comparisons
# --------------------------------------------------------------------------------------------


def trl_logps(trainer, model, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's own forward for the current per-token log-probs (with gradient) and entropies, (B, T) each:
    the loss rows compare loss formulas on identical log-probs; ``forward`` compares the forwards."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    logps, entropies, _ = trainer._get_per_token_logps_and_entropies(model, ids, attention, ids.size(1) - inputs["prompt_ids"].size(1),
                                                                     compute_entropy=True)
    return logps, entropies


def _batch_inputs(batch: Batch) -> dict:
    return {"prompt_ids": batch.prompt_ids, "prompt_mask": batch.prompt_mask, "completion_ids": batch.completion_ids,
            "completion_mask": batch.completion_mask}


def forward(s: Setup) -> Comparison:
    """Our ``per_token_logps`` (padding skipped in the positions) against TRL's forward (padding counted) on the
    batch, policy moved as at mu > 1: the log-probs and entropies over active tokens, and the gradient of the
    log-probs' sum."""
    model = copy.deepcopy(s.base).train()
    trainer = grpo_trainer(model, s.tokenizer, s.out_dir, beta=0.0)
    perturb_(model, POLICY_NOISE, seed=2)
    batch, mask = s.batch, s.batch.completion_mask
    params = [p for p in model.parameters() if p.requires_grad]
    theirs, their_entropy = trl_logps(trainer, model, _batch_inputs(batch))
    their_grad = _grads((theirs * mask).sum(), params)
    ours, our_entropy = per_token_logps(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, mask,
                                        with_entropy=True)
    entropy_diff = float(((our_entropy - their_entropy) * mask).abs().max())
    return Comparison(ours * mask, theirs * mask, _grads((ours * mask).sum(), params), their_grad,
                      shown=(float((ours * mask).sum()), float((theirs * mask).sum())), also=entropy_diff,
                      note=f"entropy max diff {entropy_diff:.1e}")


def _trl_grpo_inputs(s: Setup, cfg: LossConfig):
    """A GRPOTrainer with ``cfg`` that has run its own generate-and-score step on the batch, the policy moved after
    it at mu > 1: (model, trainer, inputs)."""
    model = copy.deepcopy(s.base).train()
    trainer = grpo_trainer(model, s.tokenizer, s.out_dir, rollout_func=s.batch.rollout, mu=cfg.mu, **cfg.ours())
    if cfg.beta > 0:
        perturb_(trainer.ref_model, REF_NOISE, seed=1)
    if cfg.sampler:  # TRL's vLLM path without a vLLM server: generation is rollout_func's, the rest TRL's own
        trainer.use_vllm = True
        trainer._last_loaded_step = trainer.state.global_step  # no weight sync to a server
    with torch.no_grad():
        inputs = trainer._generate_and_score_completions(s.batch.examples())
    if not cfg.sampler:
        inputs.pop("sampling_per_token_logps", None)
    if cfg.mu > 1:
        perturb_(model, POLICY_NOISE, seed=2)  # the policy has moved since TRL computed the old log-probs
    return model, trainer, inputs


def grpo(cfg: LossConfig):
    """TRL prepares the inputs (old/ref log-probs, advantages, IS ratio) and computes its loss; ours is
    GRPO's loss (``GRPOConfig.loss()``) on that same inputs dict. TRL's dict holds old log-probs where TRL computed
    them (mu > 1, or its vLLM path); where it holds none, both sides take the current ones, detached."""

    def compare(s: Setup) -> Comparison:
        model, trainer, inputs = _trl_grpo_inputs(s, cfg)
        params = [p for p in model.parameters() if p.requires_grad]
        trl_loss = trainer.compute_loss(model, inputs)
        trl_grad = _grads(trl_loss, params)
        logps, entropies = trl_logps(trainer, model, inputs)
        loss = GRPOConfig(**cfg.ours(), epsilon=TRL_PINNED["epsilon"]).loss(max_completion_length=T)
        ours = loss(
            logps, inputs.get("old_per_token_logps"), inputs.get("ref_per_token_logps"),
            inputs["advantages"], inputs["completion_mask"], num_items_in_batch=float(inputs["num_items_in_batch"]),
            entropies=entropies if cfg.top_entropy_quantile < 1.0 else None,
            sampling_logps=inputs.get("sampling_per_token_logps"),
        )
        return _loss(ours, trl_loss, params, trl_grad)

    return compare


def advantages(scale: str):
    """TRL's advantages from a full generate-and-score step whose reward function returns our rewards; the largest
    difference over the batch."""

    def compare(s: Setup) -> Comparison:
        trainer = grpo_trainer(copy.deepcopy(s.base), s.tokenizer, s.out_dir, loss_type="grpo", beta=0.0,
                               scale_rewards=scale)
        rewards = torch.tensor(ADV_REWARDS)
        batch = [{"prompt": PROMPTS[i // G], "reward": r} for i, r in enumerate(rewards.tolist())]
        with torch.no_grad():
            theirs = trainer._generate_and_score_completions(batch)["advantages"].float()
        return _vector(group_advantages(rewards, G, scale), theirs)

    return compare


def rloo_loss_configs() -> list[dict]:
    return [dict(mu=mu, epsilon_high=eh) for mu, eh in itertools.product(MUS, (None, 0.28))]


def rloo_advantage_configs() -> list[dict]:
    return [dict(beta=b, normalize_advantages=n, reward_clip=c)
            for b, n, c in itertools.product((0.0, 0.05), (False, True), (None, (-0.5, 3.0)))]


def _rloo_name(cfg: dict) -> str:
    parts = [f"{k}={'-' if v is None else v}" for k, v in cfg.items()]
    return "rloo " + " ".join(parts)


def rloo(cfg: dict):
    """RLOOTrainer.compute_loss on a prepared inputs dict; its old log-probs are the sequence sums of the
    per-token tensor ours gets (at mu = 1 ours takes the current ones, detached, as RLOO.step does).
    Both losses see TRL's forward (``trl_logps``)."""

    def compare(s: Setup) -> Comparison:
        model = copy.deepcopy(s.base).train()
        trainer = rloo_trainer(model, s.tokenizer, s.out_dir, beta=0.0, mu=cfg["mu"], epsilon_high=cfg["epsilon_high"])
        mask = s.batch.completion_mask
        inputs = {**_batch_inputs(s.batch), "advantages": rloo_advantages(s.batch.rewards, G)}
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
        return _loss(ours, trl_loss, params, trl_grad)

    return compare


def _rloo_kl(trainer, out: dict) -> torch.Tensor:
    """The k1 KL per completion from our own forwards of the policy and TRL's reference on TRL's completions."""
    args = (out["prompt_ids"], out["prompt_mask"], out["completion_ids"], out["completion_mask"])
    return ((per_token_logps(trainer.model, *args) - per_token_logps(trainer.ref_model, *args))
            * out["completion_mask"]).sum(1)


def rloo_advantages_of(cfg: dict):
    """RLOOTrainer's advantages from a whole ``_generate_and_score_completions`` (it samples; the reward
    function returns preset rewards), against ``rloo_advantages`` with the k1 KL from our own forwards of
    the policy and TRL's (perturbed) reference on TRL's completions."""

    def compare(s: Setup) -> Comparison:
        clip = cfg["reward_clip"]
        low, high = (None, None) if clip is None else clip
        trainer = rloo_trainer(copy.deepcopy(s.base), s.tokenizer, s.out_dir, beta=cfg["beta"],
                               normalize_advantages=cfg["normalize_advantages"], reward_clip_min=low,
                               reward_clip_max=high)
        if cfg["beta"] > 0:
            perturb_(trainer.ref_model, REF_NOISE, seed=1)
        rewards = torch.tensor(ADV_REWARDS)
        batch = [{"prompt": PROMPTS[i // G], "reward": r} for i, r in enumerate(rewards.tolist())]
        with torch.no_grad():
            out = trainer._generate_and_score_completions(batch)
            kl = _rloo_kl(trainer, out) if cfg["beta"] > 0 else None
        ours = rloo_advantages(rewards, G, kl=kl, kl_coef=cfg["beta"], normalize=cfg["normalize_advantages"],
                               reward_clip_min=low, reward_clip_max=high)
        return _vector(ours, out["advantages"].float())

    return compare


def _dpo_pairs(tokenizer) -> tuple[torch.Tensor, ...]:
    """Two pairs, chosen rows first, then rejected rows (TRL's batch layout); equal-length prompts, and completions
    of different lengths, each ending in EOS and right-padded: (prompt ids, prompt mask, completion ids, mask)."""
    prompt = ["ravin likes ", "carol likes "]
    chosen, rejected = ["pizza", "sushi"], ["pasta", "burgers"]
    completions = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in chosen + rejected]
    width = max(map(len, completions))
    c_ids = torch.tensor([c + [tokenizer.pad_token_id] * (width - len(c)) for c in completions])
    c_mask = torch.tensor([[1] * len(c) + [0] * (width - len(c)) for c in completions])
    p_ids = tokenizer(prompt * 2, add_special_tokens=False, return_tensors="pt")["input_ids"]
    return p_ids, torch.ones_like(p_ids), c_ids, c_mask


def _dpo_trainer(s: Setup, beta: float):
    """A DPOTrainer on a copy of the model, its reference a perturbed copy (so the log-ratios are not 0)."""
    trl_ref.silence()
    model = copy.deepcopy(s.base)
    ref = copy.deepcopy(s.base).eval()
    perturb_(ref, 0.02, seed=1)
    pairs = _dataset({"prompt": ["ravin likes "] * 2, "chosen": ["pizza"] * 2, "rejected": ["pasta"] * 2})
    args = trl_ref.config(s.out_dir, {"beta": beta}, trainer="dpo", loss_type=["sigmoid"], precompute_ref_log_probs=False)
    return model, ref, trl_ref.trainer(args, model=model, ref_model=ref, train_dataset=pairs, processing_class=s.tokenizer)


def dpo(beta: float = 0.1):
    """DPO sigmoid loss: TRL's DPOTrainer.compute_loss (policy and reference forwards inside TRL) vs ours."""

    def compare(s: Setup) -> Comparison:
        model, ref, trainer = _dpo_trainer(s, beta)
        p_ids, p_mask, c_ids, c_mask = _dpo_pairs(s.tokenizer)
        inputs = {"input_ids": torch.cat([p_ids, c_ids], 1), "attention_mask": torch.cat([p_mask, c_mask], 1),
                  "completion_mask": torch.cat([torch.zeros_like(p_ids), c_mask], 1)}
        params = [q for q in model.parameters() if q.requires_grad]
        model.train()
        trl_loss = trainer.compute_loss(model, inputs)
        trl_grad = _grads(trl_loss, params)

        def seq_logps(m):
            return (per_token_logps(m, p_ids, p_mask, c_ids, c_mask) * c_mask).sum(-1)

        pol = seq_logps(model)
        with torch.no_grad():
            reference = seq_logps(ref)
        n = p_ids.size(0) // 2
        return _loss(dpo_loss(pol[:n], pol[n:], reference[:n], reference[n:], beta=beta), trl_loss, params, trl_grad)

    return compare


# --------------------------------------------------------------------------------------------
# The configurations and the case module
# --------------------------------------------------------------------------------------------


def _config(check: str, knobs: str, compare, tolerance: Tolerance, family: str, loss_type: str, theirs: str,
            skip: Optional[str] = None) -> Config:
    return Config("trl", check, loss_type, theirs, knobs, "pizza", 0, compare, tolerance, SETUP, skip=skip,
                  family=family)


def grpo_config(cfg: LossConfig) -> Config:
    return _config("grpo_loss", cfg.name, grpo(cfg), LOSS, cfg.family, cfg.loss_type, "GRPOTrainer.compute_loss",
                   skip_reason(cfg))


def extra_configs() -> list[Config]:
    """Our forward, RLOO's loss and advantages, GRPO's advantages per scale, and DPO."""
    configs = [_config("logprobs", "per-token log-probs, left-padded prompt", forward, FORWARD, "forward", "-",
                       "GRPOTrainer._get_per_token_logps_and_entropies")]
    configs += [_config("rloo_loss", _rloo_name(cfg), rloo(cfg), LOSS, "rloo", "rloo", "RLOOTrainer.compute_loss")
                for cfg in rloo_loss_configs()]
    configs += [_config("rloo_advantages", _rloo_name(cfg), rloo_advantages_of(cfg), ADVANTAGES, "rloo", "rloo",
                        "RLOOTrainer._generate_and_score_completions") for cfg in rloo_advantage_configs()]
    configs += [_config("advantages", f"scale_rewards={scale}", advantages(scale), ADVANTAGES, "group_advantages",
                        "grpo", "GRPOTrainer._generate_and_score_completions") for scale in SCALES]
    configs.append(_config("dpo_loss", "sigmoid beta=0.1, 2 pairs", dpo(0.1), LOSS, "dpo", "dpo",
                           "DPOTrainer.compute_loss"))
    return configs


_SAPO_OBJECTIVE = policy_losses.SAPO.objective


def _plant_sapo_temperature(self, x):
    wrong = dataclasses.replace(self.options, sapo_temperature_neg=self.options.sapo_temperature_neg * 1.01)
    return _SAPO_OBJECTIVE(policy_losses.SAPO(wrong), x)


PLANTS = (
    Plant("sapo-temperature", "SAPO's negative-advantage temperature 1% off", ("grpo_loss",),
          lambda: patched(policy_losses.SAPO, "objective", _plant_sapo_temperature)),
)


@register_cases
class TrlCases(CaseModule):
    """TRL 1.16's trainers, on one fixed batch (``cases`` do not apply)."""

    name, adapter, check, plants = trl_ref.FRAMEWORK, trl_ref.Trl, "trl", PLANTS

    def configs(self, cases: Sequence[str] = ()) -> list[Config]:
        return [grpo_config(cfg) for cfg in loss_configs()] + extra_configs()
