"""The Task interface: prompts, a reward function, a starting policy and an evaluation.

A task never imports ``algorithms``; algorithms only call the methods below (duck-typed), so a
user's own task plugs in by subclassing ``Task``.
"""

from __future__ import annotations

import copy
import inspect
import typing
import math
import random
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch


class TaskError(Exception):
    """Bad input to a task (a missing file, a malformed option): one line, exit status 2."""


class RewardError(TaskError):
    """A reward function raised, or returned NaN/inf or the wrong number of values."""


@dataclass(frozen=True)
class GenerationDefaults:
    max_new_tokens: int
    temperature: float = 1.0


RewardFn = Callable[[Sequence[str], Sequence[str]], Sequence[float]]


# (model, tokenizer, prompts, *, k, max_new_tokens, temperature, seed) -> Samples. A task's evaluation
# samples with ``Task.eval_sampler`` when one is installed (the harness installs the shared rollout
# sampler, which tasks may not import), else with ``sample_batched`` (transformers' generate).
Sampler = Callable[..., "Samples"]

# Help for the evaluation's decoding options that a task may take (``eval_share_prefix``, ``eval_drop_finished``:
# Reasoning Gym's and GSM8K's); ``Task.eval_sampler_options`` turns them into the sampler's keyword arguments.
EVAL_DECODING_HELP = {
    "eval_share_prefix": "encode the leading tokens all evaluation prompts of a batch share (the chat template's "
                         "system turn) once for the batch (the harness's sampler): the same greedy answers to rounding, "
                         "faster where the prompts are long beside the completions (chain_sum's: about 2x on CPU) "
                         "(off, the default: every prompt whole, as every committed run evaluated)",
    "eval_drop_finished": "greedy evaluation stops computing a batch's rows once they end (the harness's sampler): "
                          "the same answers to rounding, fewer rows decoded where a few long completions would keep "
                          "the batch going (off, the default: every row decodes to the batch's end, as every "
                          "committed run evaluated)",
}


# Completions ``evaluate_pass_at_k`` samples in one call of the sampler, at most (or one question's, when more).
PASS_AT_K_ROWS = 512


class EvalMetrics(dict):
    """``evaluate()``'s metrics (name -> float, as every caller expects) with the per-question detail
    that a paired test needs in ``per_question``: lists in question order, one entry per question."""

    per_question: Optional[dict]


def answer_concentration(answers: Sequence[Optional[str]]) -> tuple[Optional[str], float]:
    """(the most common answer, its share of all ``answers``): how alike a policy answers its questions, or how
    much of an evaluation set one reference answer covers. A missing answer (None: none written) counts in the
    total, never as the most common; (None, 0.0) when no answer was written, or there are none."""
    counts: dict[str, int] = {}
    for answer in answers:
        if answer is not None:
            counts[answer] = counts.get(answer, 0) + 1
    if not counts:
        return None, 0.0
    top = max(counts, key=counts.__getitem__)  # ties: the first seen (max keeps the first of equal keys)
    return top, counts[top] / len(answers)


@dataclass(frozen=True)
class TaskOption:
    """One constructor argument of a task, as the command line and matrix files take it."""

    name: str
    kind: type  # bool, int, float or str
    default: Any
    help: str


class Task:
    """Subclasses set ``name``, ``generation`` and ``reward_modes`` and implement the abstract methods.

    ``reward(prompts, completions)`` is the task's own reward; everyone calls ``score``, which checks
    what the reward function returned (count, finiteness) and names the function when it misbehaves.
    """

    name: str = "task"
    reward_modes: tuple[str, ...] = ("default",)
    generation: GenerationDefaults
    recommended_learning_rate: float = 1e-3  # used when a run leaves learning_rate unset
    # A completion whose reward reaches this counts as correct in the training diagnostics (None: no such notion).
    success_threshold: Optional[float] = None
    tokenizer = None
    preference_labelling = "completions of the starting policy paired at random; the higher task reward is chosen; ties dropped"
    eval_sampler: Optional[Sampler] = None
    # The evaluation's decoding options (``EVAL_DECODING_HELP``), off unless a task's constructor takes and sets them.
    eval_share_prefix = False
    eval_drop_finished = False
    # Help for each constructor argument, shown by --help; a subclass adds its own arguments' entries.
    option_help: dict[str, str] = {"reward_mode": "the task's reward mode"}
    # The evaluation questions in order, for a task that evaluates a list of prompts (None: its evaluation
    # set is no such list, e.g. pizza's one prompt). ``evaluation_subset`` slices it together with the other
    # attributes named in ``eval_question_fields`` (one entry per question each, e.g. GSM8K's problems).
    eval_prompts: Optional[list[str]] = None
    eval_question_fields: tuple[str, ...] = ("eval_prompts",)
    eval_first = 0  # the position of eval_prompts[0] in the task's whole evaluation set (non-zero in a subset)
    _scored: Optional[list] = None  # what ``score`` was given while ``evaluate_per_question`` listens

    @classmethod
    def options(cls) -> dict[str, TaskOption]:
        """The task's options: its constructor's keyword arguments (but ``reward_fn``, a function), typed by
        their annotations or defaults, with help from ``option_help`` of this class and its bases."""
        helps: dict[str, str] = {}
        for klass in reversed(cls.__mro__):
            helps.update(getattr(klass, "option_help", {}) or {})
        hints = {}
        try:
            hints = typing.get_type_hints(cls.__init__)
        except Exception:  # an annotation a plug-in cannot resolve: fall back to the default's type
            pass
        out = {}
        for name, param in inspect.signature(cls.__init__).parameters.items():
            if name in ("self", "reward_fn") or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            default = None if param.default is inspect.Parameter.empty else param.default
            kind = _option_kind(hints.get(name), default)
            out[name] = TaskOption(name, kind, default, helps.get(name, f"option {name} of task {cls.name}"))
        return out

    def __init__(self, reward_mode: Optional[str] = None, reward_fn: Optional[RewardFn] = None):
        mode = reward_mode or self.reward_modes[0]
        if mode not in self.reward_modes:
            raise TaskError(f"task {self.name!r} has no reward mode {mode!r}; choose from {', '.join(self.reward_modes)}")
        self.reward_mode = mode
        self._custom_reward = reward_fn

    # --- to implement -------------------------------------------------------------------------
    def load_policy(self, device: torch.device):
        """Return the starting policy (a transformers PreTrainedModel) on ``device``; sets ``self.tokenizer``."""
        raise NotImplementedError

    def train_prompts(self) -> list[str]:
        raise NotImplementedError

    def reward(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        raise NotImplementedError

    def evaluate(self, model, *, seed: int = 0) -> dict[str, float]:
        """Named metrics of ``model``; at least ``reward`` and ``accuracy``."""
        raise NotImplementedError

    def eval_sampler_options(self, temperature: float) -> dict:
        """The keyword arguments the evaluation's sampler gets from ``eval_share_prefix`` and ``eval_drop_finished``:
        only an installed ``eval_sampler`` (the harness's shared rollout) takes them, transformers' ``sample_batched``
        neither; ``drop_finished`` only when decoding at ``temperature`` 0 (greedy)."""
        if self.eval_sampler is None:
            return {}
        return ({"share_prefix": True} if self.eval_share_prefix else {}) | \
               ({"drop_finished": True} if self.eval_drop_finished and temperature == 0 else {})

    def describe(self) -> dict:
        """Every setting that defines the task, for config.json."""
        return {
            "name": self.name,
            "reward_mode": self.reward_mode,
            "generation": vars(self.generation).copy(),
            "recommended_learning_rate": self.recommended_learning_rate,
            "custom_reward_fn": getattr(self._custom_reward, "__qualname__", None),
            "preference_pairs": self.preference_labelling,
        }

    def preference_pairs(self, policy, n_pairs: int, *, seed: int = 0, max_rounds: int = 16,
                         max_samples: Optional[int] = None) -> dict:
        """Up to ``n_pairs`` (prompt, chosen, rejected) triples for DPO, from ``policy``'s own completions.

        Each round samples an even number of completions per training prompt, shuffles them, pairs
        neighbours and keeps the pairs whose rewards (``score``) differ, the higher one chosen. Returns
        {"prompts", "chosen", "rejected": lists, "samples": completions drawn, "ties_dropped": int,
        "labelled_by": str}.

        ``max_samples``: at most max_samples sampled completions in all (DPO's count_pair_samples: the budget every
        algorithm samples); a round that would pass it samples only its first prompts whose samples all fit, and
        building stops when not one prompt's do (``prompts_that_fit``). The samples a prompt gets follow from
        ``n_pairs``, not from a fixed k: under a cap, at most as many (and at least 2) as let one round of every
        prompt fit it, so that a cap below n_pairs' one round (pizza's one prompt: 512 samples for 256 pairs) still
        samples.
        """
        prompts = self.train_prompts()
        per_prompt = 2 * max(1, math.ceil(n_pairs / len(prompts)))
        if max_samples is not None:
            per_prompt = min(per_prompt, max(2, 2 * (max_samples // (2 * len(prompts)))))
        rng = random.Random(seed)
        out: dict = {"prompts": [], "chosen": [], "rejected": [], "samples": 0, "ties_dropped": 0,
                     "labelled_by": self.preference_labelling}
        for round_ in range(max_rounds):
            fit = prompts_that_fit(len(prompts), per_prompt, out["samples"], max_samples)
            if not fit:
                break
            chunk = prompts[:fit]  # sample_completions samples prompt by prompt: these samples are the whole round's
            groups = sample_completions(
                policy, self.tokenizer, chunk, num_samples=per_prompt, max_new_tokens=self.generation.max_new_tokens,
                temperature=self.generation.temperature, seed=seed + round_,
            )
            for prompt, texts in zip(chunk, groups):
                rng.shuffle(texts)
                rewards = self.score([prompt] * len(texts), texts)
                out["samples"] += len(texts)
                for i in range(0, len(texts) - 1, 2):
                    (ra, a), (rb, b) = (rewards[i], texts[i]), (rewards[i + 1], texts[i + 1])
                    if ra == rb:
                        out["ties_dropped"] += 1
                        continue
                    out["prompts"].append(prompt)
                    out["chosen"].append(a if ra > rb else b)
                    out["rejected"].append(b if ra > rb else a)
            if len(out["chosen"]) >= n_pairs:
                break
        if not out["chosen"]:
            raise TaskError(f"task {self.name!r}: no preference pairs: all {out['samples']} sampled completions tied in reward"
                            f"{sample_cap_note(max_samples, per_prompt)}")
        for key in ("prompts", "chosen", "rejected"):
            del out[key][n_pairs:]
        return out

    # --- shared ---------------------------------------------------------------------------------
    def evaluation_subset(self, first: int, last: Optional[int] = None) -> "Task":
        """A copy of this task that evaluates only questions ``first`` .. ``last`` - 1 of its evaluation set
        (``last`` None or past the end: to the end), with every other setting unchanged, so that a long
        evaluation can run in parts. A task without a list of evaluation questions is one TaskError line."""
        if self.eval_prompts is None:
            raise TaskError(f"task {self.name!r} keeps no list of evaluation questions to take a range of")
        size = len(self.eval_prompts)
        end = size if last is None else min(last, size)
        if not 0 <= first < end:
            raise TaskError(f"questions {first}:{'' if last is None else last} hold none of the {size} evaluation "
                            f"questions of task {self.name!r}")
        subset = copy.copy(self)
        for name in self.eval_question_fields:
            setattr(subset, name, getattr(self, name)[first:end])
        subset.eval_first = self.eval_first + first
        return subset

    def evaluate_per_question(self, model, *, seed: int = 0) -> EvalMetrics:
        """``evaluate`` with per-question results in ``per_question``, what a paired test between two policies reads
        (``evaluate_recorded``); an evaluation that scores no completions (the bandit's is exact) is one TaskError line."""
        metrics = self.evaluate_recorded(model, seed=seed)
        if metrics.per_question is None:
            raise TaskError(f"task {self.name!r} scores no sampled completions in its evaluation, so it has no "
                            "per-question results for a paired test")
        return metrics

    def evaluate_recorded(self, model, *, seed: int = 0) -> EvalMetrics:
        """``evaluate``, the same metrics, with per-question results in ``per_question`` (None where the evaluation
        scores no sampled completions: the bandit's is exact).

        A task whose evaluation keeps its own (GSM8K's, Reasoning Gym's) returns those. Otherwise they are what
        ``evaluate`` passed to ``score``, grouped by prompt in the order first scored (a prompt asked twice is one
        question): per question ``row`` (its position in the whole evaluation set), ``prompt``, the samples'
        ``completions`` and ``reward`` and, where the task has a notion of correct (``success_threshold``),
        ``correct``.
        """
        self._scored = scored = []
        try:
            metrics = self.evaluate(model, seed=seed)
        finally:
            self._scored = None
        if getattr(metrics, "per_question", None) is not None:
            return metrics
        if not scored:
            out = EvalMetrics(metrics)
            out.per_question = None
            return out
        groups: dict[str, dict[str, list]] = {}
        for prompts, completions, rewards in scored:
            for prompt, completion, reward in zip(prompts, completions, rewards):
                group = groups.setdefault(prompt, {"completions": [], "reward": []})
                group["completions"].append(completion)
                group["reward"].append(reward)
        detail = {"row": [self.eval_first + i for i in range(len(groups))], "prompt": list(groups),
                  "completions": [g["completions"] for g in groups.values()],
                  "reward": [g["reward"] for g in groups.values()]}
        if self.success_threshold is not None:
            detail["correct"] = [[r >= self.success_threshold for r in g["reward"]] for g in groups.values()]
        out = EvalMetrics(metrics)
        out.per_question = detail
        return out

    def pass_at_k_prompts(self) -> list[str]:
        """The questions pass@k samples: the evaluation's list where the task keeps one, else its prompts (pizza's
        one prompt, which its evaluation samples too)."""
        return list(self.eval_prompts) if self.eval_prompts is not None else list(self.train_prompts())

    def evaluate_pass_at_k(self, model, ks: Sequence[int], samples: int, *, seed: int = 0) -> dict:
        """pass@k of ``model`` for each k of ``ks`` (``pass_at_k``, averaged over ``pass_at_k_prompts``): ``samples``
        completions a question at the task's own temperature and length cap, seeded, through the installed
        ``eval_sampler`` (else ``sample_batched``), a batch of questions at a time (batch i seeded ``seed + i``); a
        completion is correct when its ``score`` reaches ``success_threshold``. Returns {"pass_at_k": {str(k): value},
        "correct": per question, per sample, bools}.
        A task with no notion of correct, or ``samples`` below a k, is one TaskError line."""
        if self.success_threshold is None:
            raise TaskError(f"task {self.name!r} states no success threshold, so it has no pass@k")
        if not ks or min(ks) < 1 or max(ks) > samples:
            raise TaskError(f"pass@k needs 1 <= k <= the samples per question ({samples}); got k = "
                            f"{', '.join(map(str, ks)) or 'none'}")
        prompts = self.pass_at_k_prompts()
        sampler = self.eval_sampler or sample_batched
        per_batch = max(1, PASS_AT_K_ROWS // samples)  # the installed sampler decodes all it is given as one batch
        correct = []
        for batch, start in enumerate(range(0, len(prompts), per_batch)):
            chunk = prompts[start:start + per_batch]
            drawn = sampler(model, self.tokenizer, chunk, k=samples, max_new_tokens=self.generation.max_new_tokens,
                            temperature=self.generation.temperature, seed=seed + batch)
            for prompt, texts in zip(chunk, drawn.texts):
                rewards = self.score([prompt] * len(texts), texts)
                correct.append([r >= self.success_threshold for r in rewards])
        return {"pass_at_k": {str(k): sum(pass_at_k(samples, sum(row), k) for row in correct) / len(correct)
                              for k in sorted(set(ks))},
                "correct": correct}

    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        fn = self._custom_reward or self.reward
        fn_name = getattr(fn, "__qualname__", repr(fn))
        try:
            values = fn(prompts, completions)
        except Exception as exc:  # a user's reward function may raise anything
            raise RewardError(f"reward function {fn_name} raised {type(exc).__name__}: {exc}") from exc
        except SystemExit as exc:  # sys.exit() in a reward would end the run with its status and no summary
            raise RewardError(f"reward function {fn_name} called sys.exit({exc.code!r}): "
                              "it must return its rewards") from exc
        try:
            values = [float(v) for v in values]
        except (TypeError, ValueError) as exc:
            raise RewardError(f"reward function {fn_name} returned non-numeric values: {exc}") from exc
        if len(values) != len(completions):
            raise RewardError(
                f"reward function {fn_name} returned {len(values)} values for {len(completions)} completions"
            )
        for i, v in enumerate(values):
            if not math.isfinite(v):
                raise RewardError(f"reward function {fn_name} returned {v} for completion {i} ({completions[i]!r})")
        if self._scored is not None:
            self._scored.append((list(prompts), list(completions), values))
        return values


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from ``n`` samples of which ``c`` are correct (Chen et al. 2021, Eq. 1):

        pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i)

    the chance that k of the n samples drawn without replacement hold a correct one, as a product (the binomials
    overflow a float for large n). 1 when n - c < k (every k-subset holds a correct sample)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n {n}, c {c}, k {k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def _option_kind(hint, default) -> type:
    if isinstance(default, (bool, int, float, str)):
        return type(default)
    args = [a for a in typing.get_args(hint) if a is not type(None)] if hint is not None else []
    candidate = args[0] if args else hint
    return candidate if candidate in (bool, int, float, str) else str


# Filled by ``register_task`` at each task's definition and, for installed plug-ins, by the entry-point
# group ``grpo_bench.tasks`` (benchmarks/plugins.py).
TASKS: dict[str, type[Task]] = {}


def register_task(cls=None, *, name: Optional[str] = None):
    """Class decorator: ``TASKS[name or cls.name] = cls``; a second, different class under a taken name is refused."""

    def register(cls):
        if not (isinstance(cls, type) and issubclass(cls, Task)):
            raise TypeError(f"{cls!r} is not a subclass of tasks.Task")
        key = name or cls.name
        taken = TASKS.get(key)
        if taken is not None and taken is not cls:
            raise ValueError(f"task name {key!r} is taken by {taken.__module__}.{taken.__qualname__}; "
                             f"{cls.__module__}.{cls.__qualname__} needs another name")
        TASKS[key] = cls
        return cls

    return register if cls is None else register(cls)


def make_task(name: str, **options) -> Task:
    """An instance of the registered task ``name``, or one TaskError listing the choices."""
    if name not in TASKS:
        raise TaskError(f"unknown task {name!r}; choose from {', '.join(sorted(TASKS))}")
    return TASKS[name](**options)


def prompts_that_fit(prompts: int, per_prompt: int, spent: int, max_samples: Optional[int]) -> int:
    """How many of a round's ``prompts`` (``per_prompt`` samples each) a preference-pair builder may sample when
    ``spent`` samples are drawn already and at most ``max_samples`` may be in all: the most whose samples all fit,
    0 when not one prompt's do (building stops), every one without a cap (None)."""
    if max_samples is None:
        return prompts
    return max(0, min(prompts, (max_samples - spent) // per_prompt))


def sample_cap_note(max_samples: Optional[int], per_prompt: int) -> str:
    """What a "no preference pairs" TaskError line adds about a cap of ``max_samples`` samples (nothing without one)."""
    return "" if max_samples is None else f" (max_samples {max_samples}, {per_prompt} samples a prompt)"


def reward_ranked_pairs(task: "Task", prompts: Sequence[str], n_pairs: int, *, rng: random.Random,
                        sample: Callable[[list[str], int], "Samples"], per_prompt: int,
                        max_samples: Optional[int] = None) -> dict:
    """Up to ``n_pairs`` DPO pairs labelled by ``task``'s own reward: in rounds (at most 16), ``n_pairs`` prompts
    drawn by ``rng`` and sampled by ``sample(chunk, round)``, ``per_prompt`` samples each; chosen a highest-reward
    and rejected a lowest-reward completion among those that ended with EOS (DPO closes every completion with EOS);
    a prompt whose ended samples all tie is dropped and counted. ``max_samples``: at most max_samples sampled
    completions in all (DPO's count_pair_samples: the budget every algorithm samples); a round that would pass it
    samples only the first of its drawn prompts whose samples all fit, and building stops when not one prompt's do.
    One TaskError line when no pair could be made."""
    out: dict = {"prompts": [], "chosen": [], "rejected": [], "samples": 0, "ties_dropped": 0,
                 "labelled_by": task.preference_labelling}
    for round_ in range(16):
        fit = prompts_that_fit(min(len(prompts), n_pairs), per_prompt, out["samples"], max_samples)
        if not fit:
            break
        chunk = rng.sample(list(prompts), min(len(prompts), n_pairs))[:fit]
        samples = sample(chunk, round_)
        for prompt, texts, cut in zip(chunk, samples.texts, samples.truncated):
            out["samples"] += len(texts)
            ended = [t for t, c in zip(texts, cut) if not c]
            rewards = task.score([prompt] * len(ended), ended)
            if len(ended) < 2 or max(rewards) == min(rewards):
                out["ties_dropped"] += 1
                continue
            out["prompts"].append(prompt)
            out["chosen"].append(rng.choice([t for t, r in zip(ended, rewards) if r == max(rewards)]))
            out["rejected"].append(rng.choice([t for t, r in zip(ended, rewards) if r == min(rewards)]))
        if len(out["chosen"]) >= n_pairs:
            break
    if not out["chosen"]:
        raise TaskError(f"{task.name}: no preference pairs: all {out['samples']} samples tied or were truncated"
                        f"{sample_cap_note(max_samples, per_prompt)}")
    for key in ("prompts", "chosen", "rejected"):
        del out[key][n_pairs:]
    return out


@contextmanager
def _sampling(model, tokenizer, seed: int):
    """Eval mode, left padding, no gradients and a forked RNG seeded with ``seed``, all undone on exit
    (so evaluating never shifts a training run's random stream); yields the model's device."""
    device = next(model.parameters()).device
    was_training, saved_side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
            torch.manual_seed(seed)
            yield device
    finally:
        tokenizer.padding_side = saved_side
        model.train(was_training)


def sample_completions(
    model, tokenizer, prompts: Sequence[str], *, num_samples: int, max_new_tokens: int, temperature: float,
    seed: int, batch_size: int = 256,
) -> list[list[str]]:
    """``num_samples`` completions per prompt with plain ancestral sampling (no top-k / top-p), seeded.

    Returns one list per prompt of the text before the first EOS, the same convention as training
    rollouts. Runs under a forked RNG so evaluating never shifts a training run's random stream.
    """
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    results: list[list[str]] = []
    with _sampling(model, tokenizer, seed) as device:
        for prompt in prompts:
            texts: list[str] = []
            while len(texts) < num_samples:
                n = min(batch_size, num_samples - len(texts))
                enc = tokenizer([prompt] * n, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
                out = model.generate(
                    **enc, do_sample=temperature > 0, temperature=temperature if temperature > 0 else None,
                    top_k=0, top_p=1.0, max_new_tokens=max_new_tokens, pad_token_id=pad, eos_token_id=eos,
                )
                for row in out[:, enc["input_ids"].size(1):].tolist():
                    cut = row.index(eos) if eos in row else len(row)
                    texts.append(tokenizer.decode(row[:cut], skip_special_tokens=False))
            results.append(texts)
    return results


def load_pretrained(path: str, device=None):
    """(model, tokenizer) from a Hugging Face id or local directory, or one clear TaskError."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path)
    except (OSError, ValueError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TaskError(f"cannot load a causal LM from {path!r}: {first_line}") from exc
    return (model.to(device) if device is not None else model), tokenizer


@dataclass
class Samples:
    """``k`` completions per prompt, in prompt order: texts before the first EOS, and truncation flags."""

    texts: list[list[str]]
    truncated: list[list[bool]]  # no EOS within max_new_tokens
    tokens: int  # completion tokens generated, EOS included


def sample_batched(
    model, tokenizer, prompts: Sequence[str], *, k: int, max_new_tokens: int, temperature: float, seed: int,
    prompts_per_batch: int = 16, eos_token_ids: Optional[Sequence[int]] = None,
) -> Samples:
    """``sample_completions`` for many distinct prompts at once (a real model's evaluation).

    ``prompts_per_batch`` prompts x ``k`` samples go through one left-padded ``generate`` call, which
    stops as soon as every row has ended; prompts are batched in the given order, so for a seed the
    samples are reproducible. Same sampling (no top-k / top-p) and forked RNG as ``sample_completions``.
    """
    eos = eos_token_ids or model.generation_config.eos_token_id or tokenizer.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos)  # transformers allows one id or a list
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    texts: list[list[str]] = []
    truncated: list[list[bool]] = []
    tokens = 0
    with _sampling(model, tokenizer, seed) as device:
        for start in range(0, len(prompts), prompts_per_batch):
            chunk = list(prompts[start:start + prompts_per_batch])
            enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
            out = model.generate(
                **enc, do_sample=temperature > 0, temperature=temperature if temperature > 0 else None,
                top_k=0, top_p=1.0, max_new_tokens=max_new_tokens, pad_token_id=pad, eos_token_id=eos,
                num_return_sequences=k,
            )  # (len(chunk) * k, P + T), grouped prompt by prompt
            for i, row in enumerate(out[:, enc["input_ids"].size(1):].tolist()):
                cut = next((j for j, t in enumerate(row) if t in eos), None)
                if i % k == 0:
                    texts.append([])
                    truncated.append([])
                texts[-1].append(tokenizer.decode(row[:cut], skip_special_tokens=False))
                truncated[-1].append(cut is None)
                tokens += len(row) if cut is None else cut + 1
    return Samples(texts, truncated, tokens)
