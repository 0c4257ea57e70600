"""``grpo-bench check references``: every advantage estimator, policy loss, aggregation, KL estimator, sampler
correction and PPO piece of this suite against every reference framework that implements it -- verl 0.9.1, OpenRLHF
0.11.2, TRL 1.12.0's PPO, SkyRL 0.4.0 and ms-swift 4.6.0 (benchmarks/references/) -- on the same float64 tensors.

One view of the reference checks' engine (benchmarks/checks/engine.py): it runs the configurations of the case
modules registered for it (benchmarks/checks/cases/: verl, openrlhf, trl_ppo, skyrl, swift) on random and edge-case
batches
(``cases.tensors``), then every planted error (``cases.plants``), and writes references.md (per function, the
differences by design, the planted errors), references.csv (every row) and features.md (the feature table, its
columns the registered adapters', benchmarks/references/features.py).

Where a framework computes something else by design (another aggregation over all-masked rows, another epsilon, a
clamp, another variance), the row says "differs by design" with the reason, and a row beside it shows that ours with
the matching knob agrees. A planted error -- our function perturbed in place for the duration of one re-run -- must
make at least one agreeing row fail; the report lists which planted errors were caught.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

import torch

from benchmarks.checks import cases as _cases  # noqa: F401  registers the case modules
from benchmarks.checks.cases.tensors import CASES, SEEDS, TOL
from benchmarks.checks.engine import (AGREES, BY_DESIGN, CASE_MODULES, FAILS, SKIPPED, Column, Config, Plant,
                                      PlantResult, Row, case_modules, csv_text, run_configs, run_plant, short)
from benchmarks.errors import UsageError
from benchmarks.io import atomic_write_text
from benchmarks.markdown import markdown_table, write_report
from benchmarks.references import features, install
from benchmarks.study import StudySettings, option

FRAMEWORKS = tuple(case_modules("references"))
PLANTS: tuple[Plant, ...] = tuple(dict.fromkeys(p for cls in case_modules("references").values() for p in cls.plants))
# references.csv: every row, diffs to 4 significant digits.
CSV_COLUMNS = [Column(name, lambda r, n=name: str(getattr(r, n)))
               for name in ("framework", "group", "function", "theirs", "knobs", "case", "seed", "expected")]
CSV_COLUMNS += [Column(name, lambda r, n=name: "" if getattr(r, n) is None else f"{getattr(r, n):.3e}")
                for name in ("value_diff", "grad_diff", "scale")]
CSV_COLUMNS += [Column(name, lambda r, n=name: getattr(r, n)) for name in ("status", "reason", "error")]


def all_configs(frameworks: Iterable[str] = FRAMEWORKS, cases: Iterable[str] = tuple(CASES)) -> list[Config]:
    cases = list(cases)
    return [c for fw in frameworks for c in CASE_MODULES[fw]().configs(cases)]


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def group_table(rows: list[Row]) -> str:
    keyed: dict[tuple, list[Row]] = {}
    for r in rows:
        keyed.setdefault((r.framework, r.group, r.function, r.theirs), []).append(r)
    table = []
    for (fw, group, fn, theirs), rs in keyed.items():
        agreeing = [r for r in rs if r.expected == "agree"]
        design = [r for r in rs if r.expected != "agree"]
        status = (FAILS if any(r.status == FAILS for r in rs)
                  else BY_DESIGN if any(r.status == BY_DESIGN for r in rs) else AGREES)
        table.append([fw, group, fn, theirs, len(rs), len({r.knobs for r in rs}), len({r.case for r in rs}),
                      short(max((r.value_diff for r in agreeing), default=None)),
                      short(max((r.grad_diff for r in agreeing if r.grad_diff is not None), default=None)),
                      len([r for r in design if r.status == BY_DESIGN]), status])
    return markdown_table(["framework", "group", "ours", "theirs", "configs", "knob sets", "cases",
                           "max value diff (agreeing rows)", "max grad diff", "differs-by-design rows", "status"], table)


def design_table(rows: list[Row]) -> str:
    keyed: dict[tuple, list[Row]] = {}
    for r in rows:
        if r.expected != "agree":
            keyed.setdefault((r.framework, r.function, r.theirs, r.reason), []).append(r)
    table = [[fw, fn, theirs, ", ".join(sorted({r.case for r in rs if r.status == BY_DESIGN})) or "(none here)",
              short(max(r.value_diff for r in rs)), reason] for (fw, fn, theirs, reason), rs in keyed.items()]
    return markdown_table(["framework", "ours", "theirs", "cases where it shows", "max value diff", "why"], table)


def plants_table(plants: list[PlantResult]) -> str:
    return markdown_table(["planted error", "what", "rows re-run", "rows failing", "caught", "e.g."],
                          [[p.name, p.what, p.rows, p.failed, p.verdict, p.example] for p in plants])


def failing_table(failing: list[Row]) -> str:
    return markdown_table(
        ["framework", "ours", "theirs", "knobs", "case", "value diff", "grad diff", "error"],
        [[r.framework, r.function, r.theirs, r.knobs, r.case, short(r.value_diff), short(r.grad_diff), r.error]
         for r in failing[:60]])


def _headline(rows: list[Row], plants: list[PlantResult]) -> str:
    failing = [r for r in rows if r.status == FAILS]
    agreeing = [r for r in rows if r.status == AGREES]
    verdict = "every compared function agrees" if not failing else f"{len(failing)} configuration(s) FAIL"
    worst_value = max((r.value_diff for r in agreeing), default=0.0)
    worst_grad = max((r.grad_diff for r in agreeing if r.grad_diff is not None), default=0.0)
    skipped = [r for r in rows if r.status == SKIPPED]
    return (f"**{len(rows)} configurations: {verdict} (over the {len(agreeing)} agreeing rows max value diff "
            f"{short(worst_value)}, max gradient diff {short(worst_grad)}, tolerance {TOL:g} x max(1, |theirs|)); "
            f"{len([r for r in rows if r.status == BY_DESIGN])} rows differ by design; "
            + (f"{len(skipped)} skipped (a member this suite lacks); " if skipped else "") +
            f"{len([p for p in plants if p.caught])}/{len([p for p in plants if p.rows])} planted errors caught.**")


def _setup_lines(rows: list[Row], seconds: float, command: str) -> list[str]:
    per_fw = {fw: len([r for r in rows if r.framework == fw]) for fw in dict.fromkeys(r.framework for r in rows)}
    return [
        "Versions: " + ", ".join(f"{install.PINNED[fw].label}" for fw in per_fw) + f"; torch {torch.__version__}. "
        f"Written by `{command}` in {seconds:.0f} s; every row is in [references.csv](references.csv).", "",
        "Configurations per framework: " + ", ".join(f"{fw} {n}" for fw, n in per_fw.items()) + ". Cases: "
        + ", ".join(f"{case} (B={b}, T={t}, G={g}{', seeds ' + str(len(SEEDS[case])) if case in SEEDS else ''})"
                    for case, (b, t, g, _) in CASES.items()) + ".", "",
        "Tensors are float64. A value diff is the largest absolute difference of the loss (of the advantages on active "
        "tokens for an estimator), a gradient diff that of the gradient with respect to the log-probs (the values, for "
        "a value loss). OpenRLHF computes its KL and its whitening statistics in float32, hence its differences of up to "
        "~1e-6; verl and OpenRLHF divide a sequence's sum by |o_i| + 1e-8, hence their ~1e-9; SkyRL exponentiates "
        "its ratios in float32 (safe_exp_delta), hence its ~1e-8.", "",
        "How each framework runs: verl, OpenRLHF and SkyRL are imported from their cache folders with their engines "
        "stood in; SkyRL 0.4.0 declares Python >= 3.12, but the two modules compared (ppo_utils, "
        "off_policy_correction_utils) import and run under this Python; ms-swift's GRPO trainer is not imported (it "
        "pulls vLLM and ModelScope in): its loss methods are compiled from its file and bound to a stand-in trainer "
        "whose forward returns our log-probs; TRL 1.12's PPO is read from its file likewise. The sampler corrections "
        "compare pi_old (the batch's old log-probs) against a sampler's log-probs a tenth of the case's spread away. "
        "A row whose member this suite does not have is skipped, not compared (the count below).",
    ]


def report(rows: list[Row], plants: list[PlantResult], seconds: float, command: str) -> str:
    failing = [r for r in rows if r.status == FAILS]
    lines = [
        "# Reference check: estimators, losses and sampler corrections against verl, OpenRLHF, TRL 1.12's PPO, SkyRL "
        "and ms-swift", "",
        _headline(rows, plants), "", *_setup_lines(rows, seconds, command),
        "", "## Per function", "", group_table(rows), "",
        "## Where the frameworks differ by design", "",
        "Each row below is paired with a row of ours with the matching knob that agrees (the table above).", "",
        design_table(rows), "",
        "## Planted errors", "",
        "Each planted error replaces one of our functions for a re-run of the agreeing rows it touches "
        "(`grpo-bench check references --plant NAME` runs one and exits 1 when it is caught).", "",
        plants_table(plants),
    ]
    if failing:
        lines += ["", "## Failing rows", "", failing_table(failing)]
    return "\n".join(lines) + "\n"


def rows_csv(rows: list[Row]) -> str:
    return csv_text(CSV_COLUMNS, rows)


# --------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------


@dataclass
class ReferencesSettings(StudySettings):
    install: bool = field(default=False, metadata={
        "help": "first fetch the pinned frameworks (pip install --no-deps --target into $GRPO_BENCH_REFERENCES, "
                "default ~/.cache/grpo-bench/references)"})
    out: str = option("out", "results/references")  # references.md, references.csv, features.md
    frameworks: tuple[str, ...] = field(default=FRAMEWORKS, metadata={
        "help": "frameworks to compare against", "metavar": "NAME"})
    cases: tuple[str, ...] = field(default=tuple(CASES), metadata={"help": "batches", "metavar": "CASE"})
    plant: Optional[str] = field(default=None, metadata={
        "help": "run one planted error and write nothing; exit 1 when it is caught "
                f"({', '.join(p.name for p in PLANTS)}) (default: none)", "metavar": "NAME"})
    plants: bool = field(default=True, metadata={"help": "run every planted error after the check"})
    # the README's feature table (section "features")
    readme: Optional[str] = option("readme", shown="none")


def validate(settings: ReferencesSettings) -> None:
    known = tuple(case_modules("references"))
    unknown = [f for f in settings.frameworks if f not in known]
    if unknown:
        raise UsageError(f"--frameworks: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    unknown = [c for c in settings.cases if c not in CASES]
    if unknown:
        raise UsageError(f"--cases: unknown {', '.join(unknown)}; choose from {', '.join(CASES)}")
    if settings.plant is not None and settings.plant not in {p.name for p in PLANTS}:
        raise UsageError(f"--plant: unknown {settings.plant!r}; choose from {', '.join(p.name for p in PLANTS)}")


def prepare(settings: ReferencesSettings, log=print) -> None:
    """Fetch the frameworks (``--install``) or fail with one line naming ``--install``."""
    for fw in settings.frameworks:
        CASE_MODULES[fw]().prepare(settings.install, log)


def run_one_plant(name: str, configs: list[Config], log=print) -> int:
    """``--plant NAME``: 1 when the planted error is caught (some agreeing row fails under it)."""
    (plant,) = [p for p in PLANTS if p.name == name]
    result = run_plant(plant, configs, run_configs(configs))
    log(f"planted error {plant.name}: {result.failed}/{result.rows} agreeing rows fail"
        + (f" (e.g. {result.example})" if result.example else "") + (": caught" if result.caught else ": NOT caught"))
    return 1 if result.caught else 0


def _summary(rows: list[Row], plants: list[PlantResult], seconds: float, out: Path, log=print) -> None:
    failing = [r for r in rows if r.status == FAILS]
    missed = [p.name for p in plants if p.missed]
    log(f"{len(rows)} configurations, {len(failing)} failing, {len([r for r in rows if r.status == BY_DESIGN])} differ "
        f"by design; planted errors caught {len([p for p in plants if p.caught])}/{len([p for p in plants if p.rows])}"
        + (f" (missed: {', '.join(missed)})" if missed else "")
        + f"; {seconds:.0f} s -> {out}/references.md, references.csv, features.md")
    for r in failing[:10]:
        log(f"  FAILS {r.framework} {r.function} vs {r.theirs} [{r.knobs}] {r.case}/{r.seed}: value "
            f"{short(r.value_diff)} grad {short(r.grad_diff)} {r.error}")


def run_references_check(settings: ReferencesSettings, command: str = "grpo-bench check references", log=print) -> int:
    validate(settings)
    prepare(settings, log)
    start = time.perf_counter()
    configs = all_configs(settings.frameworks, settings.cases)
    if settings.plant is not None:
        return run_one_plant(settings.plant, configs, log)
    rows = run_configs(configs)
    plants = [run_plant(p, configs, rows) for p in PLANTS] if settings.plants else []
    seconds = time.perf_counter() - start
    out = Path(settings.out)
    atomic_write_text(out / "references.md", report(rows, plants, seconds, command))
    atomic_write_text(out / "references.csv", rows_csv(rows))
    write_report(out / "features.md", features.feature_report(rows), readme=settings.readme, section="features",
                 section_body=features.feature_summary(rows))
    _summary(rows, plants, seconds, out, log)
    return 1 if any(r.status == FAILS for r in rows) or any(p.missed for p in plants) else 0
