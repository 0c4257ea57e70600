"""The pizza task (seed: the "Group Relative Policy Update" notebook).

A tiny character-level Llama is pretrained on "<name> likes <food>" sentences, where every person
has a preference distribution over foods. Ravin likes pizza only ~15% of the time, so "ravin likes "
is completed with "pizza" rarely before RL; the reward is 4 for exactly "pizza" followed by the end
token and 0 otherwise (misspellings included). RL should make "pizza" Ravin's near-certain answer.
"""

from __future__ import annotations

import random
from typing import Optional, Sequence

from tasks.base import GenerationDefaults, Task, TaskError, load_pretrained, register_task, sample_completions
from tasks.tiny_lm import cached_model, char_tokenizer, model_source, pretrain, tiny_llama

NAMES = (
    "ravin alice bob carol dave erin frank grace heidi ivan judy mallory niaj olivia peggy rupert sybil "
    "trent victor walter yara zoe amir bea chen dara eli fatima gus hana ines jon kofi lena milo noor "
    "oscar priya quinn rosa sami tara uma vik wen xena yusuf"
).split()
FOODS = "pizza pasta sushi tacos curry salad burgers ramen pho falafel dumplings paella".split()
PROMPT = "ravin likes "
TARGET = "pizza"
RAVIN_PIZZA_SHARE = 0.15
EVAL_SETS = ("test", "validation")
# One prompt, no problems to hold out: validation samples it with seed + this, a stream no test evaluation's seed
# (below 2**32) reaches, so tuning never selects on the very samples the verdicts read.
VALIDATION_SEED_OFFSET = 2**32

RECIPE = {
    "names": NAMES,
    "foods": FOODS,
    "ravin_pizza_share": RAVIN_PIZZA_SHARE,
    "sentences": 20000,
    "hidden_size": 64,
    "num_layers": 2,
    "steps": 600,
    "batch_size": 64,
    "lr": 3e-3,
    "seed": 0,
    "version": 1,
}


def preference_table(seed: int) -> dict[str, list[float]]:
    """Each person's distribution over FOODS; Ravin's is fixed so that pizza has RAVIN_PIZZA_SHARE."""
    rng = random.Random(seed)
    table = {}
    for name in NAMES:
        weights = [rng.gammavariate(0.7, 1.0) for _ in FOODS]
        total = sum(weights)
        table[name] = [w / total for w in weights]
    rest = (1 - RAVIN_PIZZA_SHARE) / (len(FOODS) - 1)
    table["ravin"] = [RAVIN_PIZZA_SHARE if f == TARGET else rest for f in FOODS]
    return table


def corpus(recipe: dict) -> list[str]:
    rng = random.Random(recipe["seed"])
    table = preference_table(recipe["seed"])
    names = rng.choices(NAMES, k=recipe["sentences"])
    return [f"{name} likes {rng.choices(FOODS, weights=table[name])[0]}" for name in names]


def build_pizza_model(recipe: dict = RECIPE):
    alphabet = sorted(set("".join(NAMES + FOODS)) | {" "})
    tokenizer = char_tokenizer(alphabet)
    model = tiny_llama(tokenizer, hidden_size=recipe["hidden_size"], num_layers=recipe["num_layers"], seed=recipe["seed"])
    pretrain(model, tokenizer, corpus(recipe), steps=recipe["steps"], batch_size=recipe["batch_size"],
             lr=recipe["lr"], seed=recipe["seed"])
    return model, tokenizer


@register_task
class PizzaTask(Task):
    """Prompt "ravin likes "; reward 4 for exactly "pizza" then EOS; accuracy over ``eval_samples`` samples."""

    name = "pizza"
    reward_modes = ("exact",)
    generation = GenerationDefaults(max_new_tokens=12, temperature=1.0)
    # AdamW at 1e-3 overshoots into misspellings ("pizzza") once the KL term dominates; 5e-5 is smooth.
    recommended_learning_rate = 5e-5
    success_threshold = 4.0  # exactly "pizza" then EOS
    option_help = {
        "eval_samples": "completions sampled for evaluation",
        "eval_set": "test (the verdicts') or validation (tuning's): the same one prompt, sampled from an independent "
                    "seed stream (seed + 2**32), as there are no problems to hold out",
        "model": "a Hugging Face model id or local directory to start from (default: the pretrained tiny Llama)",
    }

    def __init__(self, reward_mode: Optional[str] = None, reward_fn=None, eval_samples: int = 256, model: Optional[str] = None,
                 eval_set: str = "test"):
        super().__init__(reward_mode, reward_fn)
        if eval_samples < 1:
            raise TaskError(f"eval_samples must be >= 1, got {eval_samples}")
        if eval_set not in EVAL_SETS:
            raise TaskError(f"eval_set must be one of {', '.join(EVAL_SETS)}, got {eval_set!r}")
        self.eval_samples, self.eval_set = eval_samples, eval_set
        self.model_path = model  # a saved policy (e.g. a finished run's) instead of the pretrained one
        _, self.tokenizer = self._pretrained()

    def _pretrained(self):
        if self.model_path:
            return load_pretrained(self.model_path)
        return cached_model("pizza", RECIPE, lambda: build_pizza_model(RECIPE))

    def load_policy(self, device):
        model, self.tokenizer = self._pretrained()
        return model.to(device)

    def train_prompts(self) -> list[str]:
        return [PROMPT]

    def reward(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        # A completion's text stops at its first EOS, so "pizza" here means "pizza" + EOS
        # (max_new_tokens > 5 rules out a truncated "pizza").
        return [4.0 if c == TARGET else 0.0 for c in completions]

    def evaluate(self, model, *, seed: int = 0) -> dict[str, float]:
        (samples,) = sample_completions(
            model, self.tokenizer, [PROMPT], num_samples=self.eval_samples,
            max_new_tokens=self.generation.max_new_tokens, temperature=self.generation.temperature,
            seed=seed + VALIDATION_SEED_OFFSET if self.eval_set == "validation" else seed,
        )
        rewards = self.score([PROMPT] * len(samples), samples)
        valid_food = sum(s in FOODS for s in samples) / len(samples)
        return {
            "accuracy": sum(s == TARGET for s in samples) / len(samples),
            "reward": sum(rewards) / len(rewards),
            "valid_food": valid_food,  # the rest are misspellings
        }

    def describe(self) -> dict:
        return {**super().describe(), "eval_samples": self.eval_samples, "eval_set": self.eval_set,
                "eval_seed": "seed + 2**32 (validation)" if self.eval_set == "validation" else "seed",
                "prompt": PROMPT, "model": self.model_path, "pretrain_recipe": None if self.model_path else RECIPE,
                "starting_model": None if self.model_path else model_source("pizza", RECIPE)}
