"""The toy contextual bandit (seed: the "GRPO: Group Relative Policy Optimization" notebook).

5 contexts, 10 actions. Each context c has hidden true preferences p(.|c) = softmax(2 z_c), z_c ~ N(0, I)
(seeded). A prompt is one context token and a completion is one action token, then EOS. The starting
policy is a tiny causal LM fitted (SFT) to actions sampled from the true preferences, so it starts
out choosing the best action only as often as the preferences do.

Reward modes:
    rm          a reward model r(c, a) -- one learned score per (context, action) -- trained by maximum
                likelihood on Bradley-Terry comparisons of random action pairs, P(a > b) = p_a / (p_a + p_b)
    verifiable  1 for the context's best action, 0 otherwise (the seed's RLVR section)

Evaluation is exact, not sampled: the policy's probability of every (action, EOS) completion gives the
true reward E_pi[p(a|c)], the accuracy pi(best action), and the RM reward E_pi[r(c, a)], averaged over
contexts.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from tasks.base import (GenerationDefaults, Task, TaskError, load_pretrained, prompts_that_fit, register_task,
                        sample_cap_note)
from tasks.tiny_lm import cached_model, char_tokenizer, model_source, pretrain, tiny_llama

CONTEXTS = tuple("abcde")
ACTIONS = tuple("0123456789")

RECIPE = {
    "contexts": len(CONTEXTS),
    "actions": len(ACTIONS),
    "sentences": 5000,
    "hidden_size": 32,
    "num_layers": 1,
    "steps": 300,
    "batch_size": 128,
    "lr": 3e-3,
    "version": 1,
}
RM_COMPARISONS = 2000
EVAL_SETS = ("test", "validation")


def true_preferences(seed: int) -> torch.Tensor:
    """(contexts, actions) softmax(2 z), z standard normal: the hidden preferences."""
    z = torch.randn(len(CONTEXTS), len(ACTIONS), generator=torch.Generator().manual_seed(seed))
    return torch.softmax(2 * z, dim=-1)


def bradley_terry_comparisons(prefs: torch.Tensor, n: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """n random (context, a, b) with a != b, and the winner drawn with P(a wins) = p_a / (p_a + p_b)."""
    C, A = prefs.shape
    ctx = torch.randint(0, C, (n,), generator=generator)
    a = torch.randint(0, A, (n,), generator=generator)
    b = (a + torch.randint(1, A, (n,), generator=generator)) % A  # uniform over the other actions
    pa, pb = prefs[ctx, a], prefs[ctx, b]
    a_wins = torch.rand(n, generator=generator) < pa / (pa + pb)
    return ctx, torch.where(a_wins, a, b), torch.where(a_wins, b, a)


def fit_reward_model(prefs: torch.Tensor, seed: int, comparisons: int = RM_COMPARISONS, steps: int = 300) -> torch.Tensor:
    """(contexts, actions) RM scores fitted to Bradley-Terry comparisons: min -log sigma(r_win - r_lose)."""
    g = torch.Generator().manual_seed(seed + 1)
    ctx, win, lose = bradley_terry_comparisons(prefs, comparisons, g)
    scores = torch.zeros_like(prefs, requires_grad=True)
    optimizer = torch.optim.Adam([scores], lr=0.1)
    for _ in range(steps):
        loss = -F.logsigmoid(scores[ctx, win] - scores[ctx, lose]).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    scores = scores.detach()
    return scores - scores.mean(dim=1, keepdim=True)  # Bradley-Terry fixes scores only up to a shift per context


def build_bandit_model(recipe: dict):
    tokenizer = char_tokenizer(list(CONTEXTS + ACTIONS))
    model = tiny_llama(tokenizer, hidden_size=recipe["hidden_size"], num_layers=recipe["num_layers"], num_heads=2,
                       max_positions=8, seed=recipe["seed"])
    prefs = true_preferences(recipe["seed"])
    g = torch.Generator().manual_seed(recipe["seed"])
    ctx = torch.randint(0, len(CONTEXTS), (recipe["sentences"],), generator=g)
    actions = torch.multinomial(prefs[ctx], 1, generator=g).squeeze(-1)
    texts = [CONTEXTS[c] + ACTIONS[a] for c, a in zip(ctx.tolist(), actions.tolist())]
    pretrain(model, tokenizer, texts, steps=recipe["steps"], batch_size=recipe["batch_size"], lr=recipe["lr"], seed=recipe["seed"])
    return model, tokenizer


@register_task
class BanditTask(Task):
    """Prompt: one context token; completion: one action token then EOS."""

    name = "bandit"
    reward_modes = ("rm", "verifiable")
    generation = GenerationDefaults(max_new_tokens=2, temperature=1.0)
    recommended_learning_rate = 1e-3
    option_help = {
        "bandit_seed": "seed of the hidden preferences and of the reward model fitted to them",
        "eval_set": "test or validation: accepted for a matrix's tuning stage, evaluated the same way, as the "
                    "evaluation is exact (every context, no samples) and there are no problems to hold out",
        "model": "a Hugging Face model id or local directory to start from (default: the pretrained tiny Llama)",
    }
    preference_labelling = ("two actions of the starting policy per context, labelled by a Bradley-Terry draw over "
                            "the hidden true preferences, P(a > b) = p_a / (p_a + p_b); identical actions dropped")

    def __init__(self, reward_mode: Optional[str] = None, reward_fn=None, bandit_seed: int = 0, model: Optional[str] = None,
                 eval_set: str = "test"):
        super().__init__(reward_mode, reward_fn)
        if eval_set not in EVAL_SETS:
            raise TaskError(f"eval_set must be one of {', '.join(EVAL_SETS)}, got {eval_set!r}")
        self.eval_set = eval_set
        self.bandit_seed = bandit_seed
        self.success_threshold = 1.0 if self.reward_mode == "verifiable" else None  # the rm's scores have no "correct"
        self.model_path = model
        self.prefs = true_preferences(bandit_seed)  # (C, A), hidden from the learner
        self.best = self.prefs.argmax(dim=1)  # (C,)
        self.rm = fit_reward_model(self.prefs, bandit_seed)  # (C, A)
        _, self.tokenizer = self._pretrained()

    def _pretrained(self):
        if self.model_path:
            return load_pretrained(self.model_path)
        recipe = self.recipe()
        return cached_model("bandit", recipe, lambda: build_bandit_model(recipe))

    def recipe(self) -> dict:
        return {**RECIPE, "seed": self.bandit_seed}

    def load_policy(self, device):
        model, self.tokenizer = self._pretrained()
        return model.to(device)

    def train_prompts(self) -> list[str]:
        return list(CONTEXTS)

    def _parse(self, prompts: Sequence[str], completions: Sequence[str]) -> tuple[list[int], list[Optional[int]]]:
        try:
            ctx = [CONTEXTS.index(p) for p in prompts]
        except ValueError:
            raise TaskError(f"bandit prompts are one of {''.join(CONTEXTS)}, got {sorted(set(prompts))}") from None
        return ctx, [ACTIONS.index(c) if c in ACTIONS else None for c in completions]

    def reward(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        ctx, actions = self._parse(prompts, completions)
        if self.reward_mode == "verifiable":
            return [float(a is not None and a == int(self.best[c])) for c, a in zip(ctx, actions)]
        worst = float(self.rm.min())  # anything but a single action token scores as the worst action
        return [float(self.rm[c, a]) if a is not None else worst for c, a in zip(ctx, actions)]

    @torch.no_grad()
    def action_probs(self, model) -> torch.Tensor:
        """(C, A) exact pi(action a, then EOS | context c) at the task's sampling temperature."""
        device = next(model.parameters()).device
        vocab = self.tokenizer.convert_tokens_to_ids
        ctx_ids = torch.tensor([vocab(c) for c in CONTEXTS], device=device)
        act_ids = torch.tensor([vocab(a) for a in ACTIONS], device=device)
        C, A = len(CONTEXTS), len(ACTIONS)
        input_ids = torch.stack([ctx_ids.repeat_interleave(A), act_ids.repeat(C)], dim=1)  # (C*A, 2)
        was_training = model.training
        model.eval()
        logits = model(input_ids=input_ids).logits.float()  # (C*A, 2, V)
        model.train(was_training)
        temperature = self.generation.temperature or 1.0
        logp = F.log_softmax(logits / temperature, dim=-1)
        first = logp[:, 0].gather(1, act_ids.repeat(C).unsqueeze(1)).squeeze(1)  # log pi(a | c)
        then_eos = logp[:, 1, self.tokenizer.eos_token_id]  # log pi(EOS | c, a)
        return (first + then_eos).exp().view(C, A).cpu()

    def expected(self, probs: torch.Tensor) -> dict[str, float]:
        """Metrics of a policy given by its (C, A) action probabilities (the rest of the mass is invalid)."""
        invalid = 1 - probs.sum(dim=1)  # (C,)
        rm = (probs * self.rm).sum(dim=1) + invalid * self.rm.min()
        accuracy = probs.gather(1, self.best.unsqueeze(1)).squeeze(1)
        return {
            "accuracy": accuracy.mean().item(),
            "true_reward": (probs * self.prefs).sum(dim=1).mean().item(),
            "rm_reward": rm.mean().item(),
            "reward": (accuracy if self.reward_mode == "verifiable" else rm).mean().item(),
            "valid": (1 - invalid).mean().item(),
        }

    def evaluate(self, model, *, seed: int = 0) -> dict[str, float]:
        return self.expected(self.action_probs(model))

    def preference_pairs(self, policy, n_pairs: int, *, seed: int = 0, max_rounds: int = 16,
                         max_samples: Optional[int] = None) -> dict:
        """DPO's pairs: two actions sampled from ``policy`` for a context, the winner drawn Bradley-Terry
        from the hidden true preferences (not from the training reward), identical actions dropped.

        ``max_samples``: at most max_samples sampled completions in all (DPO's count_pair_samples: the budget every
        algorithm samples); a round that would pass it keeps the first contexts of its seeded draw whose two actions
        fit, and building stops when not one context's do; one TaskError line if the cap leaves no pair."""
        probs = self.action_probs(policy).clamp(min=0)
        g = torch.Generator().manual_seed(seed)
        out: dict = {"prompts": [], "chosen": [], "rejected": [], "samples": 0, "ties_dropped": 0,
                     "labelled_by": self.preference_labelling}
        for _ in range(max_rounds):
            fit = prompts_that_fit(n_pairs, 2, out["samples"], max_samples)
            if not fit:
                break
            ctx = torch.arange(n_pairs) % len(CONTEXTS)
            a, b = torch.multinomial(probs[ctx], 2, replacement=True, generator=g).unbind(1)
            pa, pb = self.prefs[ctx, a], self.prefs[ctx, b]
            a_wins = torch.rand(n_pairs, generator=g) < pa / (pa + pb)
            out["samples"] += 2 * fit
            for c, x, y, w in zip(ctx.tolist()[:fit], a.tolist(), b.tolist(), a_wins.tolist()):
                if x == y:
                    out["ties_dropped"] += 1
                    continue
                out["prompts"].append(CONTEXTS[c])
                out["chosen"].append(ACTIONS[x if w else y])
                out["rejected"].append(ACTIONS[y if w else x])
            if len(out["chosen"]) >= n_pairs:
                break
        if not out["chosen"]:  # nothing DPO could train on: one line, as every task's builder says it
            raise TaskError(f"task {self.name!r}: no preference pairs: all {out['samples']} sampled actions tied"
                            f"{sample_cap_note(max_samples, 2)}")
        for key in ("prompts", "chosen", "rejected"):
            del out[key][n_pairs:]
        return out

    def describe(self) -> dict:
        return {**super().describe(), "bandit_seed": self.bandit_seed, "contexts": len(CONTEXTS), "actions": len(ACTIONS),
                "rm_comparisons": RM_COMPARISONS, "model": self.model_path,
                "pretrain_recipe": None if self.model_path else self.recipe(),
                "starting_model": None if self.model_path else model_source("bandit", self.recipe()),
                "eval_set": self.eval_set, "eval_set_note": "no problems to hold out: the evaluation is exact",
                "optimal_true_reward": self.prefs.max(dim=1).values.mean().item()}
