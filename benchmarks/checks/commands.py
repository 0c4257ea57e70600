"""The checks of ``grpo-bench check``, each registered as a study (benchmarks/study.py): its name, its line in
``check --help``, its settings (its engine's own dataclass, whose fields are its flags) and how it runs.

The checks import TRL only when they run: it takes seconds to import and ``grpo-bench run`` never needs it."""

from __future__ import annotations

from benchmarks.checks.references import ReferencesSettings, run_references_check
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
class ReferencesCheck(Study):
    name, group = "references", "check"
    help = "every estimator and loss against verl, OpenRLHF, SkyRL, ms-swift and TRL 1.12's PPO"
    Settings = ReferencesSettings
    # Not on the shared report lifecycle (``write``): it writes three files from one run, references.md,
    # references.csv and features.md, and the README section is features.md's (the feature table), not the report's.

    def run(self, settings: ReferencesSettings, command: str) -> int:
        return run_references_check(settings, command=command)
