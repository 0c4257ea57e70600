"""Markdown, written in one place: tables and the number formats every report shares, and the README
sections the tool owns (text between ``<!-- grpo-bench:NAME -->`` and ``<!-- /grpo-bench:NAME -->`` is
replaced whole; nothing else in the file is touched). It sits at the bottom beside ``io``: the harness,
the checks, the perf benches and the report all write markdown through it.
"""

from __future__ import annotations

import decimal
import math
import os
import re
from pathlib import Path
from typing import Any, Optional, Sequence

from benchmarks.errors import UsageError
from benchmarks.io import atomic_write_text


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table; a cell is ``str(value)`` with ``|`` escaped and newlines flattened, None is "-"."""

    def cell(v):
        return "-" if v is None else str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def na_text(seeds: int | None = None) -> str:
    """What stands where an interval (or a spread-based number) cannot be had: "n/a", with the reason when it
    is too few seeds ("n/a (1 seed)": one seed has no seed-to-seed spread, a bootstrap over it is zero-width)."""
    if not _too_few(seeds):
        return "n/a"
    seeds = int(seeds)
    return f"n/a ({seeds} seed{'' if seeds == 1 else 's'})"


def _missing(value) -> bool:
    try:
        return value is None or math.isnan(value)
    except TypeError:
        return False


def _too_few(seeds: int | None) -> bool:
    return seeds is not None and not _missing(seeds) and int(seeds) < 2


def number_or_na(value: float, fmt: str = "{:.3f}", seeds: int | None = None) -> str:
    """``value`` formatted, or ``na_text(seeds)`` when it is nan or rests on fewer than 2 seeds (an MDD, a sd)."""
    return na_text(seeds) if _missing(value) or _too_few(seeds) else fmt.format(value)


def lower_bound(value: float) -> str:
    """A positive lower bound to three decimals, or to two significant digits when it is below 0.001, so a
    bound that is above 0 never reads "0.000"; rounded toward zero (0.0055 reads 0.005, 0.00096 reads 0.00096), so
    that a bound a reader quotes never overstates."""
    if not math.isfinite(value):
        return f"{value}"
    exact = decimal.Decimal(repr(float(value)))  # the shortest decimal that round-trips: 0.006 stays 0.006
    if 0 < value < 0.001:
        step = decimal.Decimal(1).scaleb(exact.adjusted() - 1)  # two significant digits
        return f"{float(exact.quantize(step, rounding=decimal.ROUND_DOWN)):.2g}"
    return f"{exact.quantize(decimal.Decimal('0.001'), rounding=decimal.ROUND_DOWN):f}"


def plus_minus(mean: float, half: float, fmt: str = "{:.3f}", scale: float = 1.0, seeds: int | None = None) -> str:
    """``mean ± half``; "-" when the mean is nan; ``mean ± n/a`` when the half-width is nan, ``mean ± n/a (1 seed)``
    when ``seeds`` < 2 (the mean alone would read as exact)."""
    if _missing(mean):
        return "-"
    text = fmt.format(mean * scale)
    if _missing(half) or _too_few(seeds):
        return f"{text} ± {na_text(seeds)}"
    return f"{text} ± {fmt.format(half * scale)}"


def with_interval(point: float, low: float, high: float, fmt: str = "{:.3f}", seeds: int | None = None) -> str:
    """``point [low, high]``, as a bootstrap interval is written; ``point [n/a]`` when a bound is nan,
    ``point [n/a (1 seed)]`` when ``seeds`` < 2 (a bootstrap over one seed is zero-width, not certain); "-" when
    the point is nan."""
    if _missing(point):
        return "-"
    if _missing(low) or _missing(high) or _too_few(seeds):
        return f"{fmt.format(point)} [{na_text(seeds)}]"
    return f"{fmt.format(point)} [{fmt.format(low)}, {fmt.format(high)}]"


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- grpo-bench:{name} -->", f"<!-- /grpo-bench:{name} -->"


def update_section(path: Path | str, name: str, body: str) -> None:
    """Replace section ``name`` of ``path`` with ``body`` (appending the section if it is new). Markers that do
    not pair up are refused, the file untouched: guessing where the section ends would delete what follows."""
    path = Path(path)
    try:
        text = path.read_text() if path.exists() else ""
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read it as a markdown file ({getattr(exc, 'strerror', None) or exc})") from None
    start, end = _markers(name)
    block = f"{start}\n{body.rstrip()}\n{end}"
    starts, ends = text.count(start), text.count(end)
    if not starts and not ends:
        text = text.rstrip() + "\n\n" + block + "\n"
    else:
        problem = (f"{start} without its end marker {end}" if not ends else
                   f"{end} without its start marker {start}" if not starts else
                   f"{start} appears {starts} times" if starts > 1 else
                   f"{end} appears {ends} times" if ends > 1 else
                   f"{end} comes before {start}" if text.index(end) < text.index(start) else None)
        if problem:
            raise UsageError(f"{path}: section {name} has malformed markers ({problem}); the file is left as it was, "
                             f"fix its markers by hand")
        head, rest = text.split(start)
        text = head + block + rest.split(end)[1]
    atomic_write_text(path, text)


def write_report(path: Path | str, body: str, *, title: str = "", readme: Optional[str] = None,
                 section: Optional[str] = None, section_body: Optional[str] = None) -> None:
    """A study's report: ``path`` gets ``# TITLE`` (when given) and ``body``; with ``readme`` (the ``--readme``
    page; None or '' for none) its section ``section`` gets ``section_body``, else the body without the title.
    Every study writes its report and README section through this, most of them by the lifecycle's ``Study.write``
    (benchmarks/study.py)."""
    atomic_write_text(Path(path), (f"# {title}\n\n" if title else "") + body)
    write_section(readme, section, body if section_body is None else section_body)


def write_section(readme: Optional[str], section: str, body: str) -> None:
    """``--readme``'s section ``section`` <- ``body``; nothing when no page is named (None or '')."""
    if readme:
        update_section(readme, section, body)


# The reports the README's "checks and benchmarks" table points to, in README order: (report file, what it
# checks or measures, the command that writes it). Each report is written by its own command; the README
# keeps one line of each, its headline, so that a newcomer reads the results in minutes.
REPORTS = (
    ("results/mu1/report.md", "Why a GRPO loss reads 0 at mu = 1 (pizza)", "grpo-bench check mu1"),
    ("results/mu1-gsm8k/report.md", "The same on GSM8K with SmolLM2-135M-Instruct", "grpo-bench check mu1 --task gsm8k"),
    ("results/trl_check/report.md", "GRPO, RLOO and DPO losses against TRL's own code", "grpo-bench check trl"),
    ("results/calibration/report.md", "Calibration of the verdicts: coverage and A/A false separation, simulated and "
     "measured", "grpo-bench calibration results/verdicts results/verdicts-tuned"),
    ("results/references/references.md", "Every estimator and loss against verl, OpenRLHF and TRL 1.12's PPO",
     "grpo-bench check references"),
    ("results/trl_train/report.md", "TRL's GRPOTrainer and ours, trained side by side on pizza", "grpo-bench check trl-train"),
    ("results/perf/perf.md", "One GRPO step against TRL's GRPOTrainer", "grpo-bench bench grpo-vs-trl"),
    ("results/perf/bf16/perf.md", "One GRPO step against TRL's GRPOTrainer, both sides in bf16 (TRL bf16=True)",
     "grpo-bench bench grpo-vs-trl --precision bf16"),
    ("results/perf/bf16-quiet/perf.md", "The same in bf16 on an idle host at torch's own thread count (its bandwidth and "
     "load in its header): issue 43's good host, beside the loaded, low-bandwidth run above",
     "grpo-bench bench grpo-vs-trl --precision bf16 --bf16-steps 0 --scaling-steps 0 --out results/perf/bf16-quiet"),
    ("results/perf/fp32-avx2/perf.md", "The same in fp32 on an AVX2 CPU, where bf16 is emulated and fp32 is what a user "
     "has (its bandwidth and load in its header)",
     "grpo-bench bench grpo-vs-trl --workloads chain_sum-mu1,gsm8k-mu1,chain_sum-mu2,gsm8k-mu2,chain_sum-lora-mu1,"
     "gsm8k-lora-mu1,chain_sum-lora-mu2,gsm8k-lora-mu2 --bf16-steps 0 --scaling-steps 0 --out results/perf/fp32-avx2"),
    ("results/same_batch/report.md", "The GRPO step's loss against TRL's on the same sampled batches, part by part "
     "(loss function, advantages, log-probs; transformers against itself for scale)", "grpo-bench check same-batch"),
    ("results/gpu/perf.md", "One GRPO step against TRL's GRPOTrainer on an NVIDIA H200 (SmolLM2-135M's architecture "
     "with random weights, GSM8K workloads)",
     "grpo-bench bench grpo-vs-trl --device cuda --model HuggingFaceTB/SmolLM2-135M-Instruct --random-weights"),
    ("results/perf/rloo.md", "One RLOO step against TRL's RLOOTrainer", "grpo-bench bench rloo-vs-trl"),
    ("results/perf/roof.md", "Generation (SmolLM2-135M) against the roof of the measured bandwidth and FLOP rate",
     "grpo-bench bench roof"),
    ("results/perf/revisions.md", "One step at each git revision, side by side: what each performance change bought",
     "grpo-bench bench revisions"),
    ("results/perf/revisions-lora/revisions.md", "A LoRA policy's step before and after its log-probs moved to fast_llama "
     "(the later revision's reference pass ran the adapter, a bug fixed in 5b687ac)",
     "grpo-bench bench revisions 4f591f4 33f81e5 --workloads chain_sum-lora-mu1,gsm8k-lora-mu1 --out results/perf/revisions-lora"),
    ("results/perf/revisions-packed/revisions.md", "Sampling weights prepacked for oneDNN, against the revision before",
     "grpo-bench bench revisions 5b687ac e7b6a6f --workloads chain_sum-mu1,chain_sum-lora-mu1,gsm8k-mu1 --threads 2 "
     "--out results/perf/revisions-packed"),
    ("results/perf/revisions-lora-dropout/revisions.md", "A LoRA policy's step before and after the grpo-vs-trl "
     "workloads dropped adapter dropout (TRL's side had run without it all along)",
     "grpo-bench bench revisions cd064c7 201e140 --workloads gsm8k-lora-mu2,chain_sum-lora-mu2 --rounds 5 --threads 2 "
     "--out results/perf/revisions-lora-dropout"),
    ("results/perf/revisions-logps-tail/revisions.md", "The log-prob tail (log-sum-exp, entropy and their backward) "
     "a chunk of rows at a time, against the revision before",
     "grpo-bench bench revisions 8240db0 eed3224 --workloads gsm8k-mu1 --rounds 5 --threads 2 "
     "--out results/perf/revisions-logps-tail"),
    ("results/perf/revisions-ppo-packed/revisions.md", "PPO's step at the real-LM verdict's settings before and after "
     "its minibatches and critic encode each prompt once", "grpo-bench bench revisions 7b7ca09 e96c4f4 --workloads "
     "chain_sum-ppo --rounds 4 --threads 1 --out results/perf/revisions-ppo-packed"),
    ("results/perf/revisions-dpo/revisions.md", "DPO's step at the real-LM verdict's settings before and after "
     "its pairs' prompts were packed and its reference log-probs kept per pair", "grpo-bench bench revisions 9f182c9 "
     "2eb0612 --workloads chain_sum-dpo --rounds 5 --threads 1 --out results/perf/revisions-dpo"),
    ("results/perf/revisions-attention-backward/revisions.md", "GRPO's, PPO's and DPO's bf16 step at the real-LM "
     "verdict's settings before and after attention's backward moved to fp32 on a CPU", "grpo-bench bench revisions "
     "ec863bd a000109 --workloads chain_sum-grpo,chain_sum-ppo,chain_sum-dpo --rounds 4 --threads 1 "
     "--out results/perf/revisions-attention-backward"),
    ("results/precision/gradients.md", "One step's gradient at bf16, and at bf16 with fp32 logits, against fp32's on the "
     "same batch, per algorithm (SmolLM2-135M-Instruct on chain_sum)", "grpo-bench check precision"),
    ("results/perf/precision.md", "Each algorithm's training step at fp32, bf16 and bf16 with fp32 logits, side by side",
     "grpo-bench bench precision"),
    ("results/perf/eval.md", "One held-out evaluation of the real-LM verdict's task, by how it decodes (shared prefix, "
     "finished rows dropped), side by side, with the answers compared", "grpo-bench bench eval"),
    ("results/lora/report.md", "LoRA against full fine-tuning, ours and TRL's", "grpo-bench bench lora"),
    ("results/executors-default/executors.md", "Matrix executors on the default matrix: warm workers against fresh processes",
     "grpo-bench bench executors benchmarks/matrices/default.toml --seeds 0"),
    ("results/ablation/group_size.md", "GRPO's group size on the bandit", "grpo-bench ablation"),
    ("results/reasoning-gym/ppo-epochs/agreement.md", "The number_sequence verdict's PPO and GRPO cells, repeated by "
     "rg-ppo-epochs, compared cell by cell and by their means",
     "grpo-bench agreement results/reasoning-gym/verdict-number-sequence results/reasoning-gym/ppo-epochs --out "
     "results/reasoning-gym/ppo-epochs/agreement.md"),
    ("results/reasoning-gym/ppo-cost-chain-sum/agreement.md", "The chain_sum verdict's GRPO cells, repeated on another "
     "CPU by rg-ppo-cost-chain-sum", "grpo-bench agreement results/reasoning-gym/verdict-chain-sum "
     "results/reasoning-gym/ppo-cost-chain-sum --out results/reasoning-gym/ppo-cost-chain-sum/agreement.md"),
    ("results/reasoning-gym/cost-attention-backward/agreement.md", "rg-ppo-cost-chain-sum's GRPO and PPO cells, "
     "repeated after bf16 attention's rework by rg-cost-attention-backward", "grpo-bench agreement "
     "results/reasoning-gym/ppo-cost-chain-sum results/reasoning-gym/cost-attention-backward --out "
     "results/reasoning-gym/cost-attention-backward/agreement.md"),
    ("results/ppo-ties-threads2/agreement.md", "The ppo-ties matrix run again (both runs at one thread a cell)",
     "grpo-bench agreement results/ppo-ties results/ppo-ties-threads2 --out results/ppo-ties-threads2/agreement.md"),
    ("results/reasoning-gym/survey.md", "Reasoning Gym with SmolLM2-135M-Instruct: start accuracy of candidate datasets",
     "grpo-bench survey --task reasoning_gym"),
    ("results/reasoning-gym/paired/README.md", "Reasoning Gym: GRPO before and after on 500 held-out questions (McNemar)",
     "grpo-bench paired eval, grpo-bench paired compare"),
    ("results/gsm8k/README.md", "GSM8K with SmolLM2-135M-Instruct: evaluations and paired tests", "grpo-bench eval, grpo-bench paired"),
    ("results/shape/report.md", "The code's shape before and after issue #46: import cycles, arrows that break the "
     "layering, the longest functions and largest modules", "grpo-bench check shape"),
)


def headline(report: Path) -> str:
    """A report's verdict in one line: its first bold line (every check and bench writes one), else its title."""
    lines = report.read_text().splitlines()
    bold = next((line for line in lines if line.startswith("**")), None)
    if bold:
        return bold.strip()
    title = next((line.lstrip("# ").strip() for line in lines if line.startswith("# ")), "")
    return title or "(see the report)"


_WRITTEN_BY = re.compile(r"(?:Written by|Regenerate:) `([^`]+)`")


def written_by(report: Path, default: str) -> str:
    """The command a report says wrote it (its "Written by `...`" or "Regenerate: `...`" line, the exact arguments
    of its last run), else ``default``: the index names what wrote the report as it stands, not what once did."""
    found = _WRITTEN_BY.search(report.read_text())
    return found.group(1) if found else default


def index_reports(readme: Path | str, section: str = "checks") -> list[str]:
    """Write README section ``section``: one row per written report of REPORTS, its headline and a link."""
    readme = Path(readme)
    rows, lines = [], []
    for path, what, command in REPORTS:
        report = Path(path)
        if not report.exists():
            lines.append(f"{readme}: {path} not written yet, left out of section {section}")
            continue
        link = Path(os.path.relpath(report.resolve(), readme.resolve().parent)).as_posix()
        rows.append([f"[{what}]({link})", headline(report), f"`{written_by(report, command)}`"])
    update_section(readme, section, markdown_table(["report", "headline", "written by"], rows))
    lines.append(f"{readme}: section {section} <- {len(rows)} reports")
    return lines
