"""``grpo-bench check trl``: our GRPO loss, group advantages and DPO loss against TRL's own code.

Every TRL number here comes out of a real ``trl.GRPOTrainer`` / ``trl.DPOTrainer`` built on the pizza
task's tiny Llama (no hub access): the GRPO loss from ``GRPOTrainer.compute_loss`` on prepared inputs,
the advantages from ``GRPOTrainer._generate_and_score_completions`` (TRL computes them inline there, not
in a function of their own, so the whole generate-and-score step runs with a reward function that
returns preset rewards), and the DPO loss from ``DPOTrainer.compute_loss``. Our side uses
``algorithms.rollout.per_token_logps`` and ``algorithms.losses`` on the same model and inputs.

TRL's defaults are not DeepSeekMath's GRPO, so every setting that differs is set explicitly
(``TRL_PINNED``) and printed with the results: loss_type (TRL default "dapo"), beta (TRL default 0),
bf16 autocast (TRL default on), use_bias_correction_kl (TRL default on), epsilon, temperature.

Gradient agreement is max_i |g_ours_i - g_trl_i| / max_i |g_trl_i| over the flattened gradient of all
model parameters (an element-wise relative error is undefined where a gradient entry is ~0).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import logging
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from algorithms.losses import dpo_loss, group_advantages, grpo_loss
from algorithms.rollout import per_token_logps, tokenize_prompts
from benchmarks.io import atomic_write_json, atomic_write_text

LOSS_TOL = 1e-6
GRAD_TOL = 1e-5
ADV_TOL = 1e-6
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
LEVELS = ("token", "sequence")
BETAS = (0.0, 0.04)
MUS = (1, 2)
EPSILON_HIGHS = (None, 0.28)
SCALES = ("group", "batch", "none")

# Settings where TRL's defaults differ from DeepSeekMath's GRPO (or that could silently change numbers);
# each is passed explicitly to every trainer built here.
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
}

G = 4  # completions per prompt
T = 7  # completion width = max_completion_length (dr_grpo's constant normaliser)
PROMPTS = ("ravin likes ", "bob likes ")  # different lengths: the shorter one is left-padded


@dataclass
class CheckRow:
    check: str  # "grpo_loss", "advantages" or "dpo_loss"
    config: str
    ours: float
    trl: float
    diff: float
    grad_rel_err: Optional[float]
    passed: bool


# --------------------------------------------------------------------------------------------
# Inputs and trainers
# --------------------------------------------------------------------------------------------


def load_model():
    from tasks.pizza import RECIPE, build_pizza_model
    from tasks.tiny_lm import cached_model

    model, tokenizer = cached_model("pizza", RECIPE, lambda: build_pizza_model(RECIPE))
    return model.float().train(), tokenizer


def grpo_inputs(model, tokenizer, seed: int = 0) -> dict:
    """TRL's prepared-input dict: left-padded prompts, ragged right-padded completions, advantages,
    reference log-probs and a perturbed copy of the current log-probs (the mu = 2 "old" policy)."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [p for p in PROMPTS for _ in range(G)]
    prompt_ids, prompt_mask = tokenize_prompts(tokenizer, prompts, "cpu")  # (B, P)
    B = len(prompts)
    first_real = len(tokenizer.all_special_tokens)  # char tokens follow <pad> <eos> <unk>
    ids = torch.randint(first_real, len(tokenizer), (B, T), generator=gen)
    lengths = torch.tensor([1, 3, 7, 5, 2, 7, 4, 6])  # tokens up to and including EOS; 7 without EOS = truncated
    positions = torch.arange(T)
    mask = (positions < lengths.unsqueeze(1)).long()  # (B, T)
    eos_at = (positions == (lengths - 1).unsqueeze(1)) & (lengths < T).unsqueeze(1)
    ids = torch.where(eos_at, torch.full_like(ids, tokenizer.eos_token_id), ids)
    ids = torch.where(mask.bool(), ids, torch.full_like(ids, tokenizer.pad_token_id))
    rewards = torch.tensor([4.0, 0.0, 0.0, 4.0, 0.0, 0.0, 0.0, 4.0])
    with torch.no_grad():
        logps = per_token_logps(model, prompt_ids, prompt_mask, ids, mask)
    noise = lambda scale: scale * torch.randn(B, T, generator=gen)  # noqa: E731
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": ids,
        "completion_mask": mask,
        "advantages": group_advantages(rewards, G, "group"),
        "num_items_in_batch": mask.sum(),
        "ref_per_token_logps": (logps + noise(0.3)) * mask,
        "old_per_token_logps": (logps + noise(0.3)) * mask,  # std 0.3 pushes many ratios out of [0.8, 1.28]
    }


def _silence():
    """TRL warns on every trainer built here (e.g. sequence-level bnpo); the table is the output."""
    import datasets
    from transformers.utils import logging as hf_logging

    warnings.filterwarnings("ignore")
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()
    logging.getLogger("trl").setLevel(logging.ERROR)


def grpo_trainer(model, tokenizer, out_dir: str, **overrides):
    """A real GRPOTrainer on ``model`` with TRL_PINNED plus ``overrides`` (loss_type, beta, ...)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    _silence()
    settings = {**TRL_PINNED, **overrides}
    args = GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=len(PROMPTS) * G, num_generations=G,
        max_completion_length=T, report_to="none", save_strategy="no", logging_steps=1, **settings,
    )
    dataset = Dataset.from_dict({"prompt": list(PROMPTS) * 4, "reward": [0.0] * (len(PROMPTS) * 4)})
    trainer = GRPOTrainer(model=model, reward_funcs=preset_reward, args=args, train_dataset=dataset,
                          processing_class=tokenizer)
    # Trainer.train() sets this each step; compute_loss divides by it in train mode.
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    return trainer


def preset_reward(prompts, completions, reward, **kwargs):
    """TRL reward function returning the dataset's ``reward`` column: lets the check choose the rewards."""
    return list(reward)


def _grads(loss: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)])


def grad_rel_err(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours - theirs).abs().max() / theirs.abs().max().clamp(min=1e-30))


# --------------------------------------------------------------------------------------------
# The checks
# --------------------------------------------------------------------------------------------


def loss_configs() -> list[dict]:
    """The full grid, plus our kl_bias_correction against TRL's use_bias_correction_kl (beta > 0)."""
    grid = [
        dict(loss_type=lt, level=lv, beta=b, mu=mu, epsilon_high=eh, kl_bias_correction=False)
        for lt, lv, b, mu, eh in itertools.product(LOSS_TYPES, LEVELS, BETAS, MUS, EPSILON_HIGHS)
    ]
    corrected = [
        dict(loss_type=lt, level=lv, beta=0.04, mu=mu, epsilon_high=None, kl_bias_correction=True)
        for lt, lv, mu in itertools.product(LOSS_TYPES, LEVELS, MUS)
    ]
    return grid + corrected


def config_name(cfg: dict) -> str:
    eh = "-" if cfg["epsilon_high"] is None else cfg["epsilon_high"]
    name = f"{cfg['loss_type']}/{cfg['level']} beta={cfg['beta']} mu={cfg['mu']} eps_high={eh}"
    return name + (" kl_bias_correction" if cfg["kl_bias_correction"] else "")


def check_grpo_loss(base_model, tokenizer, inputs: dict, cfg: dict, out_dir: str) -> CheckRow:
    model = copy.deepcopy(base_model)
    trainer = grpo_trainer(
        model, tokenizer, out_dir, loss_type=cfg["loss_type"], importance_sampling_level=cfg["level"],
        beta=cfg["beta"], num_iterations=cfg["mu"], epsilon_high=cfg["epsilon_high"],
        use_bias_correction_kl=cfg["kl_bias_correction"],
    )
    batch = dict(inputs)
    if cfg["mu"] == 1:
        del batch["old_per_token_logps"]  # TRL then uses per_token_logps.detach(), as we do with None
    if cfg["beta"] == 0:
        del batch["ref_per_token_logps"]
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()

    trl_loss = trainer.compute_loss(model, batch)
    trl_grad = _grads(trl_loss, params)

    logps = per_token_logps(model, batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"],
                            batch["completion_mask"], temperature=TRL_PINNED["temperature"])
    ours = grpo_loss(
        logps, batch.get("old_per_token_logps"), batch.get("ref_per_token_logps"), batch["advantages"],
        batch["completion_mask"], level=cfg["level"], loss_type=cfg["loss_type"], epsilon=TRL_PINNED["epsilon"],
        epsilon_high=cfg["epsilon_high"], beta=cfg["beta"], max_completion_length=T,
        kl_bias_correction=cfg["kl_bias_correction"], num_items_in_batch=float(batch["num_items_in_batch"]),
    )
    our_grad = _grads(ours, params)
    diff = abs(ours.item() - trl_loss.item())
    rel = grad_rel_err(our_grad, trl_grad)
    return CheckRow("grpo_loss", config_name(cfg), ours.item(), trl_loss.item(), diff, rel,
                    diff <= LOSS_TOL and rel <= GRAD_TOL)


def check_advantages(base_model, tokenizer, scale: str, out_dir: str) -> list[CheckRow]:
    """TRL's advantages from a full generate-and-score step whose reward function returns our rewards."""
    trainer = grpo_trainer(copy.deepcopy(base_model), tokenizer, out_dir, loss_type="grpo", beta=0.0,
                           scale_rewards=scale)
    # Group 1 has two distinct values, group 2 ties three ways, and group 3 has zero std (advantage 0).
    rewards = torch.tensor([4.0, 0.0, 0.0, 1.5, 2.0, 2.0, 2.0, -1.0])
    batch = [{"prompt": PROMPTS[i // G], "reward": r} for i, r in enumerate(rewards.tolist())]
    with torch.no_grad():
        trl_adv = trainer._generate_and_score_completions(batch)["advantages"].float()
    ours = group_advantages(rewards, G, scale)
    rows = []
    for i in range(len(rewards)):
        diff = abs(ours[i].item() - trl_adv[i].item())
        rows.append(CheckRow("advantages", f"scale_rewards={scale} completion {i} (reward {rewards[i].item():g})",
                             ours[i].item(), trl_adv[i].item(), diff, None, diff <= ADV_TOL))
    return rows


def check_dpo(base_model, tokenizer, out_dir: str, beta: float = 0.1) -> CheckRow:
    """DPO sigmoid loss: TRL's DPOTrainer.compute_loss (policy and reference forwards inside TRL) vs ours."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    _silence()
    model = copy.deepcopy(base_model)
    ref = copy.deepcopy(base_model).eval()
    with torch.no_grad():  # a reference that differs from the policy, so the log-ratios are not 0
        gen = torch.Generator().manual_seed(1)
        for p in ref.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=gen))
    pairs = Dataset.from_dict({"prompt": ["ravin likes "] * 2, "chosen": ["pizza"] * 2, "rejected": ["pasta"] * 2})
    args = DPOConfig(output_dir=out_dir, beta=beta, loss_type=["sigmoid"], bf16=False, use_cpu=True,
                     report_to="none", save_strategy="no", precompute_ref_log_probs=False)
    trainer = DPOTrainer(model=model, ref_model=ref, args=args, train_dataset=pairs, processing_class=tokenizer)
    trainer.current_gradient_accumulation_steps = 1

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
                    diff <= LOSS_TOL and rel <= GRAD_TOL)


def run_checks(progress=None) -> list[CheckRow]:
    torch.manual_seed(0)
    base, tokenizer = load_model()
    inputs = grpo_inputs(base, tokenizer)
    rows: list[CheckRow] = []
    with tempfile.TemporaryDirectory() as out_dir:
        for cfg in loss_configs():
            rows.append(check_grpo_loss(base, tokenizer, inputs, cfg, out_dir))
            if progress:
                progress(rows[-1])
        for scale in SCALES:
            rows.extend(check_advantages(base, tokenizer, scale, out_dir))
        rows.append(check_dpo(base, tokenizer, out_dir))
    return rows


# --------------------------------------------------------------------------------------------
# Report and command
# --------------------------------------------------------------------------------------------


def _fmt(x: Optional[float]) -> str:
    if x is None:
        return "-"
    return f"{x:.3e}" if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e4) else f"{x:.6f}"


def markdown_table(rows: list[CheckRow]) -> str:
    lines = ["| check | config | ours | TRL | abs diff | grad rel err | pass |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.check} | {r.config} | {_fmt(r.ours)} | {_fmt(r.trl)} | {_fmt(r.diff)} | "
                     f"{_fmt(r.grad_rel_err)} | {'yes' if r.passed else '**NO**'} |")
    return "\n".join(lines)


def report(rows: list[CheckRow], trl_version: str) -> str:
    failed = [r for r in rows if not r.passed]
    worst = lambda check, key: max([getattr(r, key) or 0.0 for r in rows if r.check == check], default=0.0)  # noqa: E731
    pinned = ", ".join(f"{k}={v}" for k, v in TRL_PINNED.items())
    return "\n".join([
        f"# GRPO and DPO losses against TRL {trl_version}",
        "",
        "Generated by `grpo-bench check trl`. TRL numbers come from a real `trl.GRPOTrainer.compute_loss`, "
        "`GRPOTrainer._generate_and_score_completions` (advantages) and `trl.DPOTrainer.compute_loss`, on the "
        "pizza task's tiny Llama, fp32 on CPU.",
        "",
        f"TRL settings pinned explicitly (its defaults differ from DeepSeekMath's GRPO): {pinned}; loss_type, "
        "beta, num_iterations, importance_sampling_level and epsilon_high as in each row.",
        "",
        "The inputs include a left-padded prompt. TRL's log-prob forward passes no position ids (padding "
        "counts as positions) while ours skip the padding; the pizza model uses RoPE, where only relative "
        "positions matter, so both agree to float rounding.",
        "",
        f"Tolerances: loss |diff| <= {LOSS_TOL:g}, gradient max|diff|/max|g_TRL| <= {GRAD_TOL:g}, "
        f"advantage |diff| <= {ADV_TOL:g}.",
        "",
        f"**{len(rows) - len(failed)}/{len(rows)} checks pass.** Largest GRPO loss diff {worst('grpo_loss', 'diff'):.2e}, "
        f"largest gradient rel err {worst('grpo_loss', 'grad_rel_err'):.2e}; largest advantage diff "
        f"{worst('advantages', 'diff'):.2e}; DPO loss diff {worst('dpo_loss', 'diff'):.2e}.",
        "",
        markdown_table(rows),
        "",
    ])


def write_results(rows: list[CheckRow], out: Path) -> None:
    import trl

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "report.md", report(rows, trl.__version__))
    atomic_write_json(out / "results.json", {
        "trl_version": trl.__version__, "torch_version": torch.__version__, "trl_pinned": TRL_PINNED,
        "tolerances": {"loss": LOSS_TOL, "grad_rel": GRAD_TOL, "advantage": ADV_TOL},
        "rows": [dataclasses.asdict(r) for r in rows],
    })
    header = "check,config,ours,trl,abs_diff,grad_rel_err,passed\n"
    body = "".join(f"{r.check},\"{r.config}\",{r.ours!r},{r.trl!r},{r.diff!r},"
                   f"{'' if r.grad_rel_err is None else repr(r.grad_rel_err)},{r.passed}\n" for r in rows)
    atomic_write_text(out / "results.csv", header + body)


def cmd_check_trl(args) -> int:
    import trl

    print(f"TRL {trl.__version__}; pinned TRL settings: {TRL_PINNED}")
    rows = run_checks(progress=lambda r: print(f"{'ok  ' if r.passed else 'FAIL'} {r.config}: ours {r.ours:.8f} "
                                                    f"TRL {r.trl:.8f} diff {r.diff:.1e} grad {r.grad_rel_err:.1e}"))
    print(markdown_table(rows))
    write_results(rows, Path(args.out))
    failed = sum(not r.passed for r in rows)
    print(f"{len(rows) - failed}/{len(rows)} checks pass -> {args.out}")
    return 1 if failed else 0
