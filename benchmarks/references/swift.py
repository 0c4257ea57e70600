"""ms-swift 4.6.0 as a reference: the GRPO trainer's loss (``swift/rlhf_trainers/grpo_trainer.py``,
``GRPOTrainer._compute_loss_and_metrics``) for its loss types ``real`` (REAL, arXiv 2602.05630) and ``fipo`` (FIPO,
arXiv 2603.19835, with ``_compute_fipo_influence``), read from its file and never imported: the trainer module
imports vLLM, ModelScope and ms-swift's own pinned TRL stack.

The three methods the loss needs -- ``_compute_loss_and_metrics``, ``_compute_fipo_influence`` and
``_undo_gradient_accumulation_scaling`` -- are compiled from their own source (``ast`` finds them in the class; a
method that is not there is an error, never a fallback) and bound to a stand-in trainer holding the few settings they
read (``SwiftLoss``). The forward is the one part replaced: ``_get_per_token_logps_and_entropies`` returns our
log-probs, so that the gradient flows to them. The distributed helpers the methods call (``gather_object``, the
accelerator's ``gather_for_metrics``) are those of one process: they return their argument.
"""

from __future__ import annotations

import ast
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

import torch

from benchmarks.references import install
from benchmarks.references.adapters import Adapter, register_adapter

FRAMEWORK = "ms-swift"
VERSION = install.PINNED[FRAMEWORK].version
RELATIVE = "swift/rlhf_trainers/grpo_trainer.py"
CLASS = "GRPOTrainer"
METHODS = ("_compute_loss_and_metrics", "_compute_fipo_influence", "_undo_gradient_accumulation_scaling")
CONSTANTS = ("WINDOW_NORMALIZED_LOSS_TYPES",)

# Our policy loss (loss_type) -> ms-swift's loss_type; its aggregation is the loss type's own.
POLICY_LOSSES = {"grpo": "grpo", "bnpo": "bnpo", "dr_grpo": "dr_grpo", "dapo": "dapo", "cispo": "cispo",
                 "sapo": "sapo", "real": "real", "fipo": "fipo"}
AGGREGATIONS = {"grpo": "loss_type=grpo", "bnpo": "loss_type=bnpo", "dr_grpo": "loss_type=dr_grpo",
                "dapo": "loss_type=dapo"}
KL = {"k3": "k3 (clamped to [-10, 10])"}
CORRECTIONS = {mode: f"rollout_importance_sampling_mode={mode}" for mode in
               ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")}
ESTIMATORS = {"grpo": "advantage_estimator=grpo", "rloo": "advantage_estimator=rloo",
              "reinforce_plus_plus": "advantage_estimator=reinforce_plus_plus"}
KNOBS = {"epsilon": "epsilon", "epsilon_high": "epsilon_high", "beta": "beta", "loss_aggregation": "loss_type",
         "level": "importance_sampling_level=sequence", "clip_ratio_c": "delta", "real_tau": "real_tau",
         "fipo_decay_rate": "fipo_decay_rate", "fipo_clip_range": "fipo_clip_range",
         "fipo_clip_high_only": "fipo_clip_high_only", "fipo_safety_threshold": "fipo_safety_threshold"}
# Its defaults (swift/rlhf_trainers/args_mixin.py), which the adapter's keywords default to.
DEFAULTS = dict(real_tau=0.5, fipo_decay_rate=32.0, fipo_clip_range=0.2, fipo_clip_high_only=True,
                fipo_safety_threshold=4.0)

_cache: dict = {}


def _missing(what) -> install.MissingFramework:
    return install.MissingFramework(f"{install.PINNED[FRAMEWORK].label}'s {RELATIVE} lacks {what}: not the pinned file")


def _identity(x, *_, **__):
    return x


def methods() -> dict:
    """The trainer's loss methods, compiled from the file's own source, and its module constants they read."""
    if "methods" not in _cache:
        from trl.trainer.utils import nanmax, nanmin  # what the file imports them from (TRL's grpo_trainer)

        tree = ast.parse(install.source_text(FRAMEWORK, RELATIVE))
        constants = [node for node in tree.body if isinstance(node, ast.Assign)
                     and any(getattr(t, "id", None) in CONSTANTS for t in node.targets)]
        cls = next((node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == CLASS), None)
        if cls is None:
            raise _missing(f"class {CLASS}")
        found = [node for node in cls.body if isinstance(node, ast.FunctionDef) and node.name in METHODS]
        absent = sorted(set(METHODS) - {node.name for node in found})
        if absent or len(constants) != len(CONSTANTS):
            raise _missing(absent or CONSTANTS)
        namespace = {"torch": torch, "Any": Any, "Dict": Dict, "List": List, "Optional": Optional, "Tuple": Tuple,
                     "GRPOBatch": Any, "gather_object": _identity, "nanmax": nanmax, "nanmin": nanmin,
                     "logger": SimpleNamespace(info=_identity, warning=_identity)}
        exec(compile(ast.Module(body=constants + found, type_ignores=[]), str(install.source_file(FRAMEWORK, RELATIVE)),
                     "exec"), namespace)
        _cache["methods"] = namespace
    return _cache["methods"]


class SwiftLoss:
    """A stand-in GRPOTrainer: ms-swift's own loss methods bound to it, with the settings they read as its
    ``__init__`` sets them (one process, training mode, no teacher, no rollout correction, no entropy mask)."""

    def __init__(self, loss_type: str, *, group_size: int, max_completion_length: int, epsilon: float = 0.2,
                 epsilon_high: Optional[float] = None, beta: float = 0.0, delta: Optional[float] = None,
                 real_tau: float = DEFAULTS["real_tau"], fipo_decay_rate: float = DEFAULTS["fipo_decay_rate"],
                 fipo_clip_range: Optional[float] = DEFAULTS["fipo_clip_range"],
                 fipo_clip_high_only: bool = DEFAULTS["fipo_clip_high_only"],
                 fipo_safety_threshold: Optional[float] = DEFAULTS["fipo_safety_threshold"], tau_pos: float = 1.0,
                 tau_neg: float = 1.05):
        namespace = methods()
        for name in METHODS:
            setattr(self, name, namespace[name].__get__(self))
        self.loss_type, self.num_generations, self.max_completion_length = loss_type, group_size, max_completion_length
        self.epsilon_low, self.epsilon_high = epsilon, epsilon if epsilon_high is None else epsilon_high
        self.beta, self.kl_in_reward, self.real_tau = beta, False, real_tau
        self.tau_pos, self.tau_neg = tau_pos, tau_neg  # SAPO's temperatures (its defaults, TRL's)
        self.fipo_gamma = 2 ** (-1 / fipo_decay_rate)  # as GRPOTrainer.__init__ derives it
        self.fipo_clip_range, self.fipo_clip_high_only = fipo_clip_range, fipo_clip_high_only
        self.fipo_safety_threshold = fipo_safety_threshold
        self.args = SimpleNamespace(delta=delta, gradient_accumulation_steps=1, top_entropy_quantile=1.0,
                                    log_entropy=False)
        self.model = SimpleNamespace(training=True)
        self.accelerator = SimpleNamespace(num_processes=1, gather_for_metrics=_identity)
        self.compute_entropy = self.overlong_filter = self._has_teacher = False
        self.rollout_importance_sampling_mode, self.log_rollout_offpolicy_metrics = None, False
        self.disable_rollout_importance_sampling = True
        self.importance_sampling_level, self.off_policy_sequence_mask_delta = "token", None
        self.sdar_loss_coef, self.chord_sft_iterator = 0.0, None
        self.model_accepts_loss_kwargs, self.compute_loss_func = False, None
        self.current_gradient_accumulation_steps = 1
        self._metrics = {"train": {}}
        self._logps = None

    def _get_per_token_logps_and_entropies(self, model, model_inputs, grpo_batch, compute_entropy=False):
        return self._logps, None

    def __call__(self, logps, old_logps, advantages, mask, ref_logps=None) -> torch.Tensor:
        """The trainer's loss on our tensors: ``advantages`` (B,) one per completion (the trainer expands them to
        (B, T)); ``mask`` (B, T) the completion mask."""
        completion_mask = mask.bool()
        token_adv = (advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages).expand_as(logps)
        batch = SimpleNamespace(
            completion_mask=completion_mask, truncated_mask=torch.zeros(mask.size(0), dtype=torch.bool),
            advantages=token_adv, old_per_token_logps=old_logps, ref_per_token_logps=ref_logps,
            rollout_per_token_logps=None, teacher_per_token_logps=None, num_items_in_batch=mask.sum())
        self._logps = logps
        loss, _ = self._compute_loss_and_metrics(None, {}, batch)
        return loss


def loss(loss_type: str, logps, old_logps, advantages, mask, *, group_size: int, ref_logps=None,
         **settings) -> torch.Tensor:
    """ms-swift's GRPO loss of ``loss_type`` on our tensors (``settings``: SwiftLoss's keywords)."""
    settings.setdefault("max_completion_length", mask.size(1))
    return SwiftLoss(loss_type, group_size=group_size, **settings)(logps, old_logps, advantages, mask, ref_logps)


def fipo_influence(logps, old_logps, advantages, mask, **settings) -> torch.Tensor:
    """``_compute_fipo_influence``: FIPO's (B, T) token weight (detached), from the log-ratio and the ratio."""
    trainer = SwiftLoss("fipo", group_size=1, max_completion_length=mask.size(1), **settings)
    log_ratio = logps - old_logps
    token_adv = (advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages).expand_as(logps)
    weight, _ = trainer._compute_fipo_influence(log_ratio, torch.exp(log_ratio), token_adv, mask.bool())
    return weight


@register_adapter
class Swift(Adapter):
    """ms-swift in the feature table."""

    name, column, heading = FRAMEWORK, "ms-swift", f"ms-swift {VERSION}"
    has = {"estimators": ESTIMATORS, "policy_losses": POLICY_LOSSES, "aggregations": AGGREGATIONS, "kl": KL,
           "corrections": CORRECTIONS}
    cells = {
        "algorithms": {"grpo": "GRPOTrainer (rlhf_type=grpo)", "dpo": "DPOTrainer (rlhf_type=dpo)",
                       "rloo": "GRPOTrainer (advantage_estimator=rloo)",
                       "reinforce_pp": "GRPOTrainer (advantage_estimator=reinforce_plus_plus)"},
        "policy_losses": {ours: f"loss_type={theirs}" for ours, theirs in POLICY_LOSSES.items()},
    }
    options = KNOBS
    sequence_level = "importance_sampling_level=sequence"
