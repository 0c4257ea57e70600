"""The benchmarks of ``grpo-bench bench``, each registered as a study (benchmarks/study.py): its name, its line in
``bench --help``, its settings (a dataclass whose fields are its flags) and how it runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.errors import UsageError
from benchmarks.perf import lora
from benchmarks.perf.executors import ExecutorsSettings, rerender_executors, run_bench_executors
from benchmarks.perf.grpo_vs_trl import GrpoVsTrlSettings, PerfSettings, RlooVsTrlSettings, rerender, run_bench
from benchmarks.perf.precision import PrecisionBenchSettings, run_precision_bench
from benchmarks.perf.revisions import RevisionSettings, run_revisions
from benchmarks.perf.roof import RoofSettings, run_roof
from benchmarks.study import Study, StudySettings, option, register_study


class VsTrl(Study):
    """A step of ours timed against TRL's trainer; its report is written again from its json with --rerender."""

    def run(self, settings: PerfSettings, command: str) -> int:
        run_bench(settings, command=command)
        return 0

    def rerender(self, settings: PerfSettings, command: str) -> int:
        rerender(settings)
        return 0


@register_study
class GrpoVsTrl(VsTrl):
    name, group = "grpo-vs-trl", "bench"
    help = "time one GRPO step of this suite against TRL's GRPOTrainer"
    Settings = GrpoVsTrlSettings


@register_study
class RlooVsTrl(VsTrl):
    name, group = "rloo-vs-trl", "bench"
    help = "time one RLOO step of this suite against TRL's RLOOTrainer"
    Settings = RlooVsTrlSettings


@register_study
class ExecutorsBench(Study):
    name, group = "executors", "bench"
    help = ("a matrix in fresh processes one at a time and N at once, then in N warm workers: the warm start and the "
            "parallelism, each on its own")
    Settings = ExecutorsSettings

    def run(self, settings: ExecutorsSettings, command: str) -> int:
        return self.status(run_bench_executors(settings))

    def rerender(self, settings: ExecutorsSettings, command: str) -> int:
        return self.status(rerender_executors(settings))

    @staticmethod
    def status(result: dict) -> int:
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
