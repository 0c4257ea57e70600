"""TRL 1.16 as a reference: its ``GRPOConfig`` / ``RLOOConfig`` / ``DPOConfig`` built from our settings (``config``),
its trainers built on them (``trainer``), and the few TRL conventions a check or a bench has to work around.

TRL is the suite's own dependency (installed, unlike verl, OpenRLHF and TRL 1.12, which ``install`` fetches), and
its numbers come from its real trainers, so this adapter builds objects rather than calling loose functions: the
reference check (its case module ``benchmarks/checks/cases/trl.py``) and the step benchmark (``perf/vs_trl.py``)
build TRL's config here, from settings in our names. ``KNOBS`` renames our options to TRL's, ``POLICY_LOSSES`` maps our loss types to TRL's
``loss_type`` values; a setting TRL has no counterpart for is refused with the list of those it has.

TRL is imported when a config or trainer is built, not when this module is: the tables read without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import warnings
from typing import Any, Mapping, Optional
from unittest import mock

from algorithms.rollout import eos_token_ids
from benchmarks.references import install
from benchmarks.references.adapters import Adapter, register_adapter

FRAMEWORK = "trl"
VERSION = "1.16.0"  # the TRL the mapping was written against, pinned in pyproject.toml (the results record the one used)

# Our policy loss (loss_type) -> TRL's GRPOConfig.loss_type. TRL's loss type names its aggregation too (grpo and
# sapo: per-sequence token means; bnpo: local token mean; dr_grpo: / (B x max_completion_length); dapo, cispo,
# vespo: global token mean; luspo: length-weighted sequences), as ours do (algorithms.policy_losses.POLICY_LOSSES). verl's
# losses (dual_clip, gmpo, clip_cov, kl_cov, dppo_tv, dppo_kl) have no TRL counterpart.
POLICY_LOSSES = {"grpo": "grpo", "bnpo": "bnpo", "dr_grpo": "dr_grpo", "dapo": "dapo", "cispo": "cispo", "sapo": "sapo",
                 "luspo": "luspo", "vespo": "vespo"}
# Our LOSS_AGGREGATIONS name -> the TRL loss_type that aggregates that way (TRL has no separate aggregation option).
AGGREGATIONS = {"grpo": "grpo", "seq-mean-token-mean": "grpo", "bnpo": "bnpo", "dr_grpo": "dr_grpo", "dapo": "dapo",
                "luspo": "luspo"}
# Our level -> TRL's importance_sampling_level (sequence: GSPO's ratio).
LEVELS = {"token": "token", "sequence": "sequence"}
SEQUENCE_LEVEL_LOSS = "importance_sampling_level='sequence'"
# Our advantage scale (scale_rewards) -> TRL's scale_rewards.
SCALES = {"group": "group", "batch": "batch", "none": "none"}
# Our KL_PENALTIES name -> TRL's KL term: k3 is the only one GRPOTrainer has (RLOOTrainer folds k1 into the reward).
KL = {"k3": "k3 (GRPOTrainer's per-token KL)", "k1": "k1 in the reward (RLOOTrainer)"}
# Our advantage estimator -> the TRL trainer whose advantages it is.
ESTIMATORS = {"grpo": "GRPOTrainer (scale_rewards)", "rloo": "RLOOTrainer"}

# Our option (GRPOConfig / RLOOConfig / DPOConfig field, or RunConfig's sampling and length) -> TRL's config field.
# The order keeps the renames the reference check reports in the order it always listed them.
KNOBS = {
    "group_size": "num_generations", "level": "importance_sampling_level", "mu": "num_iterations",
    "kl_bias_correction": "use_bias_correction_kl",
    "importance_sampling_correction": "vllm_importance_sampling_correction",
    "importance_sampling_mode": "vllm_importance_sampling_mode",
    "importance_sampling_clip_min": "vllm_importance_sampling_clip_min",
    "importance_sampling_clip_max": "vllm_importance_sampling_clip_max",
    "mask_truncated": "mask_truncated_completions", "loss_type": "loss_type", "epsilon": "epsilon",
    "epsilon_high": "epsilon_high", "delta": "delta", "beta": "beta", "scale_rewards": "scale_rewards",
    "sapo_temperature_pos": "sapo_temperature_pos", "sapo_temperature_neg": "sapo_temperature_neg",
    "vespo_k_pos": "vespo_k_pos", "vespo_lambda_pos": "vespo_lambda_pos", "vespo_k_neg": "vespo_k_neg",
    "vespo_lambda_neg": "vespo_lambda_neg", "top_entropy_quantile": "top_entropy_quantile",
    "off_policy_mask_threshold": "off_policy_mask_threshold", "entropy_coef": "entropy_coef",
    "normalize_advantages": "normalize_advantages", "learning_rate": "learning_rate",
    "max_grad_norm": "max_grad_norm", "weight_decay": "weight_decay",
    "max_new_tokens": "max_completion_length", "temperature": "temperature", "seed": "seed", "steps": "max_steps",
}
# Our options that become a TRL field computed from more than one of ours, or that bring other fields along.
DERIVED = {
    "prompts_per_step": "per_device_train_batch_size = group_size x prompts_per_step (one generation batch per step)",
    "reward_clip_min": "reward_clip_range (one tuple)", "reward_clip_max": "reward_clip_range (one tuple)",
    "learning_rate": "learning_rate, with lr_scheduler_type constant and no warmup (ours: AdamW at a constant rate)",
}
# Our values -> TRL's, per option whose values are names.
VALUES = {"loss_type": POLICY_LOSSES, "level": LEVELS, "scale_rewards": SCALES}

TRAINERS = {"grpo": ("GRPOConfig", "GRPOTrainer"), "rloo": ("RLOOConfig", "RLOOTrainer"),
            "dpo": ("DPOConfig", "DPOTrainer")}
# Every config built here: no hub, no files, no bf16 autocast (TRL's default is bf16 where the device has it).
COMMON = {"report_to": "none", "save_strategy": "no", "bf16": False}
# The trainers that sample: every step in the log history (its rewards are read from there), and plain ancestral
# sampling as ours does (no top-k / top-p).
SAMPLING = {"logging_steps": 1, "top_k": 0, "top_p": 1.0}


def _lookup(option: str, table: Mapping[str, str], value: Any) -> str:
    if value not in table:
        raise ValueError(f"{option} {value!r} has no TRL {VERSION} counterpart; TRL has {', '.join(table)}")
    return table[value]


def settings(ours: Mapping[str, Any]) -> dict[str, Any]:
    """Our settings (our names and values) as TRL config keyword arguments (TRL's names and values)."""
    unknown = [name for name in ours if name not in KNOBS and name not in DERIVED]
    if unknown:
        raise ValueError(f"our setting {unknown[0]!r} has no TRL {VERSION} counterpart; mapped: "
                         f"{', '.join([*KNOBS, *DERIVED])}")
    theirs = {KNOBS[name]: _lookup(name, VALUES[name], value) if name in VALUES else value
              for name, value in ours.items() if name in KNOBS}
    if "prompts_per_step" in ours:
        if "group_size" not in ours:
            raise ValueError("prompts_per_step needs group_size (TRL's batch counts completions)")
        theirs["per_device_train_batch_size"] = ours["group_size"] * ours["prompts_per_step"]
    if "reward_clip_min" in ours or "reward_clip_max" in ours:
        low, high = ours.get("reward_clip_min"), ours.get("reward_clip_max")
        theirs["reward_clip_range"] = None if low is None and high is None else (low, high)
    if "learning_rate" in ours:
        theirs.update(lr_scheduler_type="constant", warmup_steps=0)
    return theirs


def config(output_dir: str, ours: Optional[Mapping[str, Any]] = None, *, trainer: str = "grpo", device: str = "cpu",
           **theirs):
    """TRL's config for ``trainer`` ("grpo", "rloo" or "dpo"): ``COMMON`` (and ``SAMPLING`` for the trainers that
    sample) on ``device`` (a device type), then ``theirs`` (TRL's own fields: the defaults a caller pins), then
    ``ours`` mapped by ``settings``; a setting of ours wins over a TRL field of the same meaning."""
    import trl

    class_name = _lookup("trainer", {k: v[0] for k, v in TRAINERS.items()}, trainer)
    cls = getattr(trl, class_name)
    mapped = settings(ours or {})
    fields = {f.name for f in dataclasses.fields(cls)}
    missing = [name for name in mapped if name not in fields]
    if missing:
        origin = (next((name for name, field in KNOBS.items() if field == missing[0]), None)
                  or next(name for name, how in DERIVED.items() if how.startswith(missing[0])))
        raise ValueError(f"TRL's {class_name} has no {missing[0]!r} (from our {origin!r})")
    base = {**COMMON, "use_cpu": device == "cpu", **(SAMPLING if trainer != "dpo" else {})}
    return cls(output_dir=output_dir, **{**base, **theirs, **mapped})


def trainer(args, **kwargs):
    """The TRL trainer for ``args`` (a config from ``config``), with ``kwargs`` (model, reward_funcs, train_dataset,
    processing_class, ...). Ready to be driven by hand: ``compute_loss`` and ``training_step`` outside
    ``Trainer.train`` read ``current_gradient_accumulation_steps``, which ``train`` sets each step."""
    import trl

    name = {config_name: trainer_name for config_name, trainer_name in TRAINERS.values()}[type(args).__name__]
    built = getattr(trl, name)(args=args, **kwargs)
    built.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    return built


@contextlib.contextmanager
def unshuffled(built):
    """TRL shuffles each generation batch (``shuffle_sequence_dict``); within this block it keeps the completions
    grouped by prompt, as ours are. The order does not change a loss."""
    with mock.patch.object(sys.modules[type(built).__module__], "shuffle_sequence_dict", lambda batch: batch):
        yield


def completion_texts(tokenizer, completion_ids, eos_ids) -> list[str]:
    """Each completion's text before its first EOS, special tokens kept: the suite's reward convention. TRL's own
    ``completions`` text drops special tokens, so a TRL reward function decodes ``completion_ids`` with this."""
    eos = set(eos_ids)
    texts = []
    for ids in completion_ids:
        ids = list(ids)
        end = next((i for i, token in enumerate(ids) if token in eos), len(ids))
        texts.append(tokenizer.decode(ids[:end], skip_special_tokens=False))
    return texts


def task_reward(task, model, tokenizer, on_score=None):
    """The reward function every TRL side of this suite hands to TRL's trainer, so both sides score alike: the task's
    reward of the text our rollout scores, each completion before its first end-of-sequence token (the rollout's own
    ids, ``algorithms.rollout.eos_token_ids``: the model's generation config, else the tokenizer's), special tokens
    kept (``completion_texts``). ``on_score(prompts, texts, completion_ids, rewards)`` sees every call."""
    eos = eos_token_ids(model, tokenizer)

    def reward(prompts, completions, completion_ids, **_):
        texts = completion_texts(tokenizer, completion_ids, eos)
        rewards = task.score(prompts, texts)
        if on_score is not None:
            on_score(prompts, texts, completion_ids, rewards)
        return rewards

    reward.__name__ = "task_reward"  # TRL logs each reward function under its name
    return reward


def silence() -> None:
    """TRL warns on many trainers built here (e.g. sequence-level bnpo) and prints progress; the tables are the
    output."""
    import datasets
    from transformers.utils import logging as hf_logging

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental"
    warnings.filterwarnings("ignore")
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()
    logging.getLogger("trl").setLevel(logging.ERROR)


def version() -> str:
    """The installed TRL's version."""
    import trl

    return trl.__version__


PPO_VERSION = install.PINNED["trl-ppo"].version  # TRL's column also holds TRL 1.12's PPO (trl_ppo.py)


def _minor(version: str) -> str:
    return version.rsplit(".", 1)[0]


@register_adapter
class Trl(Adapter):
    """TRL 1.16 in the feature table: its GRPO, RLOO and DPO trainers, in the column it shares with TRL 1.12's PPO.
    TRL 1.16's option names (``KNOBS``) are listed by ``check trl``'s report, not in the options table."""

    name, column, heading = FRAMEWORK, "TRL", f"TRL {_minor(VERSION)}"
    has = {"estimators": ESTIMATORS, "policy_losses": POLICY_LOSSES, "aggregations": AGGREGATIONS, "kl": KL,
           "corrections": {mode: f"vllm_importance_sampling_mode={mode}" for mode in
                           ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")}}
    cells = {
        "algorithms": {"grpo": "GRPOTrainer", "rloo": "RLOOTrainer", "dpo": "DPOTrainer"},
        "policy_losses": {ours: f"loss_type={theirs}" for ours, theirs in POLICY_LOSSES.items()},
        # the aggregations that are a loss type's own
        "aggregations": {ours: f"loss_type={theirs}" for ours, theirs in AGGREGATIONS.items() if ours == theirs},
        # the column's cells name both TRLs' KL (PPO's puts it in the reward)
        "kl": {"k3": f"GRPOTrainer beta (k3); PPOTrainer {PPO_VERSION} kl_estimator=k3",
               "k1": f"RLOOTrainer, PPOTrainer {PPO_VERSION} kl_estimator=k1"},
    }
    sequence_level = "importance_sampling_level=sequence"
    note = (f"The TRL column is TRL {_minor(VERSION)} (GRPO, RLOO, DPO; checked by `grpo-bench check trl`) and, for "
            f"PPO, TRL {PPO_VERSION}, the last TRL with a PPOTrainer.")
    summary_note = f"the TRL column counts TRL {_minor(VERSION)} and, for PPO, TRL {_minor(PPO_VERSION)}"
