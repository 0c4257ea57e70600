"""The benchmarks of ``grpo-bench bench``, each registered as a study (benchmarks/study.py): its name, its line in
``bench --help``, its settings (a dataclass whose fields are its flags) and how it runs; those whose report has a README
section and --rerender (grpo-vs-trl, rloo-vs-trl, executors) declare the report and render it, and the lifecycle
writes it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

from benchmarks.errors import UsageError
from benchmarks.perf import executors, lora
from benchmarks.perf.executors import ExecutorsSettings
from benchmarks.perf.grpo_vs_trl import GrpoVsTrlSettings, PerfSettings, RlooVsTrlSettings, out_folder, run_bench
from benchmarks.perf.grpo_vs_trl_report import render_markdown
from benchmarks.perf.evaluation import EvalBenchSettings, run_eval_bench
from benchmarks.perf.precision import PrecisionBenchSettings, run_precision_bench
from benchmarks.perf.revisions import RevisionSettings, run_revisions
from benchmarks.perf.roof import RoofSettings, run_roof
from benchmarks.study import Study, StudySettings, option, register_study


class VsTrl(Study):
    """A step of ours timed against TRL's trainer: OUT/STEM.json, written as each workload is measured, and the report
    rendered from it (again with --rerender). OUT defaults by the device."""

    def run(self, settings: PerfSettings, command: str) -> int:
        run_bench(settings, command, self.folder(settings) / self.source_file,
                  lambda report, readme: self.write(report, settings, command, readme=readme))
        return 0

    def folder(self, settings: PerfSettings) -> Path:
        return out_folder(settings)

    def render(self, report: dict, settings: PerfSettings, command: str) -> str:
        return render_markdown(report) + "\n"  # the command the report quotes is the json's

    def readme_section(self, settings: PerfSettings) -> tuple[Optional[str], str]:
        """The README section, at a precision other than fp32 its own (perf-bf16), beside the fp32 one. Unless
        --readme names a page, results/checks.md's section is written only by a report in the default folder: the
        section shows that report, and a run elsewhere (another host's, say) would replace it with its own."""
        page, section = super().readme_section(settings)
        if page is None:
            default = out_folder(replace(settings, out=None))
            page = "results/checks.md" if Path(settings.out or default) == default else ""
        return page, section if settings.precision == "fp32" else f"{section}-{settings.precision}"


@register_study
class GrpoVsTrl(VsTrl):
    name, group = "grpo-vs-trl", "bench"
    help = "time one GRPO step of this suite against TRL's GRPOTrainer"
    Settings = GrpoVsTrlSettings
    report_file, source_file, title, section = "perf.md", "perf.json", "GRPO step: this suite vs TRL", "perf"


@register_study
class RlooVsTrl(VsTrl):
    name, group = "rloo-vs-trl", "bench"
    help = "time one RLOO step of this suite against TRL's RLOOTrainer"
    Settings = RlooVsTrlSettings
    report_file, source_file, title, section = "rloo.md", "rloo.json", "RLOO step: this suite vs TRL", "perf-rloo"


@register_study
class ExecutorsBench(Study):
    name, group = "executors", "bench"
    help = ("a matrix in fresh processes one at a time and N at once, then in N warm workers: the warm start and the "
            "parallelism, each on its own")
    Settings = ExecutorsSettings
    report_file, source_file = "executors.md", "executors.json"
    title = "Executors: warm workers against fresh processes, at equal parallelism"

    def run(self, s: ExecutorsSettings, command: str) -> int:
        result = executors.compare_executors(s.file, Path(s.out) / "runs", jobs=s.jobs, arms=s.arms, seeds=s.seeds)
        self.write(result, s, command)
        return self.status(result)

    def stored(self, path: Path) -> dict:
        return executors.stored_comparison(path)

    def write(self, result: dict, settings: ExecutorsSettings, command: str, *, readme: bool = True) -> str:
        """Each arm's accuracy is read from its runs and kept in the json first (a --rerender reads them again:
        --spread-from may be new); the report is printed too."""
        executors.judge_accuracy(result, settings, self.folder(settings) / self.source_file)
        body = super().write(result, settings, command, readme=readme)
        print(body)
        return body

    def render(self, result: dict, settings: ExecutorsSettings, command: str) -> str:
        return executors.render(result, executors.report_command(result, settings))  # the command with the paths as typed

    def render_section(self, result: dict, settings: ExecutorsSettings, command: str, body: str) -> str:
        return f"### {self.title}\n\n{body}"

    def status(self, result: dict) -> int:
        return 0 if all(r["counts"]["failed"] == 0 for r in result["runs"].values()) else 1


# Here rather than in benchmarks/perf/lora.py: that module is each side's probe process too, which imports
# no library its side does not use (its peak memory is the measurement).
@dataclass
class LoraBenchSettings(StudySettings):
    """What ``grpo-bench bench lora`` asks for: the knobs of ``lora.Settings`` worth turning, the sides, the folder."""

    steps: int = field(default=lora.Settings.steps, metadata={"help": "GRPO steps per side"})
    group_size: int = field(default=lora.Settings.group_size, metadata={"help": "G"})
    max_new_tokens: int = field(default=lora.Settings.max_new_tokens, metadata={"help": "completion cap"})
    lora_r: int = field(default=lora.Settings.lora_r, metadata={
        "help": f"LoRA rank (default: {lora.Settings.lora_r}, TRL's)"})
    sides: list[str] = field(default_factory=lambda: list(lora.SIDES), metadata={
        "help": f"comma-separated, from: {', '.join(lora.SIDES)}", "comma_separated": True})
    device: str = option("device")
    out: str = option("out", "results/lora")  # report.md and results.json


@register_study
class LoraBench(Study):
    name, group = "lora", "bench"
    help = "GRPO on GSM8K with and without LoRA, ours and TRL's: bytes and peak memory"
    Settings = LoraBenchSettings

    def run(self, s: LoraBenchSettings, command: str) -> int:
        unknown = [side for side in s.sides if side not in lora.SIDES]
        if unknown or not s.sides:
            raise UsageError(f"--sides: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(lora.SIDES)}")
        if s.steps < 1 or s.group_size < 2 or s.max_new_tokens < 1 or s.lora_r < 1:
            raise UsageError("--steps >= 1, --group-size >= 2, --max-new-tokens >= 1 and --lora-r >= 1, please")
        settings = lora.Settings(steps=s.steps, group_size=s.group_size, max_new_tokens=s.max_new_tokens,
                                 lora_r=s.lora_r, device=s.device)
        report = lora.run_bench(settings, Path(s.out), s.sides)
        print((Path(s.out) / "report.md").read_text())
        return 0 if report["sides"] else 1


@register_study
class RoofBench(Study):
    name, group = "roof", "bench"
    help = "generation tokens/s against the roof of the measured bandwidth and FLOP rate"
    Settings = RoofSettings

    def run(self, settings: RoofSettings, command: str) -> int:
        run_roof(settings, command=command)
        return 0


@register_study
class RevisionsBench(Study):
    name, group = "revisions", "bench"
    help = "one GRPO step at several git revisions, side by side: what each change bought"
    Settings = RevisionSettings

    def run(self, settings: RevisionSettings, command: str) -> int:
        run_revisions(settings, command=command)
        return 0


@register_study
class PrecisionBench(Study):
    name, group = "precision", "bench"
    help = "each algorithm's training step at fp32, bf16 and bf16 with fp32 logits, per phase, side by side"
    Settings = PrecisionBenchSettings

    def run(self, settings: PrecisionBenchSettings, command: str) -> int:
        run_precision_bench(settings, command=command)
        return 0


@register_study
class EvalBench(Study):
    name, group = "eval", "bench"
    help = "one held-out evaluation of a matrix's task with each way of decoding it, side by side: core-seconds and answers"
    Settings = EvalBenchSettings

    def run(self, settings: EvalBenchSettings, command: str) -> int:
        run_eval_bench(settings, command=command)
        return 0
