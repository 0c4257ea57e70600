"""The two sides of every comparison with TRL, in one room for the benches (perf/) and the checks (checks/): the
workloads (a task, an algorithm and their settings, as ``grpo-bench bench grpo-vs-trl`` and ``rloo-vs-trl`` name
them), this suite's step (``Ours``) and TRL's trainer on the same task, model and reward (``Trl``, with the one
reward wrapper ``references.trl.task_reward``), and the same-batch engine: both sides' loss on one batch.

What differs by algorithm is one entry each in ``PAIRINGS`` (one shape: ``Pairing``): the config fields a workload
sets, the same-batch check against TRL's trainer of it, and how many of its workloads a bench
runs unless told. Nothing else here or in the bench branches on the algorithm.

Neither perf/ nor checks/ imports the other; both import this.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple, Optional

import torch

from algorithms.losses import group_advantages, rloo_advantages, rloo_loss, sequence_logps
from algorithms.grpo import GRPOConfig
from algorithms.rollout import Rollout, rollout_logps
from benchmarks.harness import build, measure, resolve
from benchmarks.harness.config import flat_settings
from benchmarks.harness.lora import lora_config
from benchmarks.harness.loop import run_sampling
from benchmarks.io import PHASES
from benchmarks.references import trl as trl_ref
from tasks import make_task

# A side's step in parts: the training phases, then what they leave of the step (``other``).
STEP_PARTS = (*PHASES, "other")


@dataclass(frozen=True)
class Workload:
    """One comparison: a task's starting policy and prompts, and the GRPO settings both sides use."""

    name: str
    task: str
    group_size: int
    max_new_tokens: int
    mu: int
    temperature: Optional[float] = None  # None: the task's sampling temperature
    learning_rate: Optional[float] = None  # None: the task's recommended rate
    beta: float = 0.04  # the paper's KL weight, so the reference pass is part of the step
    loss_type: str = "grpo"
    algo: str = "grpo"  # its PAIRINGS entry: "grpo", "rloo"
    prompts_per_step: int = 1  # prompts a step samples group_size completions of each
    task_options: tuple = ()  # (name, value) pairs for make_task, both sides
    lora_r: int = 0  # > 0: LoRA through PEFT on both sides, the harness's adapter (TRL: the same peft_config)
    # TRL's side runs with disable_dropout (so that it samples without dropout, as ours does), which also zeroes its
    # PEFT adapters' dropout: ours takes no LoRA dropout either, so both sides compute one function.
    lora_dropout: float = 0.0
    # Both sides' training precision: "fp32", or "bf16" (ours: --precision bf16, autocast for sampling, log-probs and
    # the update; TRL: bf16=True, accelerate's autocast around the model's forward, generation included).
    precision: str = "fp32"

    def settings(self) -> dict:
        """Our config fields of the workload's algorithm, which both sides train with: ours as its config, TRL's
        through its adapter (``PAIRINGS[algo].settings``)."""
        return PAIRINGS[self.algo].settings(self)

    def run_settings(self, *, seed: int, device: str, precision: Optional[str] = None) -> dict:
        """The workload as one run's flat settings, a matrix cell's names: both sides ``resolve`` them (at
        ``precision``, else the workload's)."""
        return {"task": self.task, "algo": self.algo, "seed": seed, "device": device,
                "precision": precision or self.precision,
                "max_new_tokens": self.max_new_tokens, "temperature": self.temperature, "lora_r": self.lora_r,
                "lora_dropout": self.lora_dropout, **self.settings(), **dict(self.task_options)}


CHAIN_SUM = (("dataset", 'chain_sum:{"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}'),)
WORKLOADS = {
    w.name: w
    for w in (
        Workload("pizza-mu1", "pizza", group_size=8, max_new_tokens=12, mu=1),
        Workload("pizza-mu2", "pizza", group_size=8, max_new_tokens=12, mu=2),
        Workload("gsm8k-mu1", "gsm8k", group_size=4, max_new_tokens=128, mu=1),
        Workload("gsm8k-mu2", "gsm8k", group_size=4, max_new_tokens=128, mu=2),
        Workload("gsm8k-lora-mu1", "gsm8k", group_size=4, max_new_tokens=128, mu=1, lora_r=16),
        Workload("gsm8k-lora-mu2", "gsm8k", group_size=4, max_new_tokens=128, mu=2, lora_r=16),
        # The real-LM track's dataset (benchmarks/matrices/reasoning_gym.toml): short answers, G 8.
        Workload("chain_sum-mu1", "reasoning_gym", group_size=8, max_new_tokens=24, mu=1, task_options=CHAIN_SUM),
        Workload("chain_sum-mu2", "reasoning_gym", group_size=8, max_new_tokens=24, mu=2, task_options=CHAIN_SUM),
        Workload("chain_sum-lora-mu1", "reasoning_gym", group_size=8, max_new_tokens=24, mu=1, task_options=CHAIN_SUM,
                 lora_r=16),
        Workload("chain_sum-lora-mu2", "reasoning_gym", group_size=8, max_new_tokens=24, mu=2, task_options=CHAIN_SUM,
                 lora_r=16),
        # RLOO as TRL's RLOOTrainer defines it: k1 KL folded into the reward, beta 0.05 (TRL's and ours)
        Workload("pizza-rloo", "pizza", group_size=8, max_new_tokens=12, mu=1, beta=0.05, algo="rloo"),
        Workload("pizza-rloo-mu2", "pizza", group_size=8, max_new_tokens=12, mu=2, beta=0.05, algo="rloo"),
    )
}

# TRL's settings each comparison runs against, side by side: its defaults, and its fastest on the device.
# TRL's GRPOConfig/RLOOConfig turn gradient checkpointing on by default (memory for time); off is faster.
TRL_SETTINGS = {"default": {}, "fastest": {"gradient_checkpointing": False}}
SIDES = ("ours", *(f"trl_{name}" for name in TRL_SETTINGS))


def workloads_of(algo: str) -> dict[str, Workload]:
    return {name: w for name, w in WORKLOADS.items() if w.algo == algo}


def default_workloads(algo: str) -> list[str]:
    """The workloads of ``algo`` a bench runs unless told: the first ``defaults`` of them."""
    return list(workloads_of(algo))[:PAIRINGS[algo].defaults]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# --------------------------------------------------------------------------------------------
# The two sides. Each exposes step(prompts) -> {"time/step", "time/<phase>", "loss", "tokens/..."}.
# --------------------------------------------------------------------------------------------


class Ours:
    """This suite's GRPO or RLOO, built by the harness as ``grpo-bench run`` builds it."""

    def __init__(self, w: Workload, *, seed: int, device: str, precision: Optional[str] = None, task=None):
        rc, config, task_options = resolve(w.run_settings(seed=seed, device=device, precision=precision))
        self.task, self.policy, self.algo, _ = build(rc, config, task_options, task)
        self.workload = w

    def step(self, prompts: list[str]) -> dict[str, float]:
        start = time.perf_counter()
        metrics = self.algo.step(prompts)
        total = time.perf_counter() - start
        phases = {p: metrics.get(f"time/{p}", 0.0) for p in PHASES}
        return {"time/step": total, **{f"time/{p}": v for p, v in phases.items()},
                "time/other": total - sum(phases.values()), "loss": metrics["loss"],
                "tokens/generated": metrics["tokens/generated"], "tokens/processed": metrics["tokens/processed"]}


class Trl:
    """TRL's GRPOTrainer (or RLOOTrainer) on the same task, model, reward and settings; driven like Trainer's
    inner loop. ``setting`` names one of TRL_SETTINGS: TRL's own defaults, or its fastest on the device."""

    def __init__(self, w: Workload, *, seed: int, device: str, task=None, setting: str = "default"):
        from datasets import Dataset

        rc, config, task_options = resolve(w.run_settings(seed=seed, device=device))  # as our side's
        self.workload = w
        self.task = task or make_task(rc.task, **task_options)
        dev = measure.resolve_device(rc.device)
        policy = self.task.load_policy(dev)
        self.tokenizer = self.task.tokenizer
        self.setting = setting
        # The workload's settings, its sampling and seed, in our names with our side's values (the task's rate and
        # temperature where the workload leaves them unset); TRL's adapter renames them.
        resolved = {**flat_settings(rc, config, task_options), **dataclasses.asdict(run_sampling(rc, self.task))}
        ours = {name: resolved[name] for name in (*w.settings(), "max_new_tokens", "temperature", "seed")}
        args = trl_ref.config(str(Path(os.environ.get("TMPDIR", "/tmp")) / "grpo-bench-trl"), ours, trainer=rc.algo,
                              device=dev.type, logging_steps=10**9, optim="adamw_torch_fused", disable_dropout=True,
                              pad_to_multiple_of=None, bf16=w.precision == "bf16", **TRL_SETTINGS[setting])
        dataset = Dataset.from_dict({"prompt": self.task.train_prompts()[:1]})
        peft = lora_config(rc) if rc.lora_r else None  # the harness's adapter
        reward = trl_ref.task_reward(self.task, policy, self.tokenizer, on_score=self._scored)
        self.trainer = trl_ref.trainer(args, model=policy, reward_funcs=[reward], train_dataset=dataset,
                                       processing_class=self.tokenizer, peft_config=peft)
        self.trainer.create_optimizer_and_scheduler(num_training_steps=10**6)
        if w.precision == "bf16":  # as Trainer.train's accelerator.prepare does: autocast around the model's forward,
            self.trainer.accelerator.prepare_model(self.trainer.model)  # so its generation runs in bf16 too
        self.model = self.trainer.model
        self.times: dict[str, float] = defaultdict(float)
        self.last_rewards: list[float] = []
        self.last_texts: list[str] = []
        self.tokens = 0
        self.positions = 0
        self._time_methods()

    def _scored(self, prompts, texts, completion_ids, rewards) -> None:
        """What the same-batch engine and the step's counts read of TRL's last reward call."""
        self.last_texts, self.last_rewards = texts, rewards
        self.tokens += sum(len(ids) for ids in completion_ids)

    def _time_methods(self) -> None:
        """Wrap TRL's phase methods on this instance with timers (the methods themselves are unchanged)."""
        t = self.trainer

        def timed(name, phase):
            method = getattr(t, name)

            def wrapper(*args, **kwargs):
                key = phase(args, kwargs) if callable(phase) else phase
                start = time.perf_counter()
                try:
                    return method(*args, **kwargs)
                finally:
                    if key:
                        self.times[key] += time.perf_counter() - start

            setattr(t, name, wrapper)

        timed("_generate", "generate")
        timed("_calculate_rewards", "score")
        timed("_get_per_token_logps_and_entropies", lambda a, k: None if torch.is_grad_enabled() else "logprobs")
        timed("_prepare_inputs", "prepare")
        original = t._generate_and_score_completions

        def generate_and_score(inputs):
            out = original(inputs)  # TRL's forward runs every prompt + completion row: B x (P + T) positions
            self.positions = out["prompt_ids"].numel() + out["completion_ids"].numel()
            return out

        t._generate_and_score_completions = generate_and_score

    def optimizer_step(self) -> None:
        t = self.trainer
        t._clip_grad_norm(self.model)
        t.optimizer.step()
        t.lr_scheduler.step()
        self.model.zero_grad()
        t.state.global_step += 1

    def step(self, prompts: list[str]) -> dict[str, float]:
        batch = [{"prompt": p} for p in prompts for _ in range(self.workload.group_size)]
        self.times.clear()
        self.tokens = 0
        losses = []
        start = time.perf_counter()
        for _ in range(self.workload.mu):  # one generation batch, reused for mu updates (num_iterations)
            losses.append(float(self.trainer.training_step(self.model, batch, None)))
            self.optimizer_step()
        total = time.perf_counter() - start
        gen, score, logps = (self.times[k] for k in ("generate", "score", "logprobs"))
        prepare = self.times["prepare"]
        return {"time/step": total, "time/generate": gen, "time/score": score, "time/logprobs": logps,
                "time/update": total - prepare, "time/other": prepare - gen - score - logps,
                "loss": sum(losses) / len(losses), "tokens/generated": float(self.tokens),
                "tokens/processed": float(self.positions)}


# --------------------------------------------------------------------------------------------
# Same loss on the same batch
# --------------------------------------------------------------------------------------------


def _trl_batch(trl: Trl, prompts: list[str]):
    """One fresh generation batch from TRL's trainer (its inputs dict, with TRL's shuffling off so completions
    stay grouped by prompt) and the same batch as our Rollout."""

    batch = [{"prompt": p} for p in prompts for _ in range(trl.workload.group_size)]
    trl.model.train()
    trl.trainer._buffered_inputs = None  # force a fresh generation batch
    with trl_ref.unshuffled(trl.trainer):
        inputs = trl.trainer._prepare_inputs(batch)
    mask = inputs["completion_mask"]
    rollout = Rollout(
        prompts=[b["prompt"] for b in batch], completions=trl.last_texts, prompt_ids=inputs["prompt_ids"],
        prompt_mask=inputs["prompt_mask"], completion_ids=inputs["completion_ids"], completion_mask=mask,
        truncated=torch.zeros(mask.size(0), dtype=torch.bool, device=mask.device), group_size=trl.workload.group_size,
    )
    return inputs, rollout


def _reference_logps(built, model, rollout, temperature: float):
    """The reference's log-probs as TRL takes them: its reference model, or with LoRA (TRL keeps none) the
    policy with its adapter switched off."""

    if built.ref_model is not None:
        return rollout_logps(built.ref_model, rollout, temperature=temperature)
    with model.disable_adapter():
        return rollout_logps(model, rollout, temperature=temperature)


def _trl_logps(t, model, inputs, rows_alone: bool = False) -> torch.Tensor:
    """(B, T) TRL's per-token log-probs of the batch, as its ``compute_loss`` takes them (its padded rows); with
    ``rows_alone`` each row run by itself without its padding: the same function in another layout, whose
    difference is transformers' own rounding."""
    mask = inputs["completion_mask"]
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], mask], dim=1)
    if not rows_alone:
        return t._get_per_token_logps_and_entropies(model, input_ids, attention_mask, mask.size(1))[0]
    out = torch.zeros(mask.shape, device=mask.device)
    for i in range(mask.size(0)):
        ids = input_ids[i][attention_mask[i].bool()][None]
        length = int(mask[i].sum())
        if length:
            out[i, :length] = t._get_per_token_logps_and_entropies(model, ids, torch.ones_like(ids), length)[0][0]
    return out


def _trl_reference_logps(t, model, inputs, rows_alone: bool) -> torch.Tensor:
    if t.ref_model is not None:
        return _trl_logps(t, t.ref_model, inputs, rows_alone)
    with model.disable_adapter():
        return _trl_logps(t, model, inputs, rows_alone)


# The parts of the same-batch loss difference (``_SameBatch.losses``): the check's key for each, the larger of its
# two stages.
_DIFF_PARTS = {"abs_diff_formula": "formula", "abs_diff_layout": "layout", "max_abs_diff_logps": "logps",
               "max_abs_diff_layout_logps": "layout_logps"}


def same_batch_check(trl: Trl, prompts: list[str]) -> dict[str, float]:
    """TRL samples and scores one batch; both losses are computed on it, before and after one TRL update.

    Our side recomputes everything it owns: per-token log-probs (``rollout_logps``), reference log-probs,
    group advantages from the rewards, and GRPO's loss (``GRPOConfig.loss()``). TRL's batch shuffling is turned off
    for this one batch (the order does not change the loss) so that completions stay grouped by prompt.

    The end-to-end difference has two sources, measured apart at each stage: the loss function (our loss on
    TRL's own log-prob tensors against TRL's loss: ``abs_diff_formula``) and the forward's rounding (our packed
    rows against TRL's padded ones: ``max_abs_diff_logps``, ``max_abs_diff_ref_logps``). Beside them,
    ``abs_diff_layout``: TRL's loss against the same loss on transformers' own log-probs with each row run alone,
    unpadded: how far a change of layout alone moves the loss inside transformers.
    """
    inputs, rollout = _trl_batch(trl, prompts)
    inputs, advantages, advantage_source, advantages_diff = _grpo_advantages(trl, inputs)
    batch = _SameBatch(trl, rollout, inputs["completion_mask"], advantages, inputs.get("ref_per_token_logps"))
    old = inputs.get("old_per_token_logps")
    sampled = batch.losses(old, inputs)
    # bf16 as a bf16 run would have it: current, old and reference log-probs all under autocast.
    sampled_bf16 = batch.losses(None, None, precision="bf16")
    out = {"loss_ours_sampled": sampled.ours, "loss_trl_sampled": sampled.theirs,
           "abs_diff_sampled": abs(sampled.ours - sampled.theirs), "max_abs_diff_advantages": advantages_diff,
           "advantages": advantage_source}
    if trl.workload.beta > 0:
        out["max_abs_diff_ref_logps"] = batch.max_diff(sampled.ref, batch.trl_ref_logps)
    if old is not None:
        out["max_abs_diff_old_logps"] = batch.max_diff(sampled.logps, old)
    # One TRL update on this batch; then the ratio (old = as sampled) and the KL are no longer trivial.
    _trl_update(trl, inputs)
    old_updated = sampled.logps if old is None else old
    updated = batch.losses(old_updated, {**inputs, "old_per_token_logps": old_updated})
    updated_bf16 = batch.losses(sampled_bf16.logps, None, precision="bf16")
    out.update({"loss_ours_updated": updated.ours, "loss_trl_updated": updated.theirs,
                "abs_diff_updated": abs(updated.ours - updated.theirs), "loss_ours_updated_bf16": updated_bf16.ours,
                "abs_diff_bf16_vs_fp32": abs(updated_bf16.ours - updated.ours),
                "abs_diff_bf16_vs_fp32_sampled": abs(sampled_bf16.ours - sampled.ours),
                "max_abs_diff_logps_bf16_vs_fp32": float(((sampled_bf16.logps - sampled.logps) * batch.mask).abs().max()),
                **{key: max(sampled.parts[part], updated.parts[part]) for key, part in _DIFF_PARTS.items()}})
    return _with_max_abs_diff(out)


def _grpo_advantages(trl: Trl, inputs: dict) -> tuple[dict, torch.Tensor, str, float]:
    """(TRL's inputs, the advantages both sides use, where they came from, the largest difference of our group
    advantages from TRL's). Where every group scored alike (common for a 135M model on GSM8K) both losses would be 0
    whatever their formulas: both sides then get the same non-zero advantages, so that the comparison, and the
    update, mean something."""
    mask = inputs["completion_mask"]
    advantages = group_advantages(torch.tensor(trl.last_rewards, device=mask.device), trl.workload.group_size, "group")
    diff = float((advantages - inputs["advantages"]).abs().max())
    if advantages.abs().gt(0).any():
        return inputs, advantages, "task rewards", diff
    advantages = torch.tensor([1.0, -1.0], device=mask.device).repeat(mask.size(0) // 2 + 1)[: mask.size(0)]
    return ({**inputs, "advantages": advantages.clone()}, advantages,
            "synthetic +1/-1 (all rewards of every group were equal)", diff)


class _Losses(NamedTuple):
    """One stage of the same-batch check: our loss, TRL's (None where not asked), our log-probs and reference
    log-probs, and the parts of the difference (_DIFF_PARTS' values; empty without TRL's loss)."""

    ours: float
    theirs: Optional[float]
    logps: torch.Tensor
    ref: Optional[torch.Tensor]
    parts: dict


@dataclass(frozen=True)
class _SameBatch:
    """The batch both sides compute their loss on: TRL's trainer and model, our Rollout of its completions, its
    completion mask, the advantages both use, and TRL's reference log-probs (None without a KL term)."""

    trl: Trl
    rollout: Rollout
    mask: torch.Tensor
    advantages: torch.Tensor
    trl_ref_logps: Optional[torch.Tensor]

    def max_diff(self, a: torch.Tensor, b: torch.Tensor) -> float:
        """The largest difference over the completions' real tokens."""
        return float((a - b)[self.mask.bool()].abs().max())

    def loss(self, logps, old, ref) -> torch.Tensor:
        """Our GRPO loss on this batch at the workload's settings (the paper's KL term, no bias correction)."""
        w = self.trl.workload
        loss = GRPOConfig(level="token", loss_type=w.loss_type, epsilon=0.2, epsilon_high=None, beta=w.beta,
                          kl_bias_correction=False).loss(max_completion_length=w.max_new_tokens)
        return loss(logps, old, ref, self.advantages, self.mask)

    def losses(self, old, inputs_for_trl: Optional[dict], precision: str = "fp32") -> _Losses:
        """Our loss from our own log-probs (under bf16 autocast with ``precision`` "bf16"), ``old`` the old
        log-probs; with ``inputs_for_trl`` also TRL's loss on them and the parts of the difference."""
        t, model, w = self.trl.trainer, self.trl.model, self.trl.workload
        autocast = torch.autocast(model.device.type, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
        with torch.no_grad(), autocast:
            logps = rollout_logps(model, self.rollout, temperature=t.temperature)
            ref = _reference_logps(t, model, self.rollout, t.temperature) if w.beta > 0 else None
        ours = float(self.loss(logps, old, ref))
        if inputs_for_trl is None:
            return _Losses(ours, None, logps, ref, {})
        with torch.no_grad():
            theirs = float(t.compute_loss(model, inputs_for_trl))
            trl_logps = _trl_logps(t, model, inputs_for_trl)
            alone = _trl_logps(t, model, inputs_for_trl, rows_alone=True)
            alone_ref = _trl_reference_logps(t, model, inputs_for_trl, rows_alone=True) if w.beta > 0 else None
        parts = {"formula": abs(float(self.loss(trl_logps, old, self.trl_ref_logps)) - theirs),
                 "layout": abs(float(self.loss(alone, old, alone_ref)) - theirs),
                 "logps": self.max_diff(logps, trl_logps), "layout_logps": self.max_diff(alone, trl_logps)}
        return _Losses(ours, theirs, logps, ref, parts)


def _trl_update(trl: Trl, inputs: dict) -> None:
    """One TRL update on the batch: its loss's backward and an optimizer step."""
    trl.trainer.compute_loss(trl.model, inputs).backward()
    trl.optimizer_step()


def _with_max_abs_diff(out: dict) -> dict:
    """A same-batch check's result with its headline: the largest of its loss and advantage differences."""
    out["max_abs_diff"] = max(out["abs_diff_sampled"], out["abs_diff_updated"], out["max_abs_diff_advantages"])
    return out


def same_batch_check_rloo(trl: Trl, prompts: list[str]) -> dict[str, float]:
    """RLOO's same-batch check: TRL's RLOOTrainer samples and scores one batch; ours recomputes the
    log-probs, the reference's, the k1 KL, ``rloo_advantages`` and ``rloo_loss`` on it, before and after
    one TRL update (then the sequence ratio is not 1)."""

    w, t, model = trl.workload, trl.trainer, trl.model
    inputs, rollout = _trl_batch(trl, prompts)
    mask = inputs["completion_mask"]
    with torch.no_grad():
        old = rollout_logps(model, rollout, temperature=t.temperature)
        ref = _reference_logps(t, model, rollout, t.temperature) if w.beta > 0 else None
    kl = sequence_logps(old - ref, mask) if ref is not None else None
    advantages = rloo_advantages(torch.tensor(trl.last_rewards, device=mask.device), w.group_size, kl=kl,
                                 kl_coef=w.beta)
    out = {"max_abs_diff_advantages": float((advantages - inputs["advantages"]).abs().max()),
           "max_abs_diff_old_logps": float((sequence_logps(old, mask) - inputs["old_logps"]).abs().max())}

    def both_losses(old_logps):
        with torch.no_grad():
            logps = rollout_logps(model, rollout, temperature=t.temperature)
            ours = rloo_loss(logps, old_logps, advantages, mask, epsilon=0.2)
            theirs = t.compute_loss(model, inputs)
        return float(ours), float(theirs)

    ours1, trl1 = both_losses(None)
    _trl_update(trl, inputs)  # one TRL update on this batch
    ours2, trl2 = both_losses(old)
    out.update({"loss_ours_sampled": ours1, "loss_trl_sampled": trl1, "abs_diff_sampled": abs(ours1 - trl1),
                "loss_ours_updated": ours2, "loss_trl_updated": trl2, "abs_diff_updated": abs(ours2 - trl2),
                "advantages": "task rewards"})
    return _with_max_abs_diff(out)


# --------------------------------------------------------------------------------------------
# Each algorithm's part, one shape: its settings, its same-batch check against TRL, its default workloads
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pairing:
    """One algorithm of ours as the workloads run it. ``settings(w)``: the config fields a workload sets, in our
    names (defaults spelled out where TRL's differ or must match). ``same_batch(trl, prompts)``: the same loss on the
    same batch against TRL's trainer of it (``references.trl.TRAINERS``).
    ``defaults``: how many of its workloads with a TRL side a bench runs unless told (None: all)."""

    settings: Callable[[Workload], dict]
    same_batch: Callable[[Trl, list[str]], dict]
    defaults: Optional[int] = None


def _group_settings(w: Workload) -> dict:
    """GRPO's and RLOO's: a group of completions per prompt, ``mu`` updates on each generation batch."""
    return {"group_size": w.group_size, "prompts_per_step": w.prompts_per_step, "mu": w.mu, "beta": w.beta,
            "learning_rate": w.learning_rate, "epsilon": 0.2, "max_grad_norm": 1.0}


def _grpo_settings(w: Workload) -> dict:
    # TRL 1.16's KL bias correction defaults to on; the paper (and ours) has no ratio on KL
    return {**_group_settings(w), "loss_type": w.loss_type, "scale_rewards": "group", "kl_bias_correction": False}


# Our algorithm's name -> its part.
PAIRINGS = {"grpo": Pairing(_grpo_settings, same_batch_check),
            "rloo": Pairing(_group_settings, same_batch_check_rloo, defaults=1)}


# --------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------


# The same-batch bar: what "the same loss on the same batch" holds both sides to.
SAME_LOSS_ATOL = 1e-6
# Our per-token log-probs (current and reference) against TRL's on the same batch. Two fp32 forwards of a 30-layer
# model in different layouts differ by rounding: in results/same_batch (30 batches, SmolLM2-135M) ours (packed rows)
# against TRL's (padded) reach 3.4e-5, and transformers against itself (each row alone, unpadded) 4.6e-5. A mistake
# in what is computed (a temperature 1% off already fails it: tested; a token shift, a mask, the adapter left on in
# the reference pass) moves them by far more.
SAME_LOGPS_ATOL = 1e-4


# The parts of a same-batch check's difference that its reports show: (its key, its column's label).
SAME_BATCH_COLUMNS = (("max_abs_diff", "loss, end to end"), ("abs_diff_formula", "loss function"),
                      ("max_abs_diff_advantages", "advantages"), ("max_abs_diff_logps", "log-probs"),
                      ("max_abs_diff_ref_logps", "reference log-probs"), ("abs_diff_layout", "transformers alone: loss"),
                      ("max_abs_diff_layout_logps", "transformers alone: log-probs"))


def same_loss_misses(check: dict) -> list[str]:
    """Why a same-batch check fails the bar ([] when it holds). Where the check measured its parts: the loss
    function on TRL's own log-probs within SAME_LOSS_ATOL, the advantages likewise, and our log-probs within
    SAME_LOGPS_ATOL of TRL's (the forward's rounding, which reaches the end-to-end loss at about 1e-6: reported
    beside it, with what transformers' own change of layout gives). A check from before the parts were measured
    (and RLOO's) holds the end-to-end loss to SAME_LOSS_ATOL."""
    if "abs_diff_formula" not in check:
        return [] if check["max_abs_diff"] <= SAME_LOSS_ATOL else [f"loss differs by {check['max_abs_diff']:.1e}"]
    misses = []
    if not check["abs_diff_formula"] <= SAME_LOSS_ATOL:
        misses.append(f"loss function differs by {check['abs_diff_formula']:.1e}")
    if not check["max_abs_diff_advantages"] <= SAME_LOSS_ATOL:
        misses.append(f"advantages differ by {check['max_abs_diff_advantages']:.1e}")
    logps = max(check["max_abs_diff_logps"], check.get("max_abs_diff_ref_logps", 0.0))
    if not logps <= SAME_LOGPS_ATOL:
        misses.append(f"log-probs differ by {logps:.1e}")
    return misses
