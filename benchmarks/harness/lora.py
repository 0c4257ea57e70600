"""LoRA through PEFT, for every algorithm, without any algorithm knowing.

``wrap`` turns the task's policy into a ``peft`` model (only the adapter trains; ``lora_r`` 0 leaves it
alone). The reference policy of a LoRA run is the same model with its adapter switched off
(``AdapterDisabledReference``): no second copy of the weights. Algorithms call it like any frozen
model, through ``Algorithm.frozen_logps``.
"""

from __future__ import annotations

import contextlib

import torch

from benchmarks.errors import UsageError


def lora_config(rc):
    from peft import LoraConfig

    targets = rc.lora_target_modules.strip()
    return LoraConfig(
        r=rc.lora_r, lora_alpha=rc.lora_alpha, lora_dropout=rc.lora_dropout, task_type="CAUSAL_LM",
        target_modules=targets if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()],
    )


def wrap(policy, rc):
    """``policy`` with a fresh LoRA adapter (``rc.lora_r`` > 0), or ``policy`` itself."""
    if rc.lora_r == 0:
        return policy
    from peft import get_peft_model

    try:
        return get_peft_model(policy, lora_config(rc))
    except ValueError as exc:  # e.g. target modules that the model does not have
        raise UsageError(f"--lora-target-modules {rc.lora_target_modules}: {str(exc).splitlines()[0]}") from None


def is_adapted(model) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


class AdapterDisabledReference:
    """The base model under a LoRA policy: calls run ``policy`` with its adapter disabled, in inference mode.

    Every other attribute (``config``, ``parameters``, ``generation_config``) is the policy's, so the shared
    rollout code treats it as the frozen model it stands for; it owns no weights. ``engaged()`` yields the
    policy itself with its adapter off, for code that runs the model's layers rather than calling it (the
    lean Llama forward reads each LoRA layer's ``disable_adapters``)."""

    def __init__(self, policy):
        self.policy = policy

    def __call__(self, *args, **kwargs):
        with self.policy.disable_adapter(), torch.inference_mode():
            return self.policy(*args, **kwargs)

    @contextlib.contextmanager
    def engaged(self):
        with self.policy.disable_adapter():
            yield self.policy

    def __getattr__(self, name):
        return getattr(self.policy, name)


def describe(policy) -> dict:
    """What config.json records about the adapter: its settings and the trainable share of the weights."""
    if not is_adapted(policy):
        return {"lora": None}
    config = policy.peft_config["default"]
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    total = sum(p.numel() for p in policy.parameters())
    targets = config.target_modules
    return {"lora": {"r": config.r, "alpha": config.lora_alpha, "dropout": config.lora_dropout,
                     "target_modules": sorted(targets) if isinstance(targets, (set, list)) else targets,
                     "trainable_parameters": trainable, "parameters": total,
                     "reference": "the policy with its adapter disabled (no copy)"}}
