"""``grpo-bench agreement A B``: does a rerun of a matrix (another machine, another thread count) reach the
same verdicts?

Seed for seed, a rerun elsewhere is a different run: another CPU (or another thread count on this one)
sums in another order, the rounding differs in the last bits at the first step, and sampling diverges
from there. What a rerun should agree on is what the statistics claim, within their stated error:

  * every mark (best, worse, equivalent, not resolved: benchmarks/report/inference.py) on every task that
    ranks: each run's marks of a task hold together with probability >= 95%, so a mark may move between
    "not resolved" and a decided one when a comparison sits near its interval's edge, but two runs should
    never disagree in direction (one "worse" where the other says "best");
  * the variant means of the primary metric (the one the marks are computed on: final accuracy, or the
    matrix's stated ``[analysis] primary``): B's mean minus A's, with Welch's 95% t interval over the two runs'
    seeds (taken as independent runs), should cover 0 in all but about 5% of the variants. Not "B's mean inside A's
    95% interval": B's mean has its own seed-to-seed error, so with 3 to 8 seeds a run of the same design falls
    outside A's percentile-bootstrap interval 28-39% of the time, not 5%, where Welch's interval misses 0 3.5-4.7%
    of the time (the simulation in tests/benchmarks/report/test_matrix.py).

The report lists both, variant by variant, and a headline with the counts. Where the two stores hold the same
experiment (a cell of each with the same settings, seed, budget, task and evaluation, whatever its variant is called:
a matrix repeating another's cells), it also says whether the second reproduced the first exactly: every evaluation's
answer to every question (``questions/correct``; its accuracy where the task records no answers), and every
training step's mean reward. On one machine and thread count a cell is deterministic, so a difference there is a
change in the code or the libraries, not noise: each compared pair says which of what its cells recorded (the code's
commit, the library versions, the rounding settings, the device) differs, and the headline counts the pairs that
differ with none of it different. It reads the two result stores and matrix.json files only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pandas as pd

from benchmarks.markdown import markdown_table, with_interval
from benchmarks.report.inference import TOO_FEW
from benchmarks.report.matrix import matrix_verdicts
from benchmarks.report.stats import welch_interval
from benchmarks.store import ResultStore, environment_changes, experiment


def marked(mark) -> bool:
    """Whether the procedure made a claim about the variant: not TOO_FEW, its mark where a run has too few of its
    seeds or nothing to compare it with (a variant without a claim disagrees with none)."""
    return isinstance(mark, str) and not mark.startswith(TOO_FEW)


def agreement(first: Path | str, second: Path | str) -> pd.DataFrame:
    """Per (task, variant) present in both: each run's mark and primary mean with its 95% interval, whether the
    marks agree, and the second's mean minus the first's with its Welch 95% interval (``difference``, ``_low``,
    ``_high``) and whether that interval covers 0 (``consistent``; None where a run has fewer than 2 seeds)."""
    a, b = matrix_verdicts(first), matrix_verdicts(second)
    if a.empty or b.empty:
        return pd.DataFrame()
    both = a.merge(b, on=["task", "variant"], suffixes=("_a", "_b"))
    both["same_mark"] = both["mark_a"] == both["mark_b"]
    differences = [welch_interval(values_b, values_a)
                   for values_a, values_b in zip(both["primary_values_a"], both["primary_values_b"])]
    for i, column in enumerate(("difference", "difference_low", "difference_high")):
        both[column] = [d[i] for d in differences]
    both["consistent"] = [None if pd.isna(low) else bool(low <= 0.0 <= high)  # nan: fewer than 2 seeds in a run
                          for low, high in zip(both["difference_low"], both["difference_high"])]
    return both


def _experiment_key(spec: dict) -> str:
    """What a cell computes, whatever its matrix calls its variant and task."""
    spec = experiment(spec)
    spec.pop("variant", None), spec.pop("task_label", None)
    return json.dumps(spec, sort_keys=True, default=str)


def _evaluations(store: ResultStore, relpath: str) -> dict[str, tuple[Optional[str], Optional[float]]]:
    """A cell's evaluations, before training, at each evaluated step and after: each one's answers question by
    question (``questions/correct``; None where the task records none) and its accuracy."""
    def answers(found) -> Optional[str]:
        return found if isinstance(found, str) else None

    summary = store.summary(relpath) or {}
    found = {f"step {row['step']}": (answers(row.get("questions/correct")), row.get("eval/accuracy"))
             for row in store.steps.get(relpath, []) if "eval/accuracy" in row or "questions/correct" in row}
    for when in ("before", "after"):
        correct = (summary.get("eval_questions") or {}).get(when, {}).get("questions/correct")
        if correct is not None or f"accuracy_{when}" in summary:
            found[when] = (answers(correct), summary.get(f"accuracy_{when}"))
    return found


def environment_difference(first: dict, second: dict) -> str:
    """What differs between two cells' recorded environments (``config.environment`` of their summaries) among what
    can change a cell's numbers: the code's commit (or uncommitted changes), each library's version, the rounding
    settings (threads, the CPU's vector capability) and the device. '' where none does; 'not recorded' where a
    cell has no environment."""
    envs = [((s.get("config") or {}).get("environment") or None) for s in (first, second)]
    if not all(envs):
        return "not recorded"
    a, b = envs
    found = []
    code_a, code_b = a.get("code") or {}, b.get("code") or {}
    if code_a.get("commit") != code_b.get("commit"):
        found.append(f"code {str(code_a.get('commit'))[:7]} -> {str(code_b.get('commit'))[:7]}")
    dirty = [name for name, code in (("first", code_a), ("second", code_b)) if code.get("dirty")]
    if dirty:
        found.append(f"code with uncommitted changes ({'both' if len(dirty) == 2 else dirty[0]})")
    found += environment_changes(a, b)
    if a.get("device_name") != b.get("device_name"):
        found.append(f"device {a.get('device_name')} -> {b.get('device_name')}")
    return "; ".join(found)


def shared_cells(first: Path | str, second: Path | str) -> pd.DataFrame:
    """Each complete cell of ``second`` whose experiment a complete cell of ``first`` ran too: how many of their
    evaluations are the same (answer by answer where the task records its answers, else the accuracy), how many
    answers differ, how many training steps' mean rewards are the same, and what differs in what the two cells
    recorded of their environment (``environment_difference``)."""
    a, b = ResultStore.open(first), ResultStore.open(second)

    def complete(store: ResultStore) -> dict[str, str]:
        return {_experiment_key(cell["spec"]): relpath for relpath, cell in sorted(store.cells.items())
                if (cell.get("summary") or {}).get("status") == "complete"}

    ours = complete(a)
    rows = []
    for key, relpath in complete(b).items():
        match = ours.get(key)
        if match is None:
            continue
        evals_a, evals_b = _evaluations(a, match), _evaluations(b, relpath)
        both = [when for when in evals_a if when in evals_b]
        answered = [w for w in both if evals_a[w][0] is not None and evals_b[w][0] is not None]
        same = sum((evals_a[w][0] == evals_b[w][0]) if w in answered else (evals_a[w][1] == evals_b[w][1]) for w in both)
        differing = sum(sum(x != y for x, y in zip(evals_a[w][0], evals_b[w][0]))
                        + abs(len(evals_a[w][0]) - len(evals_b[w][0])) for w in answered)
        rewards_a = {row["step"]: row.get("reward/mean") for row in a.steps.get(match, [])}
        rewards_b = {row["step"]: row.get("reward/mean") for row in b.steps.get(relpath, [])}
        steps = [step for step in rewards_a if step in rewards_b]
        rows.append({"first": match, "second": relpath, "evaluations": len(both), "same_evaluations": same,
                     "questions": sum(len(evals_a[w][0]) for w in answered), "questions_differing": differing,
                     "steps": len(steps), "same_rewards": sum(rewards_a[t] == rewards_b[t] for t in steps),
                     "environment": environment_difference(a.summary(match) or {}, b.summary(relpath) or {})})
    return pd.DataFrame(rows, columns=["first", "second", "evaluations", "same_evaluations", "questions",
                                       "questions_differing", "steps", "same_rewards", "environment"])


def reproduced(cells: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``shared_cells`` whose second cell reproduced the first exactly (every evaluation, every reward)."""
    return cells[(cells["same_evaluations"] == cells["evaluations"]) & (cells["same_rewards"] == cells["steps"])
                 & (cells["evaluations"] > 0)]


def render_shared_cells(cells: pd.DataFrame) -> list[str]:
    """The section on the experiments both stores ran: reproduced exactly or not, cell by cell."""
    if cells.empty:
        return []
    exact = reproduced(cells)
    differing = cells.drop(exact.index)
    unexplained = int((differing["environment"] == "").sum())
    if differing.empty:
        why = ""
    elif unexplained:
        why = (f"; of the {len(differing)} that did not, {unexplained} ran with the same recorded code, libraries, "
               "rounding settings and device (a difference those do not explain)")
    else:
        why = (f"; every one that did not ({len(differing)}) recorded another code, library version, rounding "
               "setting or device")
    lines = ["", "## Cells both ran", "",
             f"**{len(exact)} of {len(cells)} cells that ran the same experiment in both (the same settings, seed, "
             "budget, task and evaluation) reproduced the first exactly: every evaluation (answer by answer where the "
             "task records its answers, else its accuracy) and every training step's mean reward"
             + why + ".** A cell is "
             "deterministic on one machine and thread count with the same code and libraries; a cell that differs ran "
             "with another of them (summing in another order, it diverges from its first step). The last column says "
             "which of them the two cells recorded differently.", ""]
    rows = [[r.first, r.second, f"{r.same_evaluations} of {r.evaluations}",
             f"{r.questions_differing} of {r.questions}" if r.questions else "- (not recorded)",
             f"{r.same_rewards} of {r.steps}", r.environment or "nothing recorded differs"] for r in cells.itertuples()]
    lines.append(markdown_table(["first", "second", "evaluations the same", "answers that differ",
                                 "training steps' mean reward the same", "what the two cells recorded differently"],
                                rows))
    return lines


def render(table: pd.DataFrame, first: str, second: str, cells: Optional[pd.DataFrame] = None,
           matrices: Optional[tuple[str, str]] = None) -> str:
    """The report; ``matrices``: the two runs' matrix names, where they differ their marks are not a rerun's."""
    shared = render_shared_cells(cells if cells is not None else pd.DataFrame())
    if table.empty:
        return "\n".join([f"# Agreement of `{second}` with `{first}`", "", "No complete cells in common: nothing to compare.",
                          *shared]) + "\n"
    both_marked = table["mark_a"].map(marked) & table["mark_b"].map(marked)
    ranking = table[~table["saturated_a"] & both_marked]
    metrics = dict.fromkeys(list(table["primary_metric_a"]) + list(table["primary_metric_b"]))
    marks = f"{int(ranking['same_mark'].sum())} of {len(ranking)} marks agree on the tasks that rank"
    if matrices and matrices[0] != matrices[1]:
        marks = (f"Different matrices (`{matrices[0]}`, `{matrices[1]}`): each marks its variants against its own "
                 f"others, so their marks ({int(ranking['same_mark'].sum())} of {len(ranking)} the same) are not a "
                 "rerun's")
    if not both_marked.all():
        marks += f" ({int((~both_marked).sum())} without a mark in one run, too few seeds or nothing to compare, not counted)"
    compared = table["consistent"].map(lambda c: c is not None)
    covering = int(table["consistent"].map(lambda c: c is True).sum())
    means = (f"{covering} of {int(compared.sum())} differences of means (rerun minus first, Welch's 95% interval) "
             "cover 0")
    if not compared.all():
        means += f" ({int((~compared).sum())} with fewer than 2 seeds in a run, not compared)"
    lines = [f"# Agreement of `{second}` with `{first}`", "",
             f"**{marks}; {means}"
             + (f"; {len(reproduced(cells))} of {len(cells)} cells both ran reproduced the first exactly"
                if cells is not None and not cells.empty else "") + ".**", "",
             "Primary metric (the marks' and the means'): " + " in the first run, ".join(
                 f"`{m}`" for m in metrics) + ("" if len(metrics) == 1 else " in the rerun: the runs measure different "
                                               "things, and their marks cannot be compared") + ".", "",
             "A rerun elsewhere is a different run seed for seed (other rounding, then other samples); what it should "
             "share is the verdicts, within the procedure's stated error (each run's marks of a task hold together with "
             "probability >= 95%; each difference of means has its interval miss 0 with probability about 5% when "
             "nothing changed, the two runs' seeds taken as independent runs).", ""]
    rows = [[r.task, r.variant, f"{r.seeds_a} / {r.seeds_b}",
             with_interval(r.primary_all_mean_a, r.primary_all_low_a, r.primary_all_high_a, seeds=r.seeds_a),
             with_interval(r.primary_all_mean_b, r.primary_all_low_b, r.primary_all_high_b, seeds=r.seeds_b),
             r.mark_a, r.mark_b, ("yes" if r.same_mark else "**no**") if marked(r.mark_a) and marked(r.mark_b) else "-",
             "-" if r.consistent is None else f"{r.difference:+.3f} [{r.difference_low:+.3f}, {r.difference_high:+.3f}]",
             "-" if r.consistent is None else ("yes" if r.consistent else "**no**")]
            for r in table.itertuples()]
    lines.append(markdown_table(["task", "variant", "seeds", "first: mean [95% CI]", "rerun: mean [95% CI]",
                                 "first: mark", "rerun: mark", "same mark", "rerun - first [95%, Welch]",
                                 "interval covers 0"], rows))
    return "\n".join(lines + shared) + "\n"
