"""Start accuracies of a task's starting policy across candidate settings (``grpo-bench survey``).

Made for choosing Reasoning Gym datasets with headroom: each candidate is a set of task options (a
dataset and its config); the starting policy is loaded once and evaluated on each candidate's held-out
problems with the task's own evaluation (the shared rollout sampler). One row per candidate, appended
to OUT/survey.csv as soon as it is measured (a killed survey keeps its rows, and ``--resume`` skips
candidates already there, giving a row an earlier version wrote its constant baseline, which needs no policy);
OUT/survey.md is the table rewritten from the CSV after every row. OUT/survey.json
keeps what the CSV does not: every command that added rows and the candidates that could not be built, so a
resumed survey's table names all of them.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from benchmarks.errors import UsageError
from benchmarks.harness import measure
from benchmarks.harness.loop import make_evaluated_task
from benchmarks.io import atomic_write_json, atomic_write_text, read_json
from benchmarks.markdown import markdown_table
from tasks import TASKS, Task
from tasks.base import TaskError
from tasks.smollm import prepare_tokenizer

COLUMNS = ("candidate", "task_options", "questions", "accuracy", "accuracy_se", "score", "format", "truncated",
           "completion_tokens", "seconds", "in_band", "constant_baseline", "answer_top_share")


@dataclass(frozen=True)
class SurveySettings:
    task: str
    candidates: tuple[dict, ...]  # task options per candidate, each merged over ``common``
    common: dict = field(default_factory=dict)  # task options every candidate shares (e.g. eval_problems)
    band: tuple[float, float] = (0.10, 0.60)  # start accuracy with headroom: marked in_band
    # A candidate where one answer given to every question scores above this is not in band, whatever its start:
    # a policy can climb to that answer's share without learning the skill (letter_counting's 3-5 words, 0.57).
    max_baseline: float = 0.25
    seed: int = 0
    device: str = "cpu"
    command: Optional[str] = None


def candidate_label(options: dict) -> str:
    config = options.get("dataset_config")
    if isinstance(config, str) and config:
        config = json.loads(config)
    label = str(options.get("dataset", "?"))
    if config:
        label += " " + ", ".join(f"{k}={v}" for k, v in config.items())
    rest = {k: v for k, v in options.items() if k not in ("dataset", "dataset_config")}
    return label + (" | " + ", ".join(f"{k}={v}" for k, v in rest.items()) if rest else "")


def _read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def markdown(rows: list[dict], settings: SurveySettings, environment: str, skipped: Sequence[str] = (),
             commands: Sequence[str] = ()) -> str:
    lo, hi = settings.band
    common = ", ".join(f"{k}={v}" for k, v in settings.common.items()) or "the task's defaults"
    defaults = {name: option.default for name, option in TASKS[settings.task].options().items()
                if name not in ("dataset", "dataset_config", "model", "reward_mode")} if settings.task in TASKS else {}
    shared = ", ".join(f"{k}={json.dumps(v)}" for k, v in {**defaults, **settings.common}.items())
    lines = [f"# Start accuracy survey: task `{settings.task}`", "",
             f"Starting policy evaluated on each candidate's held-out problems ({common}; evaluation seed "
             f"{settings.seed}; {environment}). Every candidate's task options besides its dataset: {shared}. "
             f"accuracy: the dataset's score_answer == 1.0; score: its mean "
             f"score_answer; format: a complete <answer>...</answer> group was written; ± is the binomial standard "
             f"error; constant baseline: the accuracy of the best single answer given to every question (the task's "
             f"constant_baseline), the ceiling of a policy that learns the answers' distribution and not the skill; "
             f"top answer: the share of the starting policy's answers that are its most common one; in_band: start "
             f"accuracy in [{lo:.2f}, {hi:.2f}] and a constant baseline of at most {settings.max_baseline:.2f} "
             f"(`no: shortcut` where the baseline is higher). Written by "
             + ", then ".join(f"`{c}`" for c in (commands or [settings.command or "grpo-bench survey"])) + ".",
             "", markdown_table(
                 ["candidate", "questions", "accuracy", "score", "format", "truncated", "tokens/completion", "seconds",
                  "constant baseline", "top answer", "in band"],
                 [[r["candidate"], r["questions"], f"{float(r['accuracy']):.3f} ± {float(r['accuracy_se']):.3f}",
                   f"{float(r['score']):.3f}", f"{float(r['format']):.3f}", f"{float(r['truncated']):.3f}",
                   f"{float(r['completion_tokens']):.1f}", f"{float(r['seconds']):.0f}", _cell(r, "constant_baseline"),
                   _cell(r, "answer_top_share"), r["in_band"]] for r in rows])]
    if skipped:
        lines += ["", "Not measured (the task could not be built):", ""] + [f"- {line}" for line in skipped]
    return "\n".join(lines) + "\n"


def _cell(row: dict, name: str) -> str:
    """A measure the row may lack (a row an earlier version of the survey wrote): '-' then."""
    value = row.get(name)
    return f"{float(value):.3f}" if value not in (None, "") else "-"


def in_band(accuracy: float, baseline: Optional[float], settings: SurveySettings) -> str:
    """'yes', 'no' (start accuracy outside the band) or 'no: shortcut' (one answer to all scores above
    ``max_baseline``); a baseline not known (None) leaves the start accuracy to decide."""
    if not settings.band[0] <= accuracy <= settings.band[1]:
        return "no"
    return "no: shortcut" if baseline is not None and baseline > settings.max_baseline else "yes"


def run_survey(settings: SurveySettings, out: Path, *, resume: bool = False, log: Callable[[str], None] = print) -> list[dict]:
    """Evaluate every candidate (skipping, with ``resume``, those already in OUT/survey.csv); returns all rows."""
    if not settings.candidates:
        raise UsageError("survey: no candidates")
    device = measure.requested_device(settings.device)
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "survey.csv"
    rows = _read_rows(csv_path) if resume else []
    if not resume and csv_path.exists():
        csv_path.unlink()
    earlier = (read_json(out / "survey.json") or {}) if resume else {}
    commands = [c for c in earlier.get("commands", []) if c != settings.command] + [settings.command or "grpo-bench survey"]
    skipped = list(earlier.get("skipped", []))
    write = functools.partial(_write, out, rows, settings, _environment_line(device), skipped, commands)
    done = {r["task_options"] for r in rows}
    model = None
    for candidate in settings.candidates:
        options = {**settings.common, **candidate}
        key = json.dumps(options, sort_keys=True)
        if key in done:
            row = next(r for r in rows if r["task_options"] == key)
            if row.get("constant_baseline") is None:  # a row of a survey before baselines: it needs no policy
                try:
                    _with_baseline(row, make_evaluated_task(settings.task, **options), settings)
                    _write_rows(csv_path, rows)
                except TaskError:
                    pass
            log(f"survey: {candidate_label(candidate)}: already measured, skipped")
            continue
        try:
            task = make_evaluated_task(settings.task, **options)
        except TaskError as exc:  # one candidate that cannot be built (too few distinct problems) is reported, not fatal
            line = f"{candidate_label(candidate)}: {exc}"
            skipped += [line] if line not in skipped else []
            log(f"survey: {line}")
            write()
            continue
        model = _policy(task, model, options, device)
        row, seconds = _measured(task, model, candidate, key, settings)
        rows.append(row)
        _write_rows(csv_path, rows)
        write()
        log(f"survey: {row['candidate']}: accuracy {row['accuracy']}, format {row['format']}, "
            f"{row['completion_tokens']} tokens/completion, {seconds:.0f} s")
    write()
    return rows


def _environment_line(device) -> str:
    """The device and the library versions, as the table's header names them."""
    environment = measure.environment(device)
    versions = environment["versions"]
    return f"{environment['device_name']}, torch {versions.get('torch', '?')}, transformers {versions.get('transformers', '?')}"


def _write(out: Path, rows: list[dict], settings: SurveySettings, env_line: str, skipped: list[str],
           commands: list[str]) -> None:
    """OUT/survey.json (the commands and the candidates not built) and OUT/survey.md, from the rows so far."""
    atomic_write_json(out / "survey.json", {"commands": commands, "skipped": skipped})
    atomic_write_text(out / "survey.md", markdown(rows, settings, env_line, skipped, commands))


def _policy(task: Task, model, options: dict, device):
    """The starting policy, loaded once and shared (its tokenizer's padding and ends given to each candidate's
    own tokenizer); loaded again for a candidate that names its own model."""
    if model is None or options.get("model"):
        return task.load_policy(device)
    prepare_tokenizer(model, task.tokenizer)
    return model


def _measured(task: Task, model, candidate: dict, key: str, settings: SurveySettings) -> tuple[dict, float]:
    """A candidate's row (its evaluation's numbers as the CSV holds them) and the seconds its evaluation took."""
    start = time.perf_counter()
    metrics = task.evaluate(model, seed=settings.seed)
    seconds = time.perf_counter() - start
    row = {"candidate": candidate_label(candidate), "task_options": key, "questions": len(task.eval_prompts),
           "seconds": f"{seconds:.1f}"}
    for name in ("accuracy", "accuracy_se", "score", "format", "truncated", "completion_tokens", "answer_top_share"):
        row[name] = f"{metrics[name]:.4f}" if name in metrics else ""
    return _with_baseline(row, task, settings), seconds


def _with_baseline(row: dict, task: Task, settings: SurveySettings) -> dict:
    """``row`` with the task's constant baseline (where the task has one) and its in-band mark from both."""
    baseline = task.constant_baseline()[1] if hasattr(task, "constant_baseline") else None
    row["constant_baseline"] = "" if baseline is None else f"{baseline:.4f}"
    row["in_band"] = in_band(float(row["accuracy"]), baseline, settings)
    return row


def _write_rows(csv_path: Path, rows: list[dict]) -> None:
    """OUT/survey.csv written whole (atomically) from ``rows``: a row an earlier version wrote gains the new columns."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, restval="", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(csv_path, buffer.getvalue())
