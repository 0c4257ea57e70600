"""The benchmarks of ``grpo-bench bench``, each registered as a study (benchmarks/study.py): its name, its line in
``bench --help``, its settings (a dataclass whose fields are its flags) and how it runs; those whose report has a README
section and --rerender (grpo-vs-trl, rloo-vs-trl) declare the report and render it, and the lifecycle
writes it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional

from benchmarks.perf.vs_trl import GrpoVsTrlSettings, PerfSettings, RlooVsTrlSettings, out_folder, run_bench
from benchmarks.perf.vs_trl_report import render_markdown
from benchmarks.perf.roof import RoofSettings, run_roof
from benchmarks.study import Study, register_study


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
class RoofBench(Study):
    name, group = "roof", "bench"
    help = "generation tokens/s against the roof of the measured bandwidth and FLOP rate"
    Settings = RoofSettings

    def run(self, settings: RoofSettings, command: str) -> int:
        run_roof(settings, command=command)
        return 0

