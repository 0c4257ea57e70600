"""``grpo-bench claims DIR...``: published claims about RL for LLMs, each tested by a matrix that stated it first.

A matrix file lists the claims it tests in ``[[analysis.claims]]`` (benchmarks/matrix/plan.py): the claim in a
sentence, its source, and the two variants that test it (the treatment the claim favours and its control). Like
the primary metric and the margin, the claims are part of the analysis the matrix records before its first cell
runs (matrix.json's ``analysis`` with ``stated_at``), so the question cannot move after the answer is seen.

Per matrix and task, every claim's treatment - control difference of the primary metric gets a simultaneous 95%
interval, the matrix's claims judged as one family (``inference.contrasts``: blocked by seed, c calibrated for
these contrasts), and one mark: *supported*, *contradicted*, *equivalent* within the stated margin (the difference
a claim names is not there), or *not resolved*, with the MDD and the seeds the margin would need. A claim whose
matrix has not finished says how many cells it still lacks; nothing is guessed.

A claim may name its metric: pass@K after training (the cells' ``pass_at_k_after``) instead of the primary metric.
Its control may be ``start``, the policy before training, read from the treatment's own cells: their accuracy
before training for the primary metric (an untrained policy's learning curve is flat at it), their
``pass_at_k_before`` for pass@K (one policy and one evaluation seed: the same value in every cell of a seed).
Each metric's claims are one family at 95% / (the number of metrics), so a matrix's marks still hold together with
probability >= 95% (Bonferroni over its metrics). A matrix's ``section`` puts its claims under that heading.

It reads the result stores and matrix.json files only.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from benchmarks.curve import START, pass_at, pass_at_k_value
from benchmarks.errors import UsageError
from benchmarks.markdown import markdown_table
from benchmarks.report import curves as learning_curves
from benchmarks.report import inference
from benchmarks.report.cost_claims import cost_claims_of, cost_mark_text
from benchmarks.report.matrix import collect
from benchmarks.report.verdicts import analysis_spec, primary_name
from benchmarks.store import ResultStore

COLUMNS = ["matrix", "section", "task", "id", "source", "claim", "treatment", "control", "expects", "metric",
           "primary", "margin", "stated_at", "seeds", "cells_missing", "treatment_mean", "control_mean", "difference",
           "low", "high", "mdd", "mark", "seeds_for_margin", "secondary", "secondary_treatment", "secondary_control",
           "secondary_difference", "secondary_low", "secondary_high", "report",
           # a cost claim read from a stored matrix (cost_claims.py)
           "reading_stated", "reading_of", "time_ratio", "time_low", "time_high", "state_ratio", "rss_ratio", "rss_low",
           "rss_high"]
LAST_SHARE = 0.25  # a secondary metric is each cell's mean over this last share of its steps


def secondary_values(steps: pd.DataFrame, task: str, variant: str, metric: str) -> dict[int, float]:
    """{seed: the cell's mean of ``metric`` over the last quarter of its steps} for one variant on one task."""
    if steps.empty or metric not in steps:
        return {}
    rows = steps[(steps["task"] == task) & (steps["variant"] == variant)]
    out = {}
    for seed, cell in rows.groupby("seed"):
        cell = cell.sort_values("step")
        tail = cell[metric].iloc[-max(1, math.ceil(LAST_SHARE * len(cell))):].astype(float)
        if tail.notna().any():
            out[int(seed)] = float(tail.mean())
    return out


def paired_difference(a: dict[int, float], b: dict[int, float]) -> tuple[float, float, float, float, float]:
    """(mean of a, mean of b, mean of the per-seed differences a - b, and its 95% t-interval, one at a time) over the
    seeds both have; nan where fewer than 2."""
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        return (math.nan,) * 5
    d = np.array([a[s] - b[s] for s in seeds])
    half = float(stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d)))
    return (float(np.mean([a[s] for s in seeds])), float(np.mean([b[s] for s in seeds])), float(d.mean()),
            float(d.mean() - half), float(d.mean() + half))


def pass_at_k_scores(store: ResultStore, cells: pd.DataFrame, task: str, claims: Sequence[dict],
                     k: int) -> dict[str, dict[int, float]]:
    """{variant: {seed: pass@k after training}} of the claims' variants on ``task``, and under ``START`` (where no
    variant has that name) the policy's before training, read from the cells of the treatments compared with it."""
    done = cells[(cells["task"] == task) & (cells["status"] == "complete")]
    variants = set(cells["variant"])

    def read(variant: str, when: str) -> dict[int, float]:
        out = {}
        for _, row in done[done["variant"] == variant].iterrows():
            value = pass_at_k_value(store.summary(row["dir"]) or {}, k, when)
            if value is not None:
                out[int(row["seed"])] = float(value)
        return out

    scores: dict[str, dict[int, float]] = {}
    for claim in claims:
        for name in (claim["treatment"], claim["control"]):
            if name == START and START not in variants:
                for seed, value in read(claim["treatment"], "before").items():
                    scores.setdefault(START, {}).setdefault(seed, value)
            elif name not in scores:
                scores[name] = read(name, "after")
    return scores


def _start_accuracy(cells: pd.DataFrame, task: str, claims: Sequence[dict]) -> dict[str, dict[int, float]]:
    """{START: {seed: accuracy before training}} where a claim compares with the policy before training (and no
    variant is named so), from the complete cells of its treatments; {} otherwise."""
    if START in set(cells["variant"]):
        return {}
    treatments = [c["treatment"] for c in claims if c["control"] == START]
    if not treatments:
        return {}
    done = cells[(cells["task"] == task) & (cells["status"] == "complete") & cells["variant"].isin(treatments)]
    return {START: {int(seed): float(v) for seed, v in zip(done["seed"], done["accuracy_before"])}}


def claims_of(directory: Path | str) -> pd.DataFrame:
    """One row per (claim, task) of the matrix in ``directory``: its interval and mark (``COLUMNS``)."""
    directory = Path(directory)
    data = collect(directory)
    spec = analysis_spec(data["meta"])
    claims = spec.get("claims") or []
    if not claims:
        raise UsageError(f"{directory}: its matrix states no claims ([[analysis.claims]] in the matrix file)")
    cells = data["cells"]
    per_cell = learning_curves.build(cells, data["evals"], spec["primary"]).get("cells", pd.DataFrame())
    store = ResultStore.read(directory) if any(c.get("metric") for c in claims) else None
    tasks = list(dict.fromkeys(cells["task"]))
    name = (data["meta"] or {}).get("name", directory.name)
    rows = []
    for task in tasks:
        mine = [c for c in claims if c.get("task") in (None, task)]
        if not mine:
            continue
        frame = per_cell[per_cell["task"] == task] if not per_cell.empty else per_cell
        families: dict[Optional[str], list[dict]] = {}  # per metric (None: the primary), one family each
        for claim in mine:
            families.setdefault(claim.get("metric"), []).append(claim)
        results = {}
        for metric, family in families.items():
            if metric is None:
                scores = {v: {} for c in family for v in (c["treatment"], c["control"])}
                for variant, group in (frame.groupby("variant", sort=False) if not frame.empty else []):
                    if variant in scores:
                        scores[variant] = dict(zip(group["seed"].astype(int), group["primary"].astype(float)))
                scores.update(_start_accuracy(cells, task, family))
            else:
                scores = pass_at_k_scores(store, cells, task, family, pass_at(metric))
            table, _ = inference.contrasts(scores, family, margin=spec["margin"], alpha=inference.ALPHA / len(families))
            results.update({c["id"]: result for c, (_, result) in zip(family, table.iterrows())})
        used = {v for c in mine for v in (c["treatment"], c["control"])}
        planned = cells[(cells["task"] == task) & cells["variant"].isin(list(used))]
        missing = int((planned["status"] != "complete").sum())
        for claim in mine:
            result = results[claim["id"]]
            metric = claim.get("secondary")
            described = paired_difference(secondary_values(data["steps"], task, claim["treatment"], metric),
                                          secondary_values(data["steps"], task, claim["control"], metric)) \
                if metric else (math.nan,) * 5
            rows.append({"matrix": name, "section": spec.get("section"), "task": task, "id": claim["id"],
                         "source": claim["source"], "claim": claim["claim"], "treatment": claim["treatment"],
                         "control": claim["control"], "expects": claim.get("expects", "better"),
                         "metric": claim.get("metric"), "primary": spec["primary"], "margin": spec["margin"],
                         "stated_at": spec.get("stated_at"), "seeds": result["seeds"], "cells_missing": missing,
                         **{k: result[k] for k in ("treatment_mean", "control_mean", "difference", "low", "high", "mdd",
                                                   "mark", "seeds_for_margin")},
                         "secondary": metric, **dict(zip(("secondary_treatment", "secondary_control",
                                                          "secondary_difference", "secondary_low", "secondary_high"),
                                                         described)),
                         "report": str(directory / "README.md")})
    return pd.DataFrame(rows, columns=COLUMNS)


def _number(value, fmt: str = "{:+.3f}") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt.format(value)


def _mark_text(r) -> str:
    if r["expects"] == "cheaper":
        text = cost_mark_text(r)
    elif r["mark"] == inference.SUPPORTED:
        text = "supported"
    elif r["mark"] == inference.CONTRADICTED:
        text = "contradicted"
    elif r["mark"] == inference.CLAIM_EQUIVALENT:
        text = f"no difference beyond +-{r['margin']:g} (equivalent)"
    elif r["mark"] == inference.IDENTICAL and isinstance(r["metric"], str):
        # pass@K counts solved questions: two cells can agree on it exactly without being one computation
        text = f"the same {r['metric']} on every seed: no difference (equivalent)"
    elif r["mark"] == inference.CLAIM_OPEN:
        text = f"not resolved at MDD {r['mdd']:.3f}" if not _missing(r["mdd"]) else "not resolved (too few seeds)"
        if r["seeds_for_margin"] is not None and not _missing(r["seeds_for_margin"]):
            text += f"; the margin needs ~{int(r['seeds_for_margin'])} seeds"
    else:
        text = str(r["mark"])
    if r["cells_missing"]:
        text += f" ({r['cells_missing']} cells not finished)"
    return text


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _stated(r) -> str:
    """When a row's primary metric and margin were stated: before its matrix's cells ran, or not."""
    margin = f"margin +-{r['margin']:g}" if not _missing(r["margin"]) else "no margin"
    if r["expects"] == "cheaper":
        when = (f"the store's own, stated {r['stated_at']} before its cells ran" if r["stated_at"]
                else "stated by the reading, after its cells ran")
        return (f"{r['matrix']} (a reading of {r['reading_of']}'s stored cells, written {r['reading_stated']}, after "
                f"they ran): {primary_name(r['primary'])}, {margin}, {when}")
    return f"{r['matrix']}: {primary_name(r['primary'])}, {margin}, stated {r['stated_at'] or 'NOT before its cells ran'}"


def render(table: pd.DataFrame, *, link_from: Path, command: str) -> str:
    """The claims table, then what each mark means and how the table was made."""
    sections: dict[Optional[str], list] = {None: []}  # the rows of each section, the unnamed one first
    for _, r in table.iterrows():
        where = Path(r["report"])
        try:
            link = where.resolve().relative_to(link_from.resolve())
        except ValueError:
            link = where
        control = "its policy before training" if r["control"] == START else f"`{r['control']}`"
        setting = f"`{r['treatment']}` vs {control} on {r['task']}"
        if isinstance(r["metric"], str):
            setting += f", {r['metric']} after training"
        result = (f"{_number(r['difference'])} [{_number(r['low'])}, {_number(r['high'])}] "
                  f"({_number(r['treatment_mean'], '{:.3f}')} vs {_number(r['control_mean'], '{:.3f}')}, "
                  f"{r['seeds']} seeds)") if not _missing(r["difference"]) else f"- ({r['seeds']} seeds)"
        beside = "-"
        if r["expects"] == "cheaper":
            setting += " (a reading: stored cells, no cell ran for it)"
            result = (f"accuracy {result}; training time x{r['time_ratio']:.2f} [{r['time_low']:.2f}, "
                      f"{r['time_high']:.2f}]; trained state x{r['state_ratio']:.2f}")
            if not _missing(r["rss_ratio"]):
                beside = f"peak RSS x{r['rss_ratio']:.2f} [{r['rss_low']:.2f}, {r['rss_high']:.2f}]"
        elif r["secondary"] and not _missing(r["secondary_difference"]):
            beside = (f"{r['secondary']} {r['secondary_treatment']:.3g} vs {r['secondary_control']:.3g}: "
                      f"{r['secondary_difference']:+.3g} [{r['secondary_low']:+.3g}, {r['secondary_high']:+.3g}]")
        elif r["secondary"]:
            beside = f"{r['secondary']}: not logged"
        expects = {"equal": " (expects: equal)", "differs": " (expects: a difference, either sign)",
                   "cheaper": " (expects: cheaper, equally accurate)"}.get(r["expects"], "")
        section = r["section"] if isinstance(r["section"], str) else None
        sections.setdefault(section, []).append([r["claim"] + expects, r["source"], setting, result, _mark_text(r),
                                                 beside, f"[{r['matrix']}]({link})"])
    stated = sorted({_stated(r) for _, r in table.iterrows()})
    header = ["claim", "source", "setting here", "treatment - control [simultaneous 95%]", "mark",
              "beside it (described, not judged)", "matrix"]
    unnamed = sections.pop(None)
    tables = [markdown_table(header, unnamed)] if unnamed else []
    tables += [f"#### {name}\n\n{markdown_table(header, rows)}" for name, rows in sections.items()]
    lines = ["\n\n".join(tables), "",
             "How to read it: each matrix states its claims, primary metric and margin of equivalence in its file before "
             "its first cell runs (the store records when). The interval is for the treatment's primary metric minus the "
             "control's, blocked by seed; a matrix's claims are one family of simultaneous 95% intervals, the critical "
             "value calibrated for those contrasts (benchmarks/report/inference.py, `contrasts`), so every mark of a "
             "matrix holds together with probability >= 95%. *Supported*: the interval lies on the claim's side of 0; "
             "*contradicted*: on the other side (for a claim of no difference: any separation; for a claim of a "
             "difference of either sign: inside +-margin, and it is supported by a separation from 0 beyond that); "
             "*equivalent*: inside +-margin, so the difference the claim names is not there at this scale; *not "
             "resolved*: none of these, with the MDD (the true difference found with 80% probability) and the seeds "
             "the margin would need. Not resolved is not equivalent. A claim on pass@K (its setting says so) compares "
             "the cells' pass@K after training (unbiased, from the samples a question of their pass@k evaluation); "
             "a claim against *its policy before training* reads the same cells' evaluation before their first step "
             "(their accuracy for the primary metric). A matrix's claims on one metric are one family, at 95% "
             "divided by its number of metrics (Bonferroni), so its marks still hold together with probability "
             ">= 95%. *Beside it*: a training metric the claim speaks "
             "of (entropy, the length of incorrect completions), each cell's mean over the last quarter of its steps, "
             "treatment vs control and their per-seed difference with a one-at-a-time 95% t-interval: a description, "
             "not part of the family the marks come from. *A reading* (expects: cheaper) reads a matrix that ran both "
             "variants for another question: the treatment costs less at equal accuracy where its accuracy is not "
             "below the control's by more than the margin, its training time's per-seed ratio lies below 1 and its "
             "trained state (parameters, gradients, optimizer state, a critic included) is smaller; the accuracy and "
             "time intervals are 97.5% each (Bonferroni), so the mark holds with probability >= 95% "
             "(benchmarks/report/cost_claims.py). Peak RSS beside it counts the interpreter and libraries too.", "",
             "Stated analyses: " + "; ".join(stated) + ".", "", f"Regenerate: `{command}`"]
    return "\n".join(lines) + "\n"


def claims_table(directories: Sequence[str]) -> pd.DataFrame:
    """Every claim of the matrix directories and reading files (.toml) given, one row each, in their order."""
    return pd.concat([cost_claims_of(d) if str(d).endswith(".toml") else claims_of(d) for d in directories],
                     ignore_index=True).reindex(columns=COLUMNS)
