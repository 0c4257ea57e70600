"""The studies that are top-level commands (``grpo-bench NAME``: agreement, brief, claims, variance, calibration,
readme), each registered as a study (benchmarks/study.py): its settings, whose fields are its flags, and its run.
Those that write a report (agreement, brief, claims, variance, calibration) declare it and render it, and the lifecycle
writes it with its README section; the report's modules compute what it shows and render it, and write nothing.

Light at import, so that each command's ``--help`` starts in about 0.1 s: a run imports its engine where it runs, each
such import marked "heavy" (the report's modules: pandas and scipy; the harness: torch), and the
run-file modules ``benchmarks.io`` and ``benchmarks.markdown`` are marked "start-up" (their hashlib and random would
add about 10 ms to that 0.1 s). The paths a study reads and writes are checked before any work by the lifecycle
(``Study.start``), from its fields' metadata: ``matrix`` (a matrix folder) and ``writes``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from benchmarks.errors import UsageError
from benchmarks.study import TOP, Study, StudySettings, matrix_directory, option, register_study


def _wrote(settings) -> str:
    """What a report study wrote: its --out and, with --readme, the section."""
    readme = getattr(settings, "readme", "")
    return f"wrote {settings.out}" + (f" and the {settings.section} section of {readme}" if readme else "")


# ------------------------------------------------------------------------------------------------
# Studies over matrix directories
# ------------------------------------------------------------------------------------------------


@dataclass
class AgreementSettings(StudySettings):
    first: str = field(metadata={"help": "a matrix directory (the committed run)", "matrix": "FIRST"})
    second: str = field(metadata={"help": "the rerun's directory (the same matrix file; or another matrix that repeats some of its cells, compared cell by cell)", "matrix": "SECOND"})
    out: str = option("out", required=True, file="the markdown report to write")


def planned_cells(directory: Path, *, tuning: bool = False) -> tuple[str, list[dict]]:
    """The matrix's name and its planned cells, from DIR/matrix.json (one UsageError line when unreadable); with
    ``tuning``, the tuning cells it records too (its ``tuning``)."""
    from benchmarks.io import read_json  # start-up: hashlib, random (module docstring)

    meta = read_json(directory / "matrix.json")
    if not isinstance(meta, dict) or not isinstance(meta.get("cells"), list):
        raise UsageError(f"{directory / 'matrix.json'}: not a matrix plan (unreadable, or without its cells)")
    cells = list(meta["cells"])
    stage = meta.get("tuning")
    if tuning and isinstance(stage, dict) and isinstance(stage.get("cells"), list):
        cells += stage["cells"]
    return str(meta.get("name", directory.name)), [c for c in cells if isinstance(c, dict)]


def shared_variants(first, second) -> tuple[tuple[str, str], set[tuple[str, str]]]:
    """The two matrix directories' matrix names and the (task, variant) pairs both plan; none is one UsageError line
    naming each side's (``agreement`` compares a rerun of the same matrix, and two different ones had read "0 of 0
    agree")."""
    sides = []
    for label, directory in (("FIRST", first), ("SECOND", second)):
        name, cells = planned_cells(matrix_directory(directory, label))
        sides.append((name, {(str(c.get("task_label")), str(c.get("variant"))) for c in cells}))
    shared = sides[0][1] & sides[1][1]
    if not shared:
        def listed(pairs):
            return ", ".join(f"{task} {variant}" for task, variant in sorted(pairs)[:4]) + (", ..." if len(pairs) > 4 else "")

        raise UsageError(f"{first} (matrix {sides[0][0]}) and {second} (matrix {sides[1][0]}) share no variant of a "
                         f"task: {listed(sides[0][1]) or 'no cells'} against {listed(sides[1][1]) or 'no cells'}; "
                         "agreement compares a rerun of the same matrix")
    return (sides[0][0], sides[1][0]), shared


@register_study
class Agreement(Study):
    name, group = "agreement", TOP
    help = "does a rerun of a matrix (another machine or thread count) reach the same verdicts?"
    Settings = AgreementSettings

    def run(self, s: AgreementSettings, command: str) -> int:
        names, _ = shared_variants(s.first, s.second)  # the inputs first: a typo is one line before pandas loads
        from benchmarks.report.agreement import agreement, shared_cells  # heavy: pandas, scipy

        text = self.write((agreement(s.first, s.second), shared_cells(s.first, s.second), names), s, command)
        print(text.splitlines()[2] if len(text.splitlines()) > 2 else text)
        print(_wrote(s))
        return 0

    def render(self, result, s: AgreementSettings, command: str) -> str:
        from benchmarks.report.agreement import render  # heavy: pandas, scipy

        table, cells, names = result
        text = render(table, str(s.first), str(s.second), cells, names)  # its title names the two folders
        return text + f"\nRegenerate: `{command}`\n"


def variant_pairs(given) -> list[tuple[str, str]]:
    """``--pair TOY REAL`` as given, each name stripped; a variant named twice on one side is one UsageError line."""
    pairs = [(toy.strip(), real.strip()) for toy, real in given]
    if len({real for _, real in pairs}) < len(pairs) or len({toy for toy, _ in pairs}) < len(pairs):
        raise UsageError("--pair: each variant at most once on each side")
    return pairs


def algorithm_settings() -> dict[str, list[str]]:
    """Each registered algorithm's setting names (its config's fields, option groups flattened): what ``brief``
    compares two matrices' cells on; the report reads run data only and cannot import the registry itself."""
    from algorithms import ALGORITHMS  # heavy: torch
    from algorithms.base import config_fields

    return {name: list(config_fields(cls.Config)) for name, cls in ALGORITHMS.items()}


@dataclass
class BriefSettings(StudySettings):
    dirs: list[str] = field(metadata={"help": "the verdict matrices' directories, one skill (task) each", "matrix": ""})
    toy: Optional[str] = field(default=None, kw_only=True, metadata={
        "help": "a toy matrix whose ranking is compared with each skill's (with --pair)", "matrix": "--toy"})
    pair: list[tuple[str, str]] = field(default_factory=list, kw_only=True, metadata={
        "help": "with --toy: an algorithm both ran, by its variant name in the toy matrix and in the skills' (repeat)",
        "repeat": True, "nargs": 2, "metavar": ("TOY_VARIANT", "REAL_VARIANT")})
    out: str = option("out", required=True, file="the markdown page to write (and beside it the figure, as .png)")
    readme: str = option("readme", "", shown="none")
    section: str = option("section", "brief")
    front: str = field(default="", kw_only=True, metadata={
        "help": "a front page (README) whose front-answer section gets a table per skill and the figure ('': none)",
        "writes": "file"})


FRONT_SECTION = "front-answer"  # the front page's section that ``grpo-bench brief --front`` writes


@register_study
class Brief(Study):
    name, group = "brief", TOP
    help = ("which algorithm on a real LM, across verdict matrices of one skill each: the front page's section "
            "(could-be-best set, P(best), MDD, tuned settings, costs; rankings across skills and against a toy)")
    Settings = BriefSettings
    title = "Which algorithm on a real LM: the verdicts across skills"

    def check(self, s: BriefSettings) -> None:
        if not s.dirs:
            raise UsageError("brief: give at least one verdict matrix directory")
        if len(set(map(str, s.dirs))) < len(s.dirs):
            raise UsageError("brief: a directory is given twice")
        if s.pair and s.toy is None:
            raise UsageError("--pair needs --toy (the toy matrix the pairs name)")
        if s.toy is not None and not s.pair:
            raise UsageError("--toy needs --pair TOY_VARIANT REAL_VARIANT, one per algorithm")
        variant_pairs(s.pair)

    def run(self, s: BriefSettings, command: str) -> int:
        from benchmarks.markdown import write_section  # start-up: hashlib, random (module docstring)
        from benchmarks.report.brief import brief, figure, front  # heavy: pandas, scipy

        result = brief(s.dirs, algorithm_settings(), toy=s.toy, pairs=variant_pairs(s.pair))
        figure(result, self.figure_path(s))
        text = self.write(result, s, command)
        if s.front:
            write_section(s.front, FRONT_SECTION, front(result, Path(s.front).parent, figure_path=self.figure_path(s),
                                                        page=s.out))
        print(text.splitlines()[0])
        print(_wrote(s) + f", {self.figure_path(s)}" + (f" and the {FRONT_SECTION} section of {s.front}" if s.front else ""))
        return 0

    @staticmethod
    def figure_path(s: BriefSettings) -> Path:
        """The figure beside the page: --out with .png for its suffix."""
        return Path(s.out).with_suffix(".png")

    def render(self, result: dict, s: BriefSettings, command: str) -> str:
        from benchmarks.report.brief import render  # heavy: pandas, scipy

        return (render(result, link_from=Path(s.out).parent, figure_path=self.figure_path(s))
                + f"\nRegenerate: `{command}`\n")

    def render_section(self, result: dict, s: BriefSettings, command: str, body: str) -> str:
        """The same page, its links made from the README's folder."""
        from benchmarks.report.brief import render  # heavy: pandas, scipy

        return (render(result, link_from=Path(s.readme).parent, figure_path=self.figure_path(s))
                + f"\nWritten by `{command}`.\n")


@dataclass
class ClaimsSettings(StudySettings):
    dirs: list[str] = field(metadata={"help": "matrix directories whose matrix files state [[analysis.claims]], or "
                                              "reading files (.toml) stating [[cost_claims]] about stored matrices",
                                      "matrix": "", "or_file": ".toml"})
    out: str = option("out", "results/claims.md", file="the markdown report to write")
    readme: str = option("readme", "", shown="none")
    section: str = option("section", "claims")


@register_study
class Claims(Study):
    name, group = "claims", TOP
    help = ("published claims about RL for LLMs, each tested by a matrix that stated it before its cells ran: the "
            "table of marks")
    Settings = ClaimsSettings
    title = "What the field claims, tested here"

    def run(self, s: ClaimsSettings, command: str) -> int:
        from benchmarks.report.claims import claims_table  # heavy: pandas, scipy

        self.write(claims_table(s.dirs), s, command)
        print(_wrote(s))
        return 0

    def render(self, table, s: ClaimsSettings, command: str) -> str:
        from benchmarks.report.claims import render  # heavy: pandas, scipy

        return render(table, link_from=Path(s.out).parent, command=command)

    def render_section(self, table, s: ClaimsSettings, command: str, body: str) -> str:
        """The same table, its links to the matrices made from the README's folder."""
        from benchmarks.report.claims import render  # heavy: pandas, scipy

        return render(table, link_from=Path(s.readme).parent, command=command)


@dataclass
class VarianceSettings(StudySettings):
    dirs: list[str] = field(metadata={"help": "matrix directories whose cells kept per-question evaluation records",
                                      "matrix": ""})
    out: str = option("out", required=True, file="the markdown report to write (a .json beside it)")
    readme: str = option("readme", "", shown="none")
    section: str = option("section", "variance")
    target_mdd: float = field(default=0.05, metadata={"help": "the MDD the designs are planned for"})
    variants: int = field(default=8, metadata={"help": "variants in the planned matrix"})
    questions: list[int] = field(default_factory=lambda: [200, 500, 1000], metadata={
        "help": "held-out question counts to project to"})
    metrics: list[str] = field(default_factory=lambda: ["final", "last_2", "last_3", "auc"], metadata={
        "help": "primary metrics to split"})


@register_study
class Variance(Study):
    name, group = "variance", TOP
    help = ("where a primary metric's seed-to-seed spread comes from (policy vs evaluation), and the design that "
            "reaches a target MDD in the fewest core-seconds")
    Settings = VarianceSettings
    title = "Where the spread of a primary metric comes from"

    def check(self, s: VarianceSettings) -> None:
        from benchmarks.curve import parse_primary  # heavy: numpy

        if not 0 < s.target_mdd < 1:
            raise UsageError(f"--target-mdd must be in (0, 1), got {s.target_mdd:g}")
        if s.variants < 2 or min(s.questions) < 2:
            raise UsageError("--variants and every --questions must be at least 2")
        for name in s.metrics:
            try:
                parse_primary(name)
            except ValueError as exc:
                raise UsageError(f"--metrics: {exc}") from None

    def run(self, s: VarianceSettings, command: str) -> int:
        from benchmarks.io import atomic_write_json  # start-up: hashlib, random (module docstring)
        from benchmarks.report.variance import analyse, records  # heavy: pandas, scipy

        results = [analyse(d, metrics=s.metrics, questions=s.questions, target=s.target_mdd, variants=s.variants)
                   for d in s.dirs]
        text = self.write(results, s, command)
        atomic_write_json(Path(s.out).with_suffix(".json"), records(results))
        print(text.splitlines()[0].strip("*"))
        print(_wrote(s))
        return 0

    def render(self, results: list, s: VarianceSettings, command: str) -> str:
        from benchmarks.report.variance import render  # heavy: pandas, scipy

        return "\n".join(render(r, command) for r in results)  # one part per matrix


@dataclass
class CalibrationSettings(StudySettings):
    dirs: list[str] = field(metadata={
        "help": "matrix directories: their designs are simulated, their declared pairs judged", "matrix": ""})
    aa: list[str] = field(default_factory=list, metadata={
        "help": "A/A matrix directories (each one variant on many seeds, e.g. benchmarks/matrices/calibration_aa.toml): "
                "each one's cells cut into null matrices; the claims are judged on the first's (default: none)",
        "matrix": ""})
    out: str = option("out", "results/calibration")  # report.md and calibration.json
    sims: int = field(default=2000, metadata={"help": "simulated matrices per case"})
    claims_sims: Optional[int] = field(default=None, metadata={
        "help": "simulated matrices per claims case (default: --sims): a claims family's rate sits near 0.05 at "
                "unequal spreads, where 1000 draws (+-0.014) cannot say which side"})
    claims: list[str] = field(default_factory=list, metadata={
        "help": "matrix files stating [[analysis.claims]]: the claims' procedure simulated at their designs (and on "
                "the first --aa's cells) (default: none)", "metavar": "FILE"})
    plans: list[str] = field(default_factory=list, metadata={
        "help": "matrix files whose planned design (variants x evaluation seeds) is simulated before their cells run "
                "(default: none)", "metavar": "FILE"})


@register_study
class Calibration(Study):
    name, group = "calibration", TOP
    help = ("the verdict procedure's family-wise error: simulated at matrices' own designs, measured on real A/A "
            "replicates and declared-equivalent pairs")
    Settings = CalibrationSettings
    report_file, title = "report.md", "Calibration of the verdicts"

    def check(self, s: CalibrationSettings) -> None:
        for flag, value in (("--sims", s.sims), ("--claims-sims", s.claims_sims)):
            if value is not None and value < 100:
                raise UsageError(f"{flag} must be at least 100, got {value}")

    def run(self, s: CalibrationSettings, command: str) -> int:
        from benchmarks.io import atomic_write_json  # start-up: hashlib, random (module docstring)
        from benchmarks.matrix import parse  # heavy: torch
        from benchmarks.progress import progress
        from benchmarks.report.calibration_report import calibration, records  # heavy: pandas, scipy

        try:
            result = calibration(s.dirs, aa=s.aa, sims=s.sims, claims_sims=s.claims_sims,
                                 claims=[parse(path) for path in s.claims],
                                 plans=[parse(path) for path in s.plans], progress=progress)
        except ValueError as exc:  # an --aa matrix of more than one variant, a claims file that states none
            raise UsageError(str(exc)) from None
        text = self.write(result, s, command)
        atomic_write_json(Path(s.out) / "calibration.json", records(result))
        print(text.splitlines()[0])
        print(f"wrote {s.out}/report.md, calibration.json")
        return 0

    def render(self, result: dict, s: CalibrationSettings, command: str) -> str:
        from benchmarks.report.calibration_report import render_calibration  # heavy: pandas, scipy

        return render_calibration(result, command)


# ------------------------------------------------------------------------------------------------
# The README's index of reports
# ------------------------------------------------------------------------------------------------


@dataclass
class ReadmeSettings(StudySettings):
    readme: str = option("readme", "results/checks.md")  # its section "checks"
    matrices: str = field(default="results/matrices.md", metadata={
        "help": "the page whose section 'matrices' lists every matrix file under --matrix-dir, what it is for, its "
                "cells and its result stores under results/ with how far each has run ('': none)", "writes": "file"})
    matrix_dir: str = field(default="benchmarks/matrices", metadata={"help": "where the matrix files are"})
    html: str = field(default="results/index.html", metadata={
        "help": "the HTML page listing every matrix folder under results/ with its headline and a link to its page "
                "('': none)", "writes": "file"})


def matrix_outline(path: Path) -> dict:
    """A matrix file as the matrices page lists it: its evaluation cells (a tuned matrix's: one grid point's per
    variant) and its tuning cells; a reading of stored matrices ([[cost_claims]], which ``grpo-bench claims`` reads)
    plans none."""
    import tomllib

    from benchmarks.matrix import parse  # heavy: torch

    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        data = {}  # not TOML: parse below says so in one line
    if "cost_claims" in data:
        return {"file": path.as_posix(), "name": str(data.get("name", path.stem)), "cells": 0, "tuning_cells": 0,
                "description": f"{data.get('description', '')} (a reading of stored matrices: `grpo-bench claims`)"}
    plan = parse(path)
    evaluation = len(plan.cells) or sum(len(group.candidates[0]) for group in plan.tuning)
    return {"file": path.as_posix(), "name": plan.name, "description": plan.description,
            "cells": evaluation, "tuning_cells": len(plan.tuning_cells())}


@register_study
class Readme(Study):
    name, group = "readme", TOP
    help = ("the README's table of checks and benchmarks (each results/ report's headline and a link), the page of "
            "matrix files (each with its result stores and how far they have run) and results/index.html")
    Settings = ReadmeSettings

    def run(self, s: ReadmeSettings, command: str) -> int:
        from benchmarks.markdown import index_reports  # start-up: hashlib, random (module docstring)

        files = sorted(Path(s.matrix_dir).glob("*.toml")) if s.matrices else []
        outlines = [matrix_outline(f) for f in files]  # a file that is not a matrix: one line, before any writing
        for line in index_reports(s.readme):
            print(line)
        if s.matrices and not files:  # as a report not written yet: said, and the rest written
            print(f"{s.matrix_dir}: no matrix files (*.toml), {s.matrices} not written")
        elif s.matrices:
            from benchmarks.report.matrix_index import index_matrices

            for line in index_matrices(outlines, s.matrices):
                print(line)
        if s.html:
            from benchmarks.report.html import write_index  # heavy: pandas

            for line in write_index("results", s.html):
                print(line)
        return 0
