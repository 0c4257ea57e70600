"""``grpo-bench matrix`` (run a matrix file) and ``report`` (its tables and plots). The studies over matrix
directories (agreement, claims, variance, calibration) are registered studies: benchmarks/commands.py.

``report --help`` starts in about 0.1 s: the matrix engine and its executors (torch, through the harness) and the
report's modules (pandas and scipy) are imported by the parser builder or handler that needs them, each such import
marked "heavy"; so are the run-file modules ``benchmarks.io`` and ``benchmarks.store``, marked "start-up": their
hashlib and random (through ``secrets``) would add about 10 ms to that 0.1 s."""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path
from typing import Optional

from benchmarks.cli.options import add_dataclass_options, comma_list, flag, given_options, run_settings_problem
from benchmarks.errors import UsageError
from benchmarks.commands import planned_cells
from benchmarks.study import writable


def add_matrix_parser(sub, name: str) -> None:
    p = sub.add_parser(name, help="run every task x algorithm variant x seed of a matrix file, cells in parallel")
    p.add_argument("file", help="matrix file (TOML), e.g. benchmarks/matrices/default.toml")
    p.add_argument("--out", required=True, help="results directory (one sub-directory per cell)")
    p.add_argument("--resume", action="store_true", help="skip finished cells; re-run unfinished ones (from a checkpoint if any)")
    p.add_argument("--overwrite", action="store_true", help="run every cell again, replacing finished ones; with "
                   "--resume: run again only the finished cells whose settings the file changed, keep the rest")
    p.add_argument("--allow-dirty", action="store_true", help="run from uncommitted code (or outside a git checkout): "
                   "every cell is recorded dirty, with the sha256 of the diff")
    p.add_argument("--dry-run", action="store_true", help="validate the file and list the cells without running them")
    p.add_argument("--no-report", action="store_true", help="do not write the report (tables, plots, verdicts) when the cells are done")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (the per-cell lines remain)")
    p.add_argument("--tasks", default=None, help="comma-separated task labels (as in the cell paths): run only their "
                                                 "cells now; the others stay planned and a later --resume runs them")
    p.add_argument("--rerun", default=None, help="with --resume: comma-separated cell paths or shell patterns (as "
                                                 "tune/chain_sum/dapo/*): run those cells again from step 0, "
                                                 "replacing them, and resume the rest")
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
    from benchmarks.matrix.plan import design_warnings
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
    for line in design_warnings(plan):  # said before any cell runs, and at --dry-run; not refused
        print(line)
    if args.dry_run:
        for cell in plan.tuning_cells() + evaluation:
            print(f"  {cell.relpath}: {cell.steps} steps x {cell.completions_per_step} completions "
                  f"= {cell.steps * cell.completions_per_step}, eval every {cell.eval_every or '-'} steps"
                  + (" (at the chosen grid point)" if plan.tuning and not cell.tuning_point else ""))
        return 0
    tasks = None if args.tasks is None else comma_list(args.tasks)
    # run_matrix takes --out as given: an empty name is refused there, where Path("") would have read as "."
    from benchmarks.report import inference  # heavy: scipy (the report below imports it anyway)

    counts = run_matrix(plan, args.out, resume=args.resume, overwrite=args.overwrite, progress=not args.no_progress,
                        executor=executor, tasks=tasks, rerun=None if args.rerun is None else comma_list(args.rerun),
                        allow_dirty=args.allow_dirty, procedure=getattr(inference, "PROCEDURE", "pairs-v2"))
    sessions = (read_json(out / "matrix.json") or {}).get("sessions", [])
    print(f"matrix {plan.name}: {counts['complete']} run and complete, {counts['skipped']} already complete, "
          f"{counts['failed']} failed; {sessions[-1]['elapsed_s']:.0f} s this session, "
          f"{sum(s['elapsed_s'] for s in sessions):.0f} s in all -> {out}")
    if not args.no_report:  # failed cells are reported as failed; the rest still get their tables and verdicts
        from benchmarks.io import write_errors  # start-up: hashlib, random (module docstring)
        from benchmarks.report.matrix import report  # heavy: pandas, scipy
        from benchmarks.report.population import task_lines

        with write_errors(out, lambda: "the cells are kept in its store; grpo-bench report DIR writes the report"):
            data = report(out, population=task_lines)
        for sentence in data.get("analysis", {}).get("sentences", []):
            print(sentence)
        print("report: " + ", ".join(data["written"]))
    if counts["failed"]:
        print(f"matrix {plan.name}: {counts['failed']} cell(s) failed (exit status 1); see their log.txt")
    return 1 if counts["failed"] else 0


def add_report_parser(sub, name: str) -> None:
    p = sub.add_parser(name, help="tables (CSV, markdown) and plots of a matrix directory")
    p.add_argument("dir", help="a directory written by grpo-bench matrix")
    p.add_argument("--readme", default=None, help="also update a section of this page (e.g. results/README.md, where the matrices and their verdicts are)")
    p.add_argument("--section", default=None, help="the README section's name (default: matrix-<dir name>)")
    p.add_argument("--no-plots", action="store_true", help="tables and markdown only")
    p.add_argument("--no-verdicts-section", action="store_true",
                   help="with --readme: the header lines and a link only, not the SECTION-verdicts section")
    p.add_argument("--cost-reference", default=None, metavar="VARIANT",
                   help="a variant of the matrix: each other variant's cost against it, seed by seed (ratios of "
                        "training and cell seconds and of peak memory, with 95%% intervals)")
    p.set_defaults(handler=cmd_report)


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
    """Refuse a result store none of whose cells is a cell of DIR/matrix.json's plan or of its tuning stage (another
    matrix's store, copied in): its report would be every cell "missing", written over the matrix's own report."""
    from benchmarks.store import same_experiment_spec  # start-up: hashlib, random (module docstring)

    stored = stored_cells(directory)
    if not stored or not (directory / "matrix.json").is_file():
        return
    name, planned = planned_cells(directory, tuning=True)  # between the stages the store holds tuning cells only
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
    from benchmarks.io import README_HEADING, own_readme  # start-up: hashlib, random (module docstring)
    from benchmarks.report.matrix import report, summary_markdown  # heavy: pandas, scipy
    from benchmarks.report.population import task_lines

    if not own_readme(Path(args.dir) / "README.md"):
        raise UsageError(f"{Path(args.dir) / 'README.md'} was not written by grpo-bench (its first line is not "
                         f"{README_HEADING!r}) and the report would replace it: move it, then report")
    check_store_matches_plan(Path(args.dir))
    if args.readme:
        writable(args.readme, "--readme")
    data = report(args.dir, readme=args.readme, section=args.section, plot=not args.no_plots,
                  verdicts_section=not args.no_verdicts_section, cost_reference=args.cost_reference,
                  population=task_lines)
    if "tuning_stage" in data:  # no evaluation cell yet: the grid so far
        rows = data["tuning_stage"]
        print(f"tuning stage: {sum(r['seeds'] for r in rows)} of {sum(r['planned'] for r in rows)} tuning cells "
              f"finished; wrote " + ", ".join(data["written"]))
        return 0
    cells = data["cells"]
    counts = cells["status"].value_counts()
    print(f"{len(cells)} cells: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    not_done = cells[cells["status"] != "complete"]
    for r in not_done.itertuples():
        print(f"  {r.status}: {r.task} {r.variant} seed {r.seed}" + (f": {r.error}" if r.status == "failed" else ""))
    print(summary_markdown(data["summary"]))
    print("wrote " + ", ".join(data["written"]) + f", {args.dir}/tables/, {args.dir}/plots/")
    return 0
