"""TRL 1.12.0's PPO (``trl/experimental/ppo/ppo_trainer.py``, the last TRL with a PPOTrainer) as a reference, read
from its file and never imported: its ``trl`` package would shadow the TRL 1.16 the suite depends on.

Two kinds of code are taken from the file, both executed as written:

* the module-level functions ``masked_mean``, ``masked_var`` and ``masked_whiten`` (and the constant
  ``INVALID_LOGPROB``), compiled from their own source (``ast`` finds them; nothing else of the module runs);
* the lines of ``PPOTrainer.train`` that hold the rest of PPO, which TRL writes inline in its training loop: the
  padding masks, "4. compute rewards" (the k1 / k3 KL in the reward, the score placement), "5. whiten rewards",
  "6. compute advantages and returns" (GAE, the advantage whitening), and the minibatch loss (value clipping, the
  clipped surrogate). Each block is cut out of the file between a first and a last line quoted below
  (``BLOCKS``), dedented, and executed with the loop's variables bound to our tensors; a block whose anchors are
  not found is an error, never a silent fallback.

TRL's layout differs from ours in one place (the check says so): a completion's score sits on the token *after* its
last one (``sequence_lengths_p1``), where the value model also predicts and the value loss also counts, unless the
completion fills the width.
"""

from __future__ import annotations

import ast
import textwrap
from types import SimpleNamespace
from typing import Optional

import torch

from benchmarks.references import install
from benchmarks.references.adapters import Adapter, register_adapter

FRAMEWORK = "trl-ppo"
VERSION = install.PINNED[FRAMEWORK].version
RELATIVE = "trl/experimental/ppo/ppo_trainer.py"
FUNCTIONS = ("masked_mean", "masked_var", "masked_whiten")
# name -> (first line, last line), quoted from PPOTrainer.train (stripped of indentation).
BLOCKS = {
    "masks": ("response_idxs = torch.arange(responses.shape[1], device=responses.device).repeat(responses.shape[0], 1)",
              "values = torch.masked_fill(values, padding_mask_p1, 0)"),
    "advantages": ("logr = ref_logprobs - logprobs",
                   "advantages = torch.masked_fill(advantages, padding_mask, 0)"),
    "loss": ("new_logprobs = torch.masked_fill(", "loss = pg_loss + args.vf_coef * vf_loss"),
}

# Our names -> TRL 1.12's PPOConfig fields (the feature table; TRL 1.12 has PPO only, GAE its estimator).
ESTIMATORS = {"gae": "gae (inline in PPOTrainer.train)"}
POLICY_LOSSES = {"bnpo": "PPO clipped surrogate, masked_mean over tokens", "dapo": "PPO clipped surrogate (token mean)"}
AGGREGATIONS = {"token-mean": "masked_mean", "bnpo": "masked_mean", "dapo": "masked_mean"}
KL = {"k1": "kl_estimator=k1 (in the reward)", "k3": "kl_estimator=k3 (in the reward)"}
KNOBS = {"epsilon": "cliprange", "value_clip": "cliprange_value", "gamma": "gamma", "lam": "lam",
         "kl_coef": "kl_coef", "kl_loss_type": "kl_estimator", "whiten_advantages": "(always)",
         "whiten_rewards": "whiten_rewards", "epochs": "num_ppo_epochs",
         "minibatches": "num_mini_batches"}

_cache: dict = {}


def functions() -> SimpleNamespace:
    """``masked_mean``, ``masked_var``, ``masked_whiten`` and ``INVALID_LOGPROB``, compiled from the file's own source."""
    if "functions" not in _cache:
        source = install.source_text(FRAMEWORK, RELATIVE)
        tree = ast.parse(source)
        wanted = [node for node in tree.body
                  if (isinstance(node, ast.FunctionDef) and node.name in FUNCTIONS)
                  or (isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "INVALID_LOGPROB" for t in node.targets))]
        names = {getattr(n, "name", "INVALID_LOGPROB") for n in wanted}
        if names != set(FUNCTIONS) | {"INVALID_LOGPROB"}:
            raise install.MissingFramework(f"{install.PINNED[FRAMEWORK].label}'s {RELATIVE} lacks "
                                           f"{sorted(set(FUNCTIONS) | {'INVALID_LOGPROB'} - names)}: not the pinned file")
        namespace = {"torch": torch}
        exec(compile(ast.Module(body=wanted, type_ignores=[]), str(install.source_file(FRAMEWORK, RELATIVE)), "exec"),
             namespace)
        _cache["functions"] = SimpleNamespace(**{n: namespace[n] for n in names})
    return _cache["functions"]


def block(name: str) -> str:
    """The lines of ``PPOTrainer.train`` from BLOCKS[name]'s first line to its last, dedented."""
    lines = install.source_text(FRAMEWORK, RELATIVE).splitlines()
    first, last = BLOCKS[name]
    try:
        start = next(i for i, line in enumerate(lines) if line.strip().startswith(first))
        end = next(i for i in range(start, len(lines)) if lines[i].strip() == last)
    except StopIteration:
        raise install.MissingFramework(f"{install.PINNED[FRAMEWORK].label}'s {RELATIVE}: the block {name!r} "
                                       f"({first!r} ... {last!r}) is not there: not the pinned file") from None
    return textwrap.dedent("\n".join(lines[start:end + 1]))


def _run(name: str, **variables) -> dict:
    namespace = {"torch": torch, **vars(functions()), **variables}
    exec(compile(block(name), f"{RELATIVE}:{name}", "exec"), namespace)
    return namespace


def masks(mask: torch.Tensor, logprobs, ref_logprobs, values) -> dict:
    """TRL's padding masks from our mask: ``sequence_lengths`` is the index of the last active token (-1 for an
    empty completion); returns the block's namespace (padding_mask, padding_mask_p1, the masked log-probs, values)."""
    sequence_lengths = mask.sum(-1).long() - 1
    responses = torch.zeros_like(mask, dtype=torch.long)
    return _run("masks", responses=responses, sequence_lengths=sequence_lengths, logprobs=logprobs,
                ref_logprobs=ref_logprobs, values=values)


def advantages(scores, logps, ref_logps, values, mask, *, gamma: float = 1.0, lam: float = 0.95, kl_coef: float = 0.05,
               kl_estimator: str = "k1", whiten_rewards: bool = False) -> dict:
    """Steps 4-6 of ``PPOTrainer.train`` on our tensors (logps: the rollout policy's, ref_logps: the reference's):
    returns the namespace with ``rewards``, ``advantages`` (whitened, 0 on padding), ``returns``, ``kl``, the masks."""
    prepared = masks(mask, logps, ref_logps, values)
    args = SimpleNamespace(kl_estimator=kl_estimator, kl_coef=kl_coef, whiten_rewards=whiten_rewards, gamma=gamma, lam=lam)
    return _run("advantages", args=args, scores=scores, responses=prepared["responses"],
                ref_logprobs=prepared["ref_logprobs"], logprobs=prepared["logprobs"], values=prepared["values"],
                sequence_lengths=prepared["sequence_lengths"], sequence_lengths_p1=prepared["sequence_lengths_p1"],
                padding_mask=prepared["padding_mask"], padding_mask_p1=prepared["padding_mask_p1"])


def losses(new_logps, old_logps, advantages, vpred, old_values, returns, mask, *, cliprange: float = 0.2,
           cliprange_value: float = 0.2, vf_coef: float = 0.1) -> dict:
    """The minibatch loss lines of ``PPOTrainer.train`` on one minibatch holding the whole batch: returns the
    namespace with ``pg_loss``, ``vf_loss``, ``loss``; gradients flow to ``new_logps`` and ``vpred``."""
    prepared = masks(mask, old_logps, old_logps, old_values)
    B = mask.size(0)
    vpred_temp = torch.cat([vpred, torch.zeros_like(vpred[:, :1])], 1).unsqueeze(-1)  # (B, T+1, 1): [:, 0:-1] is vpred
    args = SimpleNamespace(cliprange=cliprange, cliprange_value=cliprange_value, vf_coef=vf_coef)
    return _run("loss", args=args, new_logprobs=new_logps, vpred_temp=vpred_temp, context_length=1,
                micro_batch_inds=torch.arange(B), padding_mask=prepared["padding_mask"],
                padding_mask_p1=prepared["padding_mask_p1"], mb_values=prepared["values"], mb_return=returns,
                mb_logprobs=prepared["logprobs"], mb_advantage=advantages)


def masked_whiten(values, mask, shift_mean: bool = True):
    return functions().masked_whiten(values, mask, shift_mean=shift_mean)


def invalid_logprob() -> Optional[float]:
    return functions().INVALID_LOGPROB


@register_adapter
class TrlPpo(Adapter):
    """TRL 1.12's PPO in the feature table: the TRL column's PPO part (TRL 1.16's adapter names the rest)."""

    name, column, heading = FRAMEWORK, "TRL", f"{VERSION.rsplit('.', 1)[0]} PPO"
    has = {"estimators": ESTIMATORS, "policy_losses": POLICY_LOSSES, "aggregations": AGGREGATIONS, "kl": KL}
    cells = {
        "algorithms": {"ppo": f"PPOTrainer (TRL {VERSION}; removed after)"},
        "estimators": {"gae": f"PPOTrainer ({VERSION})"},
        # its clipped surrogate, token mean and KL are TRL 1.16's loss types and KL in the column's cells
        "policy_losses": {}, "aggregations": {}, "kl": {},
        "ppo": {"gae": "train() step 6", "masked_whiten": "masked_whiten", "value_loss": "train() vf_loss",
                "policy_loss": "train() pg_loss", "kl_in_reward": "train() step 4 (k1 / k3)"},
    }
    check_groups = {"kl_in_reward": ("kl",)}  # the check compares step 4's KL in its kl rows
    options = KNOBS
    options_heading = f"TRL {VERSION} (PPO)"
