"""A task made of your own prompts, reward function and causal LM: the task behind ``benchmarks.api.train``.

From Python: ``PromptsTask.from_objects(model, tokenizer, prompts, reward_fn)``. From the command line:
``--task prompts --model HF_ID_OR_DIR --prompts prompts.txt --reward-fn rewards.py:score`` (a .txt file
holds one prompt a line; a .jsonl file one {"prompt": ...} object a line).

Prompts go through the tokenizer's chat template as one user message when the tokenizer has one
(``chat_template``), else they are used as plain text, and config.json says which. Evaluation samples
``eval_samples`` completions per evaluation prompt (the training prompts unless ``eval_prompts`` is given)
with plain ancestral sampling; ``reward`` is their mean reward and ``accuracy`` the share whose reward is
above ``accuracy_threshold`` (default 0: the share of completions with any reward). The task cannot tell
which of your questions to hold out, so ``eval_set = "validation"`` (a matrix's tuning stage) evaluates the
``validation_prompts`` you give, refused when they are missing or share a prompt with training or evaluation.
"""

from __future__ import annotations

import math

import json
from pathlib import Path
from typing import Optional, Sequence

from tasks.base import GenerationDefaults, Task, TaskError, load_pretrained, register_task, sample_completions

EVAL_SETS = ("test", "validation")


def read_prompts(path: str) -> list[str]:
    """Prompts from a .txt file (one a line) or a .jsonl file (one {"prompt": ...} a line)."""
    try:
        lines = [(n, line) for n, line in enumerate(Path(path).read_text().splitlines(), 1) if line.strip()]
    except OSError as exc:
        raise TaskError(f"cannot read prompts from {path!r}: {exc.strerror or exc}") from None
    if not path.endswith(".jsonl"):
        return [line for _, line in lines]
    prompts = []
    for n, line in lines:
        try:
            prompts.append(json.loads(line)["prompt"])
        except (ValueError, KeyError, TypeError) as exc:
            raise TaskError(f"{path}: every line must be a JSON object with a \"prompt\" ({type(exc).__name__}: {exc})") from None
        if not isinstance(prompts[-1], str) or not prompts[-1]:
            raise TaskError(f"{path}:{n}: the prompt must be a non-empty string, got {prompts[-1]!r}")
    return prompts


def _check_eval_set(eval_set: str, validation_prompts) -> None:
    if eval_set not in EVAL_SETS:
        raise TaskError(f"eval_set must be one of {', '.join(EVAL_SETS)}, got {eval_set!r}")
    if eval_set == "validation" and not validation_prompts:
        raise TaskError("task prompts cannot hold your questions out by itself: eval_set validation needs "
                        "validation_prompts (a file, or a list from Python)")


@register_task
class PromptsTask(Task):
    """Your prompts and reward on any transformers causal LM; accuracy = share of rewards above a threshold."""

    name = "prompts"
    reward_modes = ("custom",)
    generation = GenerationDefaults(max_new_tokens=64, temperature=1.0)
    recommended_learning_rate = 1e-5  # a pretrained model's full fine-tuning rate; set learning_rate for yours
    option_help = {
        "model": "a Hugging Face model id or local directory (save_pretrained) of a causal LM with its tokenizer",
        "prompts": "training prompts: a .txt file (one a line) or .jsonl file ({\"prompt\": ...} a line)",
        "eval_prompts": "evaluation prompts, same formats (default: the training prompts)",
        "eval_samples": "completions sampled per evaluation prompt",
        "accuracy_threshold": "accuracy is the share of evaluation completions whose reward is above this",
        "chat_template": "wrap each prompt as a user message in the tokenizer's chat template, when it has one",
        "eval_set": "test: evaluate eval_prompts (the verdicts'); validation (tuning's): evaluate validation_prompts",
        "validation_prompts": "the prompts eval_set validation evaluates, same formats; none may be a training or "
                              "evaluation prompt",
    }

    def __init__(self, reward_mode: Optional[str] = None, reward_fn=None, model: Optional[str] = None,
                 prompts: Optional[str] = None, eval_prompts: Optional[str] = None, eval_samples: int = 8,
                 accuracy_threshold: float = 0.0, chat_template: bool = True, eval_set: str = "test",
                 validation_prompts: Optional[str] = None):
        self._setup(reward_mode, reward_fn, eval_samples, accuracy_threshold, chat_template)
        _check_eval_set(eval_set, validation_prompts)
        if model is None or prompts is None:
            raise TaskError("task prompts needs --model (a hub id or local directory) and --prompts FILE")
        if reward_fn is None:
            raise TaskError("task prompts has no reward of its own: give --reward-fn MODULE:FUNC")
        self.model_path = model
        self._model, self.tokenizer = load_pretrained(model)
        self._set_prompts(read_prompts(prompts), read_prompts(eval_prompts) if eval_prompts else None)
        if eval_set == "validation":
            self._set_validation(read_prompts(validation_prompts))

    def _setup(self, reward_mode, reward_fn, eval_samples: int, accuracy_threshold: float, chat_template: bool) -> None:
        super().__init__(reward_mode, reward_fn)
        if eval_samples < 1:
            raise TaskError(f"eval_samples must be >= 1, got {eval_samples}")
        self.eval_samples, self.accuracy_threshold, self.use_chat_template = eval_samples, accuracy_threshold, chat_template
        # The training diagnostics count a completion correct at reward >= success_threshold; accuracy here is reward > threshold.
        self.success_threshold = math.nextafter(accuracy_threshold, math.inf)
        self.model_path, self.eval_set = None, "test"

    @classmethod
    def from_objects(cls, model, tokenizer, prompts: Sequence[str], reward_fn, *, eval_prompts: Optional[Sequence[str]] = None,
                     generation: Optional[GenerationDefaults] = None, reward_mode: Optional[str] = None,
                     eval_samples: int = 8, accuracy_threshold: float = 0.0, chat_template: bool = True,
                     eval_set: str = "test", validation_prompts=None) -> "PromptsTask":
        """The task of an already-loaded ``model`` and ``tokenizer`` (trained in place), ``prompts`` and
        ``reward_fn(prompts, completions) -> list[float]``; ``validation_prompts`` a list or a file."""
        if not callable(reward_fn):
            raise TaskError(f"reward_fn must be a function (prompts, completions) -> list of floats, got {reward_fn!r}")
        task = cls.__new__(cls)
        task._setup(reward_mode, reward_fn, eval_samples, accuracy_threshold, chat_template)
        _check_eval_set(eval_set, validation_prompts)
        task._model, task.tokenizer = model, tokenizer
        if generation is not None:
            task.generation = generation
        task._set_prompts(list(prompts), list(eval_prompts) if eval_prompts is not None else None)
        if eval_set == "validation":
            task._set_validation(read_prompts(validation_prompts) if isinstance(validation_prompts, str)
                                 else list(validation_prompts))
        return task

    def _set_prompts(self, prompts: list[str], eval_prompts: Optional[list[str]]) -> None:
        if not prompts or not all(isinstance(p, str) for p in prompts):
            raise TaskError("prompts must be a non-empty list of strings")
        if eval_prompts is not None and not all(isinstance(p, str) for p in eval_prompts):
            raise TaskError("eval_prompts must be a list of strings")
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.has_chat_template = bool(getattr(self.tokenizer, "chat_template", None))
        self._prompts = self._formatted(prompts, "prompts")
        self._eval_prompts = self._formatted(eval_prompts, "eval_prompts") if eval_prompts else self._prompts

    def _set_validation(self, prompts: list[str]) -> None:
        """Evaluate ``prompts`` instead of the evaluation prompts; one that is also a training or evaluation prompt is
        refused, as tuning would then select on questions it trained on or that the verdicts judge on."""
        if not prompts or not all(isinstance(p, str) for p in prompts):
            raise TaskError("validation_prompts must be a non-empty list of strings")
        formatted = self._formatted(prompts, "validation_prompts")
        taken = set(self._prompts) | set(self._eval_prompts)
        for i, prompt in enumerate(formatted):
            if prompt in taken:
                raise TaskError(f"validation_prompts[{i}] ({prompts[i]!r}) is also a training or evaluation prompt: "
                                "validation prompts must be held out of both")
        self._eval_prompts, self.eval_set = formatted, "validation"

    def _formatted(self, prompts: list[str], which: str) -> list[str]:
        """The prompts as the policy sees them; one that is empty, or no tokens to the tokenizer, is refused:
        a rollout needs at least one prompt token to start from."""
        out = [self._format(p) for p in prompts]
        tokens = self.tokenizer(out, add_special_tokens=False)["input_ids"]
        for i, (prompt, ids) in enumerate(zip(prompts, tokens)):
            if not prompt or not ids:
                what = "empty" if not prompt else f"no tokens to the tokenizer ({prompt!r})"
                raise TaskError(f"{which}[{i}] is {what}: every prompt needs some text")
        return out

    def _format(self, prompt: str) -> str:
        if self.use_chat_template and self.has_chat_template:
            return self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                      add_generation_prompt=True)
        return prompt

    def load_policy(self, device):
        return self._model.to(device)

    def train_prompts(self) -> list[str]:
        return self._prompts

    def reward(self, prompts, completions):  # only reached without a reward function, which __init__ refuses
        raise TaskError("task prompts has no reward of its own")

    def evaluate(self, model, *, seed: int = 0) -> dict[str, float]:
        groups = sample_completions(model, self.tokenizer, self._eval_prompts, num_samples=self.eval_samples,
                                    max_new_tokens=self.generation.max_new_tokens,
                                    temperature=self.generation.temperature, seed=seed)
        prompts = [p for p, texts in zip(self._eval_prompts, groups) for _ in texts]
        rewards = self.score(prompts, [t for texts in groups for t in texts])
        return {"accuracy": sum(r > self.accuracy_threshold for r in rewards) / len(rewards),
                "reward": sum(rewards) / len(rewards)}

    def describe(self) -> dict:
        fmt = ("the tokenizer's chat template (one user message)" if self.use_chat_template and self.has_chat_template
               else "plain text (" + ("the tokenizer has no chat template" if self.use_chat_template
                                      else "chat_template off") + ")")
        return {**super().describe(), "model": self.model_path or type(self._model).__name__ + " (given in Python)",
                "prompt_format": fmt, "train_prompts": len(self._prompts), "eval_prompts": len(self._eval_prompts),
                "eval_samples": self.eval_samples, "eval_set": self.eval_set,
                "accuracy": f"share of evaluation rewards > {self.accuracy_threshold}"}
