"""Multi-digit addition with a written scratchpad: the headroom task for RL with verifiable rewards.

A prompt is "a+b=" with 2-4 digit operands; the completion works the sum column by column, least
significant digit first, then writes the answer after "#":

    prompt "23+58="    completion "3+8=11;2+5+1=8#81"

A column is "x+y=s", or "x+y+1=s" when a carry comes in, with s the column's full sum (0-19); the
shorter operand is padded with zeros, so there is one column per digit of the longer one. A tiny
character-level Llama (``tasks.tiny_lm``) is pretrained on a mix of correct solutions and solutions with
exactly one mistake of a kind people (and small LMs) make: a column sum off by one or two, a dropped or
invented carry, a slip when copying the answer out of the scratchpad, a loop that repeats a column over
and over (most of these run past ``max_new_tokens``: truncated), or stopping before writing the answer.
The mistakes propagate the way real ones do (a wrong column feeds its carry onward and the answer is
read off the wrong scratchpad). Sampled at temperature 1, the pretrained policy is right only part of
the time (the measured rate is in ``RECIPE``'s comment) and RL has to sharpen it: every mistake is a
less likely continuation than the right one, so the knowledge is there but not reliable.

Why addition rather than Countdown: a 2-layer model can learn column addition from a few thousand
steps of pretraining, so the starting policy's competence (and with it the headroom) is set by the
corruption rate and the pretraining length, numbers we choose; Countdown needs search that a model this small cannot learn in
minutes on CPU, so its starting accuracy would sit near 0 and RL would have nothing to sharpen. The
scratchpad gives multi-token completions of 15-40 tokens (EOS included) whose length depends on the problem, and the
loops give truncated ones, so token vs sequence level, loss aggregation and length effects all act.

Reward (a verifier, partial credit):
    correctness  1.0 when the text after the completion's last "#" is exactly the digits of a + b
                 (the scratchpad is not checked: "#81" alone is a correct answer without a format)
    format       0.1 when the whole completion follows the grammar above with one column per digit
                 of the longer operand (the columns' arithmetic is not checked)
    reward modes: ``sum`` (default) = correctness + format, in {0, 0.1, 1.0, 1.1};
                  ``correctness`` = correctness alone.
Evaluation samples ``eval_k`` completions for each of ``eval_problems`` held-out problems (never used
for training or pretraining) and reports accuracy, format, reward, mean completion length (tokens,
EOS included) and truncation rate.

How the recipe was chosen (probes on the 2-core CPU box, OMP_NUM_THREADS=1, GRPO with the default
settings at learning rate 3e-4, accuracy on 128 held-out problems x 2 samples; the committed default
matrix in results/cpu has the 5-seed numbers):
    2000 pretraining steps, 60% corrupted: start 0.37, GRPO 0.64 after 4096 completions and 0.72 after
        16384. A trained policy's remaining mistakes were mostly carries (235 of 421 wrong samples), which
        the undertrained 2-layer model had not learned to place reliably: RL plateaued on them.
    4000 pretraining steps (about 5 minutes on one core, cached once), 60% corrupted: start 0.54 (above
        the 0.50 a headroom task may start at); 70% corrupted: start 0.40-0.45 (seeds 0-2), GRPO 0.74
        after 4096 completions and 0.79-0.82 after 6400 (seeds 0-2): the recipe below, with the default
        matrix's budget of 8192 completions on this task.
    2000 steps, 50% corrupted: start 0.34 and GRPO barely moved it (0.37), so the rate alone is no dial.
    Learning rate: 1e-3 collapses within 8 steps; 5e-4 oscillates (probes at 2000 steps).
"""

from __future__ import annotations

import random
import re
import zlib
from typing import Optional, Sequence


from tasks.base import (GenerationDefaults, Samples, Task, TaskError, load_pretrained, register_task,
                        reward_ranked_pairs, sample_batched)
from tasks.tiny_lm import cached_model, char_tokenizer, model_source, pretrain, tiny_llama

ALPHABET = list("0123456789+=;#")
MIN_DIGITS, MAX_DIGITS = 2, 4
FORMAT_REWARD = 0.1
HELD_OUT_SHARE = 16  # 1 problem in 16 is reserved for evaluation
EVAL_SETS = ("test", "validation")  # the held-out problems, halved by eval_set_of
# The mistakes of corrupted pretraining solutions, drawn uniformly; see ``corrupted_solution``.
MISTAKES = ("column", "carry", "copy", "loop", "no_answer")

RECIPE = {
    "digits": [MIN_DIGITS, MAX_DIGITS],
    "examples": 20000,
    # share of pretraining solutions with one mistake; see "How the recipe was chosen" above.
    "corruption_rate": 0.7,
    "mistakes": list(MISTAKES),
    "loop_repeats": [2, 4],  # a looping solution repeats a column this many extra times
    "hidden_size": 64,
    "num_layers": 2,
    "num_heads": 4,
    "max_positions": 128,
    "steps": 4000,
    "batch_size": 32,
    "lr": 3e-3,
    "seed": 0,
    "version": 1,
}

_COLUMN = r"\d\+\d(?:\+1)?=\d{1,2}"
_FORMAT = re.compile(rf"({_COLUMN}(?:;{_COLUMN})*)#(?:0|[1-9]\d*)")
_ANSWER = re.compile(r"#(\d+)\Z")
_PROMPT = re.compile(r"(\d+)\+(\d+)=\Z")


# --- problems and solutions -------------------------------------------------------------------------
def random_problem(rng: random.Random, digits: Sequence[int] = (MIN_DIGITS, MAX_DIGITS)) -> tuple[int, int]:
    """Two operands, each with a number of digits drawn uniformly from ``digits`` (inclusive range)."""
    lo, hi = digits

    def operand() -> int:
        n = rng.randint(lo, hi)
        return rng.randint(10 ** (n - 1), 10 ** n - 1)

    return operand(), operand()


def prompt_for(a: int, b: int) -> str:
    return f"{a}+{b}="


def parse_prompt(prompt: str) -> tuple[int, int]:
    match = _PROMPT.fullmatch(prompt)
    if not match:
        raise TaskError(f"addition prompts look like '23+58=', got {prompt!r}")
    return int(match[1]), int(match[2])


def columns(a: int, b: int) -> list[tuple[int, int]]:
    """(digit of a, digit of b) per column, least significant first, the shorter operand zero-padded."""
    n = max(len(str(a)), len(str(b)))
    da, db = str(a).zfill(n)[::-1], str(b).zfill(n)[::-1]
    return [(int(x), int(y)) for x, y in zip(da, db)]


def _write(cols: list[tuple[int, int]], sums: Optional[list[int]] = None, carries: Optional[list[int]] = None) -> tuple[list[str], str]:
    """Column strings and the answer read off them. ``sums``/``carries`` override the right ones per column
    (None keeps the right value given what was written before), so a mistake propagates onward."""
    parts, digits, carry = [], [], 0
    for i, (x, y) in enumerate(cols):
        if carries is not None and carries[i] is not None:
            carry = carries[i]
        s = x + y + carry
        if sums is not None and sums[i] is not None:
            s = sums[i]
        parts.append(f"{x}+{y}{'+1' if carry else ''}={s}")
        digits.append(s % 10)
        carry = int(s >= 10)
    answer = ("1" if carry else "") + "".join(str(d) for d in reversed(digits))
    return parts, answer.lstrip("0") or "0"


def solution(a: int, b: int) -> str:
    """The correct completion for "a+b=": "3+8=11;2+5+1=8#81" for 23+58."""
    parts, answer = _write(columns(a, b))
    return ";".join(parts) + "#" + answer


def corrupted_solution(a: int, b: int, rng: random.Random, mistake: str, loop_repeats: Sequence[int] = (2, 6)) -> str:
    """A completion with exactly one mistake of kind ``mistake`` (one of MISTAKES)."""
    cols = columns(a, b)
    n = len(cols)
    i = rng.randrange(n)
    if mistake == "column":  # a column sum off by 1 or 2; its carry and the answer follow the wrong sum
        x, y = cols[i]
        right = x + y + _carry_into(cols, i)
        wrong = rng.choice([s for s in (right - 2, right - 1, right + 1, right + 2) if 0 <= s <= 19])
        parts, answer = _write(cols, sums=[wrong if j == i else None for j in range(n)])
    elif mistake == "carry":  # a carry dropped where there is one, or invented where there is none
        carries = [None] * n
        carries[i] = 1 - _carry_into(cols, i) if i > 0 else 1
        parts, answer = _write(cols, carries=carries)
    elif mistake == "copy":  # the scratchpad is right, the answer copied out of it with one digit changed
        parts, answer = _write(cols)
        k = rng.randrange(len(answer))
        digit = rng.choice([d for d in "0123456789" if d != answer[k] and (k > 0 or d != "0")])
        answer = answer[:k] + digit + answer[k + 1:]
    elif mistake == "loop":  # the last column written again and again before the answer
        parts, answer = _write(cols)
        parts = parts + [parts[-1]] * rng.randint(*loop_repeats)
    elif mistake == "no_answer":  # stops after the scratchpad
        parts, _ = _write(cols)
        return ";".join(parts)
    else:
        raise TaskError(f"unknown mistake {mistake!r}; choose from {', '.join(MISTAKES)}")
    return ";".join(parts) + "#" + answer


def _carry_into(cols: list[tuple[int, int]], i: int) -> int:
    carry = 0
    for x, y in cols[:i]:
        carry = int(x + y + carry >= 10)
    return carry


# --- the verifier -------------------------------------------------------------------------------------
def extracted_answer(completion: str) -> Optional[str]:
    """The digits after the last "#", when the completion ends with them; else None."""
    match = _ANSWER.search(completion)
    return match[1] if match else None


def correctness(a: int, b: int, completion: str) -> float:
    return 1.0 if extracted_answer(completion) == str(a + b) else 0.0


def well_formed(a: int, b: int, completion: str) -> bool:
    """The grammar, with one column per digit of the longer operand (column arithmetic not checked)."""
    match = _FORMAT.fullmatch(completion)
    return bool(match) and match[1].count(";") + 1 == max(len(str(a)), len(str(b)))


# --- problem sets and the pretrained policy ---------------------------------------------------------
def is_held_out(a: int, b: int) -> bool:
    """One problem in HELD_OUT_SHARE, picked by a fixed hash: never trained or pretrained on, whatever the seed."""
    return zlib.crc32(prompt_for(a, b).encode()) % HELD_OUT_SHARE == 0


def eval_set_of(a: int, b: int) -> str:
    """Which half of the held-out problems a held-out problem belongs to, by a second fixed hash: "validation"
    (what tuning selects on) or "test" (what the verdicts judge on); the two never share a problem."""
    return "validation" if zlib.crc32(f"{prompt_for(a, b)}|validation".encode()) % 2 else "test"


def problem_sets(seed: int, train: int, held_out: int, digits=(MIN_DIGITS, MAX_DIGITS),
                 eval_set: str = "test") -> tuple[list, list]:
    """(train, held-out) lists of distinct problems drawn with ``seed``; held-out ones satisfy ``is_held_out`` and
    belong to ``eval_set`` (the training list does not depend on it)."""
    rng = random.Random(f"addition-problems-{seed}")
    seen, sets = set(), ([], [])
    while len(sets[0]) < train or len(sets[1]) < held_out:
        p = random_problem(rng, digits)
        if p in seen:
            continue
        seen.add(p)
        held = is_held_out(*p)
        if held and eval_set_of(*p) != eval_set:
            continue
        target = sets[held]
        if len(target) < (held_out if held else train):
            target.append(p)
    return sets


def corpus(recipe: dict) -> list[str]:
    """Pretraining texts "a+b=" + completion (held-out problems skipped); a ``corruption_rate`` share carry
    one mistake each."""
    rng = random.Random(recipe["seed"])
    texts = []
    while len(texts) < recipe["examples"]:
        a, b = random_problem(rng, recipe["digits"])
        if is_held_out(a, b):
            continue
        if rng.random() < recipe["corruption_rate"]:
            completion = corrupted_solution(a, b, rng, rng.choice(recipe["mistakes"]), recipe["loop_repeats"])
        else:
            completion = solution(a, b)
        texts.append(prompt_for(a, b) + completion)
    return texts


def build_addition_model(recipe: dict = RECIPE):
    tokenizer = char_tokenizer(ALPHABET)
    model = tiny_llama(tokenizer, hidden_size=recipe["hidden_size"], num_layers=recipe["num_layers"],
                       num_heads=recipe["num_heads"], max_positions=recipe["max_positions"], seed=recipe["seed"])
    # Looping solutions are 2-3 times the average length: batches cut to their longest text halve a step.
    pretrain(model, tokenizer, corpus(recipe), steps=recipe["steps"], batch_size=recipe["batch_size"],
             lr=recipe["lr"], seed=recipe["seed"], trim_batches=True)
    return model, tokenizer


@register_task
class AdditionTask(Task):
    """Prompt "a+b=" (2-4 digits each); completion: column-by-column scratchpad, then "#" and the sum."""

    name = "addition"
    reward_modes = ("sum", "correctness")
    # The longest correct completion is 40 tokens with EOS ("9+9=18;9+9+1=19;9+9+1=19;9+9+1=19#19998"); most
    # loops on 3-4 digit problems run past 48 and are truncated. DAPO's overlong shaping fits as
    # overlong_buffer_len = 8: the penalty starts after 40 tokens, so no correct completion is penalized.
    generation = GenerationDefaults(max_new_tokens=48, temperature=1.0)
    success_threshold = 1.0  # correctness (1.0) counts as correct; format adds 0.1
    # Measured on the 2000-step, 60% recipe. GRPO seed 0, 2048 completions: 1e-3 collapses (accuracy 0.37 -> 0.00 within 8 steps), 3e-4 climbs
    # (0.37 -> 0.58); at 6144 completions 5e-4 oscillates (0.41) where 3e-4 reaches 0.61.
    recommended_learning_rate = 3e-4
    option_help = {
        "problem_seed": "seed of the train / held-out problem draw",
        "train_problems": "distinct training problems",
        "eval_problems": "held-out problems evaluated",
        "eval_set": "which held-out problems to evaluate on: test (the verdicts') or validation (tuning's; disjoint "
                    "from test, never trained on)",
        "eval_k": "completions sampled per held-out problem",
        "eval_temperature": "sampling temperature of the held-out evaluation (default: the task's, 1.0); 0 is greedy, "
                            "which with eval_k 1 scores the policy without sampling noise",
        "model": "a Hugging Face model id or local directory to start from (default: the pretrained tiny Llama)",
    }
    preference_labelling = ("k=4 samples of the starting policy per train problem; chosen: a highest-reward and "
                            "rejected: a lowest-reward one among those that ended with EOS; ties dropped")

    def __init__(self, reward_mode: Optional[str] = None, reward_fn=None, problem_seed: int = 0,
                 train_problems: int = 2000, eval_problems: int = 128, eval_k: int = 2, model: Optional[str] = None,
                 eval_temperature: Optional[float] = None, eval_set: str = "test"):
        super().__init__(reward_mode, reward_fn)
        if eval_set not in EVAL_SETS:
            raise TaskError(f"eval_set must be one of {', '.join(EVAL_SETS)}, got {eval_set!r}")
        self.eval_set = eval_set
        if eval_temperature is not None and eval_temperature < 0:
            raise TaskError(f"eval_temperature must be >= 0, got {eval_temperature}")
        self.eval_temperature = eval_temperature
        for option, value in (("train_problems", train_problems), ("eval_problems", eval_problems), ("eval_k", eval_k)):
            if value < 1:
                raise TaskError(f"{option} must be >= 1, got {value}")
        self.problem_seed, self.eval_k, self.model_path = problem_seed, eval_k, model
        self.train, self.held_out = problem_sets(problem_seed, train_problems, eval_problems, eval_set=eval_set)
        self.eval_prompts = [prompt_for(a, b) for a, b in self.held_out]
        # The tokenizer is fixed by ALPHABET: no need to pretrain (or load) the policy to build the task.
        self.tokenizer = load_pretrained(model)[1] if model else char_tokenizer(ALPHABET)

    def _pretrained(self):
        if self.model_path:
            return load_pretrained(self.model_path)
        return cached_model("addition", RECIPE, lambda: build_addition_model(RECIPE))

    def load_policy(self, device):
        model, self.tokenizer = self._pretrained()
        return model.to(device)

    def train_prompts(self) -> list[str]:
        return [prompt_for(a, b) for a, b in self.train]

    def reward(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        rewards = []
        for prompt, completion in zip(prompts, completions):
            a, b = parse_prompt(prompt)
            r = correctness(a, b, completion)
            if self.reward_mode == "sum":
                r += FORMAT_REWARD * well_formed(a, b, completion)
            rewards.append(r)
        return rewards

    def evaluate(self, model, *, seed: int = 0) -> dict[str, float]:
        sampler = self.eval_sampler or sample_batched
        temperature = self.generation.temperature if self.eval_temperature is None else self.eval_temperature
        samples: Samples = sampler(model, self.tokenizer, self.eval_prompts, k=self.eval_k,
                                   max_new_tokens=self.generation.max_new_tokens, temperature=temperature, seed=seed)
        prompts = [p for p, texts in zip(self.eval_prompts, samples.texts) for _ in texts]
        texts = [t for group in samples.texts for t in group]
        problems = [parse_prompt(p) for p in prompts]
        n = len(texts)
        return {
            "accuracy": sum(correctness(a, b, t) for (a, b), t in zip(problems, texts)) / n,
            "format": sum(well_formed(a, b, t) for (a, b), t in zip(problems, texts)) / n,
            "reward": sum(self.score(prompts, texts)) / n,
            "completion_tokens": samples.tokens / n,
            "truncated": sum(map(sum, samples.truncated)) / n,
        }

    def preference_pairs(self, policy, n_pairs: int, *, seed: int = 0, k: int = 4,
                         max_samples: Optional[int] = None) -> dict:
        """Up to ``n_pairs`` DPO pairs, one per train problem drawn (seeded): ``k`` samples of ``policy``
        each, labelled by the reward (``reward_ranked_pairs``). ``max_samples``: at most max_samples sampled
        completions in all (DPO's count_pair_samples: the budget every algorithm samples)."""
        sampler = self.eval_sampler or sample_batched
        return reward_ranked_pairs(self, self.train_prompts(), n_pairs, rng=random.Random(seed), sample=lambda chunk, round_: sampler(
            policy, self.tokenizer, chunk, k=k, max_new_tokens=self.generation.max_new_tokens,
            temperature=self.generation.temperature, seed=seed + round_), per_prompt=k, max_samples=max_samples)

    def describe(self) -> dict:
        return {**super().describe(), "problem_seed": self.problem_seed, "train_problems": len(self.train),
                "eval_problems": len(self.held_out), "eval_set": self.eval_set, "eval_k": self.eval_k, "eval_temperature": self.eval_temperature,
                "format_reward": FORMAT_REWARD,
                "model": self.model_path, "pretrain_recipe": None if self.model_path else RECIPE,
                "starting_model": None if self.model_path else model_source("addition", RECIPE),
                "eval_sampler": getattr(self.eval_sampler, "__qualname__", "transformers generate (sample_batched)")}
