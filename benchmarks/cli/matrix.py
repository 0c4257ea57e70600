"""``grpo-bench matrix`` (run a matrix file), ``report`` (its tables and plots), ``readme`` (copy reports
into the README), ``agreement`` (a rerun's verdicts against the first run's), ``transfer`` (a toy matrix's
ranking against a real one's), ``calibration`` (the verdicts' coverage and A/A false-separation rate) and
``ablation`` (GRPO's group size on the bandit).

One module serves all of these subcommands, and the light ones' ``--help`` (report, agreement, transfer, claims,
variance, calibration, readme) starts in about 0.1 s: the matrix engine and its executors (torch, through the
harness), the report's modules (pandas and scipy), the ablation (both) and ``benchmarks.curve`` (numpy) are imported
by the parser builder or handler that needs them, each such import marked "heavy"; so are the run-file modules
``benchmarks.io`` and ``benchmarks.store`` (and ``benchmarks.markdown``, which imports io), marked "start-up": their
hashlib and random (through ``secrets``) would add about 10 ms to that 0.1 s."""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path
from typing import Optional

from benchmarks.cli.options import (add_dataclass_options, comma_list, flag, given_options, matrix_directory,
                                    run_settings_problem, seed_value, writable)
from benchmarks.errors import UsageError


def add_matrix_parser(sub) -> None:
    p = sub.add_parser("matrix", help="run every task x algorithm variant x seed of a matrix file, cells in parallel")
    p.add_argument("file", help="matrix file (TOML), e.g. benchmarks/matrices/default.toml")
    p.add_argument("--out", required=True, help="results directory (one sub-directory per cell)")
    p.add_argument("--resume", action="store_true", help="skip finished cells; re-run unfinished ones (from a checkpoint if any)")
    p.add_argument("--overwrite", action="store_true", help="run every cell again, replacing finished ones")
    p.add_argument("--dry-run", action="store_true", help="validate the file and list the cells without running them")
    p.add_argument("--no-report", action="store_true", help="do not write the report (tables, plots, verdicts) when the cells are done")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (the per-cell lines remain)")
    p.add_argument("--tasks", default=None, help="comma-separated task labels (as in the cell paths): run only their "
                                                 "cells now; the others stay planned and a later --resume runs them")
    add_executor_options(p)
    p.set_defaults(handler=cmd_matrix)


def add_executor_options(parser) -> None:
    """``--executor NAME`` and a flag for every option some registered executor declares, grouped by executor."""
    from benchmarks.matrix.executors import EXECUTORS  # heavy: torch

    parser.add_argument_group("executor (where the cells run)").add_argument(
        "--executor", default="local", help=f"one of: {', '.join(sorted(EXECUTORS))} (default: local); each one's "
                                            "options are listed under its name")
    owners: dict[str, set] = {}
    for name, cls in sorted(EXECUTORS.items()):
        summary = inspect.getdoc(cls).split("\n\n")[0] if cls.__doc__ else None
        add_dataclass_options(parser.add_argument_group(f"--executor {name}", summary), cls.Options, owners, name)


def executor_settings(args) -> dict:
    """The executor flags given, refusing one of another executor than ``--executor``'s (ignored before:
    ``--ray-address`` without ``--executor ray`` ran the cells locally)."""
    from benchmarks.matrix.executors import EXECUTORS, executor_class, executor_option_names  # heavy: torch

    given = given_options(args, executor_option_names())
    own = {f.name for f in dataclasses.fields(executor_class(args.executor).Options)}
    for name in sorted(set(given) - own):
        owners = sorted(n for n, cls in EXECUTORS.items() if name in {f.name for f in dataclasses.fields(cls.Options)})
        raise UsageError(f"{flag(name)} is an option of --executor {' or '.join(owners)}, not of --executor "
                         f"{args.executor}" + (" (the default)" if args.executor == "local" else ""))
    return given


def check_cells(plan) -> None:
    """Every cell's settings, before any runs: what the matrix file's validation lets through and every cell
    would then fail on one by one, or train on nothing (``options.run_settings_problem``)."""
    for cell in plan.tuning_cells() + plan.cells + [c for g in plan.tuning for cells in g.candidates for c in cells]:
        problem = run_settings_problem(cell.spec().get("settings", {}))
        if problem:
            raise UsageError(f"{plan.path}: cell {cell.relpath}: {problem}")


def cmd_matrix(args) -> int:
    from benchmarks.io import read_json  # start-up: hashlib, random (module docstring)
    from benchmarks.matrix import parse, run_matrix  # heavy: torch
    from benchmarks.matrix.executors import make_executor  # heavy: torch

    executor = make_executor(args.executor, **executor_settings(args))
    plan = parse(args.file)
    check_cells(plan)
    out = Path(args.out)
    evaluation = plan.cells or [g.candidates[0][i] for g in plan.tuning for i in range(len(g.candidates[0]))]
    budgets = sorted({(c.task_label, c.budget) for c in evaluation})
    tuning = (f" after {len(plan.tuning_cells())} tuning cells (seeds {plan.tuning_seeds}; the grid point of highest "
              f"mean primary metric on validation problems is each variant's)" if plan.tuning else "")
    print(f"matrix {plan.name}: {len(evaluation)} cells{tuning}, budget "
          + ", ".join(f"{t} {b}" for t, b in budgets) + " generated completions per cell")
    if args.dry_run:
        for cell in plan.tuning_cells() + evaluation:
            print(f"  {cell.relpath}: {cell.steps} steps x {cell.completions_per_step} completions "
                  f"= {cell.steps * cell.completions_per_step}, eval every {cell.eval_every or '-'} steps"
                  + (" (at the chosen grid point)" if plan.tuning and not cell.tuning_point else ""))
        return 0
    tasks = None if args.tasks is None else comma_list(args.tasks)
    counts = run_matrix(plan, out, resume=args.resume, overwrite=args.overwrite, progress=not args.no_progress,
                        executor=executor, tasks=tasks)
    sessions = (read_json(out / "matrix.json") or {}).get("sessions", [])
    print(f"matrix {plan.name}: {counts['complete']} run and complete, {counts['skipped']} already complete, "
          f"{counts['failed']} failed; {sessions[-1]['elapsed_s']:.0f} s this session, "
          f"{sum(s['elapsed_s'] for s in sessions):.0f} s in all -> {out}")
    if not args.no_report:  # failed cells are reported as failed; the rest still get their tables and verdicts
        from benchmarks.report.matrix import report  # heavy: pandas, scipy

        data = report(out)
        for sentence in data.get("analysis", {}).get("sentences", []):
            print(sentence)
        print("report: " + ", ".join(data["written"]))
    if counts["failed"]:
        print(f"matrix {plan.name}: {counts['failed']} cell(s) failed (exit status 1); see their log.txt")
    return 1 if counts["failed"] else 0


def add_report_parser(sub) -> None:
    p = sub.add_parser("report", help="tables (CSV, markdown) and plots of a matrix directory")
    p.add_argument("dir", help="a directory written by grpo-bench matrix")
    p.add_argument("--readme", default=None, help="also update a section of this page (e.g. results/README.md, where the matrices and their verdicts are)")
    p.add_argument("--section", default=None, help="the README section's name (default: matrix-<dir name>)")
    p.add_argument("--no-plots", action="store_true", help="tables and markdown only")
    p.add_argument("--no-verdicts-section", action="store_true",
                   help="with --readme: the header lines and a link only, not the SECTION-verdicts section")
    p.set_defaults(handler=cmd_report)


def add_agreement_parser(sub) -> None:
    p = sub.add_parser("agreement", help="does a rerun of a matrix (another machine or thread count) reach the same verdicts?")
    p.add_argument("first", help="a matrix directory (the committed run)")
    p.add_argument("second", help="the rerun's directory (the same matrix file)")
    p.add_argument("--out", required=True, help="the markdown report to write")
    p.set_defaults(handler=cmd_agreement)


def add_transfer_parser(sub) -> None:
    p = sub.add_parser("transfer", help="does a toy matrix's ranking of the algorithms carry over to a real task's matrix?")
    p.add_argument("toy", help="the toy task's matrix directory")
    p.add_argument("real", help="the real task's matrix directory")
    p.add_argument("--pair", action="append", required=True, nargs=2, metavar=("TOY_VARIANT", "REAL_VARIANT"),
                   help="an algorithm both ran, by its variant name in each matrix (repeat, one per algorithm)")
    p.add_argument("--out", required=True, help="the markdown report to write")
    p.add_argument("--readme", default="", help="README whose SECTION gets the report (default: none)")
    p.add_argument("--section", default="transfer", help="README section name (default: transfer)")
    p.set_defaults(handler=cmd_transfer)


def cmd_transfer(args) -> int:
    from benchmarks.report.transfer import write_transfer  # heavy: pandas, scipy

    matrix_directory(args.toy, "TOY")  # the folders first: a typo in one is not "too few algorithms"
    matrix_directory(args.real, "REAL")
    pairs = [(toy.strip(), real.strip()) for toy, real in args.pair]
    if len({real for _, real in pairs}) < len(pairs) or len({toy for toy, _ in pairs}) < len(pairs):
        raise UsageError("--pair: each variant at most once on each side")
    if len(pairs) < 3:
        raise UsageError(f"--pair: a ranking needs at least 3 algorithms, got {len(pairs)}")
    _study_outputs(args)
    text = write_transfer(args.toy, args.real, pairs, args.out, command=args.command_line, readme=args.readme,
                          section=args.section)
    print(text.splitlines()[0])
    _wrote(args)
    return 0


def _study_outputs(args) -> None:
    """A study's matrix directories (``args.dirs``, where it has them), its --out file and, where given, --readme:
    there and writable, or one line before any work."""
    for directory in getattr(args, "dirs", []):
        matrix_directory(directory)
    writable(args.out, "--out")
    if args.readme:
        writable(args.readme, "--readme")


def _wrote(args) -> None:
    print(f"wrote {args.out}" + (f" and the {args.section} section of {args.readme}" if args.readme else ""))


def _study_parser(sub, name: str, help: str, dirs: str, *, out: Optional[str], section: str):
    """A study over matrix directories: DIR..., --out (a default, or required), --readme and --section."""
    p = sub.add_parser(name, help=help)
    p.add_argument("dirs", nargs="+", help=dirs)
    if out:
        p.add_argument("--out", default=out, help=f"the markdown report to write (default: {out})")
    else:
        p.add_argument("--out", required=True, help="the markdown report to write (a .json beside it)")
    p.add_argument("--readme", default="", help="README whose SECTION gets the report's tables (default: none)")
    p.add_argument("--section", default=section, help=f"README section name (default: {section})")
    return p


def add_claims_parser(sub) -> None:
    p = _study_parser(sub, "claims", "published claims about RL for LLMs, each tested by a matrix that stated it "
                                     "before its cells ran: the table of marks",
                      "matrix directories whose matrix files state [[analysis.claims]]", out="results/claims.md",
                      section="claims")
    p.set_defaults(handler=cmd_claims)


def cmd_claims(args) -> int:
    from benchmarks.report.claims import write_claims  # heavy: pandas, scipy

    _study_outputs(args)
    write_claims(args.dirs, args.out, command=args.command_line, readme=args.readme, section=args.section)
    _wrote(args)
    return 0


def add_variance_parser(sub) -> None:
    p = _study_parser(sub, "variance", "where a primary metric's seed-to-seed spread comes from (policy vs "
                                       "evaluation), and the design that reaches a target MDD in the fewest core-seconds",
                      "matrix directories whose cells kept per-question evaluation records", out=None, section="variance")
    p.add_argument("--target-mdd", type=float, default=0.05, help="the MDD the designs are planned for (default: 0.05)")
    p.add_argument("--variants", type=int, default=8, help="variants in the planned matrix (default: 8)")
    p.add_argument("--questions", type=int, nargs="+", default=[200, 500, 1000],
                   help="held-out question counts to project to (default: 200 500 1000)")
    p.add_argument("--metrics", nargs="+", default=["final", "last_2", "last_3", "auc"],
                   help="primary metrics to split (default: final last_2 last_3 auc)")
    p.set_defaults(handler=cmd_variance)


def cmd_variance(args) -> int:
    from benchmarks.curve import parse_primary  # heavy: numpy
    from benchmarks.report.variance import write_variance  # heavy: pandas, scipy

    _study_outputs(args)
    if not 0 < args.target_mdd < 1:
        raise UsageError(f"--target-mdd must be in (0, 1), got {args.target_mdd:g}")
    if args.variants < 2 or min(args.questions) < 2:
        raise UsageError("--variants and every --questions must be at least 2")
    for name in args.metrics:
        try:
            parse_primary(name)
        except ValueError as exc:
            raise UsageError(f"--metrics: {exc}") from None
    text = write_variance(args.dirs, args.out, command=args.command_line, readme=args.readme, section=args.section,
                          metrics=args.metrics, questions=args.questions, target=args.target_mdd, variants=args.variants)
    print(text.splitlines()[0].strip("*"))
    _wrote(args)
    return 0


def add_calibration_parser(sub) -> None:
    p = sub.add_parser("calibration", help="the verdict procedure's family-wise error: simulated at matrices' own "
                                           "designs, measured on real A/A replicates and declared-equivalent pairs")
    p.add_argument("dirs", nargs="+", help="matrix directories: their designs are simulated, their declared pairs judged")
    p.add_argument("--aa", default=None, help="an A/A matrix directory (one variant on many seeds, e.g. "
                                              "benchmarks/matrices/calibration_aa.toml): its cells cut into null matrices")
    p.add_argument("--out", default="results/calibration", help="folder for report.md and calibration.json")
    p.add_argument("--sims", type=int, default=2000, help="simulated matrices per case (default: 2000)")
    p.add_argument("--claims", nargs="+", default=[], metavar="FILE",
                   help="matrix files stating [[analysis.claims]]: the claims' procedure simulated at their designs "
                        "(and on --aa's cells)")
    p.set_defaults(handler=cmd_calibration)


def cmd_calibration(args) -> int:
    from benchmarks.matrix import parse  # heavy: torch
    from benchmarks.report.calibration_report import write_calibration  # heavy: pandas, scipy

    if args.sims < 100:
        raise UsageError(f"--sims must be at least 100, got {args.sims}")
    for directory in args.dirs + ([args.aa] if args.aa else []):
        matrix_directory(directory)
    writable(args.out, "--out", folder=True)
    try:
        text = write_calibration(args.dirs, args.out, aa=args.aa, sims=args.sims, command=args.command_line,
                                 claims=[parse(path) for path in args.claims])
    except ValueError as exc:  # an --aa matrix of more than one variant, a claims file that states none
        raise UsageError(str(exc)) from None
    print(text.splitlines()[2])
    print(f"wrote {args.out}/report.md, calibration.json")
    return 0


def cmd_agreement(args) -> int:
    shared_variants(args.first, args.second)  # the inputs first: a typo is one line before pandas loads
    writable(args.out, "--out")
    from benchmarks.report.agreement import write_agreement  # heavy: pandas, scipy

    _, text = write_agreement(args.first, args.second, args.out)
    print(text.splitlines()[2] if len(text.splitlines()) > 2 else text)
    print(f"wrote {args.out}")
    return 0


def _planned(directory: Path) -> tuple[str, list[dict]]:
    """The matrix's name and its planned cells, from DIR/matrix.json (one UsageError line when unreadable)."""
    from benchmarks.io import read_json  # start-up: hashlib, random (module docstring)

    meta = read_json(directory / "matrix.json")
    if not isinstance(meta, dict) or not isinstance(meta.get("cells"), list):
        raise UsageError(f"{directory / 'matrix.json'}: not a matrix plan (unreadable, or without its cells)")
    return str(meta.get("name", directory.name)), [c for c in meta["cells"] if isinstance(c, dict)]


def shared_variants(first, second) -> set[tuple[str, str]]:
    """The (task, variant) pairs two matrix directories both plan; none is one UsageError line naming each side's
    (``agreement`` compares a rerun of the same matrix, and two different ones had read "0 of 0 agree")."""
    sides = []
    for label, directory in (("FIRST", first), ("SECOND", second)):
        name, cells = _planned(matrix_directory(directory, label))
        sides.append((name, {(str(c.get("task_label")), str(c.get("variant"))) for c in cells}))
    shared = sides[0][1] & sides[1][1]
    if not shared:
        def listed(pairs):
            return ", ".join(f"{task} {variant}" for task, variant in sorted(pairs)[:4]) + (", ..." if len(pairs) > 4 else "")

        raise UsageError(f"{first} (matrix {sides[0][0]}) and {second} (matrix {sides[1][0]}) share no variant of a "
                         f"task: {listed(sides[0][1]) or 'no cells'} against {listed(sides[1][1]) or 'no cells'}; "
                         "agreement compares a rerun of the same matrix")
    return shared


def stored_cells(directory: Path) -> Optional[dict[str, dict]]:
    """Each cell the result store DIR/results.parquet holds, with its spec (its cell rows alone, not its metrics);
    None when there is no store or it cannot be read here (the report's own reading then says why)."""
    from benchmarks.store import store_path  # start-up: hashlib, random (module docstring)

    path = store_path(directory)
    if not path.is_file():
        return None
    try:
        import pyarrow.parquet as pq

        table = pq.read_table(path, columns=["cell", "kind", "spec"], filters=[("kind", "==", "cell")])
        return {row["cell"]: json.loads(row["spec"]) for row in table.to_pylist()}
    except Exception:  # noqa: BLE001 -- a damaged store: the report's verified read names the damage
        return None


def check_store_matches_plan(directory: Path) -> None:
    """Refuse a result store none of whose cells is a cell of DIR/matrix.json's plan (another matrix's store, copied
    in): its report would be every cell "missing", written over the matrix's own report."""
    from benchmarks.store import same_experiment_spec  # start-up: hashlib, random (module docstring)

    stored = stored_cells(directory)
    if not stored or not (directory / "matrix.json").is_file():
        return
    name, planned = _planned(directory)
    if not planned:
        return
    if any(same_experiment_spec(stored.get(c.get("dir")), {k: v for k, v in c.items() if k != "dir"}) for c in planned):
        return
    same_folders = sum(c.get("dir") in stored for c in planned)
    raise UsageError(f"{directory}: none of the {len(stored)} cells of its result store is a cell of the plan in "
                     f"{directory / 'matrix.json'} (matrix {name}, {len(planned)} cells"
                     + (f"; {same_folders} share a folder name but not the settings" if same_folders else "")
                     + "): the store belongs to another matrix; nothing written")


def cmd_report(args) -> int:
    from benchmarks.report.matrix import report, summary_markdown  # heavy: pandas, scipy

    check_store_matches_plan(Path(args.dir))
    if args.readme:
        writable(args.readme, "--readme")
    data = report(args.dir, readme=args.readme, section=args.section, plot=not args.no_plots,
                  verdicts_section=not args.no_verdicts_section)
    cells = data["cells"]
    counts = cells["status"].value_counts()
    print(f"{len(cells)} cells: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    not_done = cells[cells["status"] != "complete"]
    for r in not_done.itertuples():
        print(f"  {r.status}: {r.task} {r.variant} seed {r.seed}" + (f": {r.error}" if r.status == "failed" else ""))
    print(summary_markdown(data["summary"]))
    print("wrote " + ", ".join(data["written"]) + f", {args.dir}/tables/, {args.dir}/plots/")
    return 0


def add_readme_parser(sub) -> None:
    p = sub.add_parser("readme", help="the README's table of checks and benchmarks: each results/ report's headline and a link")
    p.add_argument("--readme", default="results/checks.md", help="page whose 'checks' section is updated (default: results/checks.md)")
    p.set_defaults(handler=cmd_readme)


def cmd_readme(args) -> int:
    from benchmarks.markdown import index_reports  # start-up: hashlib, random (module docstring)

    for line in index_reports(args.readme):
        print(line)
    return 0


def add_ablation_parser(sub) -> None:
    from benchmarks.matrix.ablation import AblationSettings  # heavy: torch, pandas

    defaults = AblationSettings()
    p = sub.add_parser("ablation", help="GRPO group-size ablation on the toy bandit (G = 2, 4, 8, 16)")
    p.add_argument("--out", default=defaults.out, help=f"output directory (default: {defaults.out})")
    p.add_argument("--group-sizes", type=int, nargs="+", default=defaults.group_sizes,
                   help=f"values of G (default: {' '.join(map(str, defaults.group_sizes))})")
    p.add_argument("--seeds", type=seed_value, nargs="+", default=defaults.seeds,
                   help=f"seeds (default: {' '.join(map(str, defaults.seeds))})")
    p.add_argument("--steps", type=int, default=defaults.steps, help=f"GRPO steps per run (default: {defaults.steps})")
    p.add_argument("--eval-every", type=int, default=defaults.eval_every,
                   help=f"exact evaluation every N steps (default: {defaults.eval_every})")
    p.add_argument("--reward-mode", default=defaults.reward_mode, choices=("rm", "verifiable"),
                   help=f"the bandit's reward (default: {defaults.reward_mode})")
    p.add_argument("--device", default=defaults.device, help="auto, cpu or cuda")
    p.set_defaults(handler=cmd_ablation)


def cmd_ablation(args) -> int:
    from benchmarks.matrix.ablation import AblationSettings, run_ablation  # heavy: torch, pandas

    settings = AblationSettings(out=args.out, group_sizes=args.group_sizes, seeds=args.seeds, steps=args.steps,
                                eval_every=args.eval_every, reward_mode=args.reward_mode, device=args.device)
    return run_ablation(settings, command=args.command_line)
