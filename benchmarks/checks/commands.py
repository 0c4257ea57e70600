"""The checks of ``grpo-bench check``, each registered as a study (benchmarks/study.py): its name, its line in
``check --help``, its settings (its engine's own dataclass, whose fields are its flags) and how it runs; mu1, whose
report has a README section, declares its report and renders it, and the lifecycle writes it.

The checks import TRL only when they run: it takes seconds to import and ``grpo-bench run`` never needs it."""

from __future__ import annotations

from pathlib import Path

from benchmarks.checks import mu1
from benchmarks.checks.mu1 import Mu1Settings, run_mu1_check
from benchmarks.checks.references import ReferencesSettings, run_references_check
from benchmarks.checks.same_batch import SameBatchSettings, run_same_batch_check
from benchmarks.checks.trl import TrlCheckSettings, run_trl_check
from benchmarks.study import Study, register_study


@register_study
class TrlCheck(Study):
    name, group = "trl", "check"
    help = "grpo_loss, group_advantages and dpo_loss against TRL's own trainers"
    Settings = TrlCheckSettings

    def run(self, settings: TrlCheckSettings, command: str) -> int:
        return run_trl_check(settings)


@register_study
class Mu1Check(Study):
    name, group = "mu1", "check"
    help = "why the GRPO loss reads 0 at mu = 1 while the policy still learns"
    Settings = Mu1Settings
    report_file = "report.md"  # its title names the task

    def run(self, settings: Mu1Settings, command: str) -> int:
        return run_mu1_check(settings, command, lambda result: self.write(result, settings, command))

    def folder(self, settings: Mu1Settings) -> Path:
        return mu1.out_folder(settings)

    def readme_section(self, settings: Mu1Settings) -> tuple[str, str]:
        return mu1.readme_section(settings)

    def render(self, result: dict, settings: Mu1Settings, command: str) -> str:
        return mu1.report(result, self.folder(settings))

    def render_section(self, result: dict, settings: Mu1Settings, command: str, body: str) -> str:
        """On pizza the plain-words explanation; on another task its verdict table."""
        return (mu1.explanation if settings.task == "pizza" else mu1.task_section)(result, self.folder(settings))



@register_study
class SameBatchCheck(Study):
    name, group = "same-batch", "check"
    help = "the GRPO step's loss against TRL's on the same sampled batches, part by part"
    Settings = SameBatchSettings

    def run(self, settings: SameBatchSettings, command: str) -> int:
        run_same_batch_check(settings, command=command)
        return 0



@register_study
class ReferencesCheck(Study):
    name, group = "references", "check"
    help = "every estimator and loss against verl, OpenRLHF, SkyRL, ms-swift and TRL 1.12's PPO"
    Settings = ReferencesSettings
    # Not on the shared report lifecycle (``write``): it writes three files from one run, references.md,
    # references.csv and features.md, and the README section is features.md's (the feature table), not the report's.

    def run(self, settings: ReferencesSettings, command: str) -> int:
        return run_references_check(settings, command=command)
