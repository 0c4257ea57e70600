"""Verdicts about the skill, not the evaluation's questions: a crossed seeds x questions analysis.

A real-LM matrix scores every cell on the same Q held-out questions (a task's evaluation set follows from its
options, never from the run's seed), so the seed-to-seed spread of two variants' difference leaves out which
questions were drawn: its intervals speak for those Q questions. Each cell keeps a per-question record of every
evaluation (``io.encode_correct``), and the primary metric is linear in the evaluations, so a cell's metric is the
mean over questions of per-question scores y_{s,q} (each question's own curve put through the metric,
``variance.question_contributions``). For a pair of variants (i, j) paired by seed, the differences

    d_{s,q} = y_{i,s,q} - y_{j,s,q} = delta + a_s + b_q + e_{s,q}

follow the crossed random-effects model (seeds s = 1..S and questions q = 1..Q both drawn from their populations;
a_s, b_q, e_{s,q} independent, variances sigma2_seed, sigma2_question, sigma2_residual). The mean of d estimates delta,
the difference over the population of seeds *and* questions, with

    Var(mean d) = sigma2_seed / S + sigma2_question / Q + sigma2_residual / (S Q).

The components come from the two-way table's ANOVA moments (one observation a cell):

    MS_seed = Q sum_s (d_s. - d..)^2 / (S - 1),  MS_question = S sum_q (d_.q - d..)^2 / (Q - 1),
    MS_residual = sum_{s,q} (d_sq - d_s. - d_.q + d..)^2 / ((S - 1)(Q - 1)),
    sigma2_residual = MS_residual,  sigma2_seed = (MS_seed - MS_residual) / Q,
    sigma2_question = (MS_question - MS_residual) / S,

each truncated at 0. The seeds-only variance from the same table, what the paired-by-seed analysis uses, is
MS_seed / (S Q) = var_s(d_s.) / S with S - 1 degrees of freedom: unbiased for sigma2_seed / S + sigma2_residual / (S Q),
the seed and residual parts, and blind to the question part. The crossed variance adds that part:

    Var = MS_seed / (S Q) + max(MS_question - MS_residual, 0) / (S Q)

(untruncated, (MS_seed + MS_question - MS_residual) / (S Q), the sum of the three parts), a linear combination
sum_k c_k MS_k whose degrees of freedom are Satterthwaite's, (sum_k c_k MS_k)^2 / sum_k (c_k MS_k)^2 / df_k. With no
question part it is the seeds-only variance and its S - 1 degrees of freedom exactly, and it is never below it.
Rejected, measured: truncating sigma2_seed at 0 inside the variance too. Where MS_seed < MS_residual by chance
(likely at few seeds), that hands the whole variance to MS_residual's (S - 1)(Q - 1) degrees of freedom, and the 95%
interval covered 88% (2 seeds) and 92% (3 seeds) of simulated designs with a seed part and little question part,
where this form covers 94% (tests/benchmarks/report/test_crossed.py). This form's lowest, measured: 92.6% at 2 seeds
with a large question part (Satterthwaite's approximation with 1 degree of freedom in the seed term); 93-96% at 3, 6
and 8 seeds in every design tried.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional, Union

import numpy as np
import pandas as pd
from scipy import stats as st

from benchmarks.errors import UsageError
from benchmarks.io import QUESTIONS_CORRECT, QUESTIONS_SAMPLES, read_json
from benchmarks.report import inference
from benchmarks.report.curves import completion_grids
from benchmarks.report.matrix import collect
from benchmarks.report.variance import question_contributions
from benchmarks.report.verdicts import analysis_spec
from benchmarks.store import ResultStore

STAGES = ("evaluation", "tuning")
CONFIDENCE = 0.95
NEW_DRAW = "seeds and questions: a new draw of both"
SCORE_COLUMNS = ["task", "variant", "seed", "question", "score"]


# ------------------------------------------------------------------------------------------------
# Per-question scores from a store
# ------------------------------------------------------------------------------------------------


def question_scores(directory: Union[str, Path], primary: Optional[str] = None, *,
                    stage: str = "evaluation") -> pd.DataFrame:
    """Per task, variant, seed and question: the cell's primary-metric score on that question (long frame, columns
    ``SCORE_COLUMNS``); the mean over a cell's questions is the cell's primary metric as the report computes it
    (``curves.build``: evaluations in the order they ran, the task's budget) or, for ``stage`` "tuning", as the
    tuning choice does (``curve.cell_scores``: the cell's own budget), where a variant is named "VARIANT POINT".
    ``primary``: the matrix's stated metric when None. ``attrs`` holds the primary, the stage, and per task its
    evaluations' distinct task options (``population``). Questions are identified by their position in the
    evaluation set, the order every record keeps. A store without per-question records is one UsageError line."""
    if stage not in STAGES:
        raise UsageError(f"stage {stage!r}: one of {', '.join(STAGES)}")
    directory = Path(directory)
    if stage == "evaluation":
        data = collect(directory)
        primary = primary or analysis_spec(data["meta"])["primary"]
        rows, options = _evaluation_scores(directory, data, primary)
    else:
        meta = read_json(directory / "matrix.json") or {}
        primary = primary or analysis_spec(meta)["primary"]
        rows, options = _tuning_scores(directory, meta, primary)
    if not rows:
        raise UsageError(f"{directory}: no complete {stage} cell kept per-question records of its evaluations (cells "
                         "run before the harness recorded them): no crossed analysis")
    frame = pd.concat(rows, ignore_index=True)
    sizes = frame.groupby(["task", "variant", "seed"])["question"].size().groupby("task").nunique()
    if (sizes > 1).any():
        raise UsageError(f"{directory}: the cells of task {sizes[sizes > 1].index[0]} recorded different numbers of "
                         "questions: they did not evaluate the same set, so questions cannot be paired")
    frame.attrs.update({"primary": primary, "stage": stage, "directory": str(directory), "task_options": options})
    return frame


def _cell_frame(task: str, variant: str, seed, scores: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"task": task, "variant": variant, "seed": int(seed), "question": np.arange(len(scores)),
                         "score": scores})


def _evaluation_scores(directory: Path, data: dict, primary: str) -> tuple[list, dict]:
    cells, evals = data["cells"], data["evals"]
    if evals.empty or "questions" not in evals:
        return [], {}
    grids = completion_grids(cells, evals)
    specs = {c["dir"]: c for c in (data["meta"] or {}).get("cells", [])}
    if not specs:  # a store without its matrix.json: the specs it holds
        specs = {k: v["spec"] for k, v in ResultStore.read(directory).cells.items()}
    dirs = {(r.task, r.variant, r.seed): r.dir for r in cells.itertuples()}
    rows, options = [], {}
    for (task, variant, seed), frame in evals.groupby(["task", "variant", "seed"], sort=False):
        if task not in grids:
            continue
        if frame["questions"].isna().any():
            continue  # an evaluation without a record: the cell cannot be split by question
        scores = _contributions(frame, primary, grids[task][-1], dirs[(task, variant, seed)])
        if np.isnan(scores).all():
            continue  # fewer evaluations than the metric needs
        rows.append(_cell_frame(task, variant, seed, scores))
        _note_options(options, task, variant, specs.get(dirs[(task, variant, seed)]))
    return rows, options


def _contributions(frame: pd.DataFrame, primary: str, budget: float, cell: str) -> np.ndarray:
    try:
        return question_contributions(frame, primary, budget)[0]
    except ValueError as exc:  # a record another writer made: counts that do not decode
        raise UsageError(f"cell {cell}: its per-question records cannot be read ({exc})") from None


def _note_options(options: dict, task: str, variant: str, spec: Optional[dict]) -> None:
    """Keep the task options a cell evaluated with: ``population`` reads whether a variant's seeds share them."""
    text = json.dumps((spec or {}).get("task_options") or {}, sort_keys=True)
    options.setdefault(task, {}).setdefault(variant, set()).add(text)


def _tuning_scores(directory: Path, meta: dict, primary: str) -> tuple[list, dict]:
    """A tuning cell's evaluations as ``curve.accuracy_curve`` reads them: x the completions generated so far, the
    after-training one at the cell's ``completions_generated``."""
    store = ResultStore.read(directory) if directory.is_dir() else None
    if store is None:
        raise UsageError(f"no result store in {directory}")
    planned = (meta.get("tuning") or {}).get("cells") or []
    rows, options = [], {}
    for spec in planned:
        summary = store.summary(spec["dir"]) if store.holds(spec) else None
        if not summary or summary.get("status") != "complete":
            continue
        recorded = summary.get("eval_questions") or {}
        points, generated = [(0.0, recorded.get("before"))], 0.0
        for row in store.metrics(spec["dir"]):
            generated += row.get("completions", 0.0)
            if "eval/accuracy" in row:
                points.append((generated, row))
        points.append((float(summary.get("completions_generated", generated)), recorded.get("after")))
        if not all(isinstance((r or {}).get(QUESTIONS_CORRECT), str) for _, r in points):
            continue
        frame = pd.DataFrame({"samples": [x for x, _ in points], "questions": [r[QUESTIONS_CORRECT] for _, r in points],
                              "question_samples": [r[QUESTIONS_SAMPLES] for _, r in points]})
        scores = _contributions(frame, primary, float(spec["budget"]), spec["dir"])
        if np.isnan(scores).all():
            continue
        point = Path(spec["dir"]).parent.name
        rows.append(_cell_frame(spec["task_label"], f"{spec['variant']} {point}", spec["seed"], scores))
        _note_options(options, spec["task_label"], f"{spec['variant']} {point}", spec)
    return rows, options


def _frame(store_or_frame, primary: Optional[str]) -> pd.DataFrame:
    if isinstance(store_or_frame, pd.DataFrame):
        missing = set(SCORE_COLUMNS) - set(store_or_frame.columns)
        if missing:
            raise UsageError(f"a per-question frame needs the columns {', '.join(SCORE_COLUMNS)}; "
                             f"missing {', '.join(sorted(missing))}")
        if primary and store_or_frame.attrs.get("primary", primary) != primary:
            raise UsageError(f"the per-question frame holds {store_or_frame.attrs['primary']} scores, not {primary}")
        return store_or_frame
    return question_scores(store_or_frame, primary)


def _task_of(frame: pd.DataFrame, task: Optional[str]) -> str:
    tasks = list(dict.fromkeys(frame["task"]))
    if task is None:
        if len(tasks) != 1:
            raise UsageError(f"the store holds tasks {', '.join(tasks)}: name one")
        return tasks[0]
    if task not in tasks:
        raise UsageError(f"no task {task!r} in the per-question scores; they hold {', '.join(tasks)}")
    return task


def variant_tables(store_or_frame, primary: Optional[str] = None, *,
                   task: Optional[str] = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{variant: (its seeds in order, its (seeds x questions) scores)} of one task; a cell whose metric is
    undefined (too few evaluations) is left out."""
    frame = _frame(store_or_frame, primary)
    task = _task_of(frame, task)
    out = {}
    for variant, group in frame[frame["task"] == task].groupby("variant", sort=False):
        table = group.pivot(index="seed", columns="question", values="score").sort_index()
        table = table[table.notna().all(axis=1)]
        out[variant] = (table.index.to_numpy(), table.to_numpy(float))
    return out


def task_inputs(store_or_frame, primary: Optional[str] = None, *,
                task: Optional[str] = None) -> tuple[dict, dict]:
    """(scores, questions) of one task as a per-question procedure reads them (``inference.compare``): {variant:
    {seed: the cell's score, the mean over its questions}} and {variant: {seed: its per-question scores}}."""
    tables = variant_tables(store_or_frame, primary, task=task)
    scores = {v: {int(s): float(row.mean()) for s, row in zip(seeds, y)} for v, (seeds, y) in tables.items()}
    questions = {v: {int(s): row for s, row in zip(seeds, y)} for v, (seeds, y) in tables.items()}
    return scores, questions


# ------------------------------------------------------------------------------------------------
# The crossed random-effects model on a pair's differences
# ------------------------------------------------------------------------------------------------


def crossed_variance(d: np.ndarray) -> dict[str, np.ndarray]:
    """The variance of mean(d) under a new draw of seeds and questions, from ``d`` (..., S, Q) (a pair's paired
    differences, vectorised over leading axes; the module docstring's model and estimators). Returns arrays of
    shape (...): ``difference`` (the mean), ``variance`` and ``df`` (crossed: the seeds-only variance plus the
    question part, Satterthwaite's degrees of freedom), ``seed_part``
    (sigma2_seed / S), ``question_part`` (sigma2_question / Q), ``residual_part`` (sigma2_residual / (S Q)),
    ``sigma2_seed``, ``sigma2_question``, ``sigma2_residual``, and ``seeds_variance`` / ``seeds_df``, the seeds-only
    variance var_s(d_s.) / S with S - 1 degrees of freedom. NaN with fewer than 2 seeds or questions."""
    d = np.asarray(d, float)
    s, q = d.shape[-2:]
    if s < 2 or q < 2:
        nan = np.full(d.shape[:-2], math.nan)
        return {k: nan for k in ("difference", "variance", "df", "seed_part", "question_part", "residual_part",
                                 "sigma2_seed", "sigma2_question", "sigma2_residual", "seeds_variance", "seeds_df")}
    ms_s, ms_q, ms_e = inference.crossed_mean_squares(d)
    variance, df = inference.crossed_from_mean_squares(ms_s, ms_q, ms_e, s, q)
    kept = ms_q > ms_e
    sigma2_seed = np.maximum(ms_s - ms_e, 0.0) / q
    sigma2_question = np.where(kept, ms_q - ms_e, 0.0) / s
    return {"difference": d.mean((-2, -1)), "variance": variance, "df": df,
            "seed_part": sigma2_seed / s, "question_part": sigma2_question / q, "residual_part": ms_e / (s * q),
            "sigma2_seed": sigma2_seed, "sigma2_question": sigma2_question, "sigma2_residual": ms_e,
            "seeds_variance": ms_s / (s * q), "seeds_df": np.full(ms_s.shape, s - 1.0)}


def half_width(variance, df, confidence: float = CONFIDENCE) -> np.ndarray:
    """The two-sided ``confidence`` t half-width t_{df} sqrt(variance) of one pair's difference (no family
    adjustment: the verdict procedure brings its own critical value)."""
    variance, df = np.asarray(variance, float), np.asarray(df, float)
    ok = np.isfinite(df) & (df > 0)
    quantile = st.t.ppf(0.5 + confidence / 2, np.where(ok, df, 1.0))
    return np.where(ok, quantile * np.sqrt(np.maximum(variance, 0.0)), math.nan)


def pair_variance_crossed(store_or_frame, variant_i: str, variant_j: str, primary: Optional[str] = None, *,
                          task: Optional[str] = None) -> tuple[float, float, dict]:
    """(variance, df, parts) of variant_i's mean primary metric minus variant_j's over their shared seeds, under a
    new draw of seeds and questions. ``store_or_frame``: a matrix directory or ``question_scores``'s frame. ``parts``:
    ``crossed_variance``'s fields as floats, with ``seeds`` and ``questions`` (the table's sizes) and
    ``question_share`` (the question part over the seeds-only variance)."""
    tables = variant_tables(store_or_frame, primary, task=task)
    for name in (variant_i, variant_j):
        if name not in tables:
            raise UsageError(f"no variant {name!r} with per-question scores; there are {', '.join(tables)}")
    (seeds_i, y_i), (seeds_j, y_j) = tables[variant_i], tables[variant_j]
    shared = np.intersect1d(seeds_i, seeds_j)
    d = y_i[np.isin(seeds_i, shared)] - y_j[np.isin(seeds_j, shared)]
    parts = {k: float(v) for k, v in crossed_variance(d).items()}
    parts.update(seeds=len(shared), questions=d.shape[1], question_share=_share(parts))
    return parts["variance"], parts["df"], parts


def _share(parts: dict) -> float:
    return parts["question_part"] / parts["seeds_variance"] if parts["seeds_variance"] > 0 else math.nan


def pair_variances(store_or_frame, primary: Optional[str] = None, *, task: Optional[str] = None) -> pd.DataFrame:
    """Every pair (i < j in the store's variant order) of one task: one row with ``variant_i``, ``variant_j``,
    ``crossed_variance``'s fields, ``seeds``, ``questions``, ``question_share`` and both 95% half-widths
    (``half_width_seeds``, ``half_width_crossed``). Vectorised over the pairs when every variant has the same seeds
    (a matrix's blocks); otherwise each pair on its own shared seeds."""
    tables = variant_tables(store_or_frame, primary, task=task)
    variants = list(tables)
    pairs = [(i, j) for i in range(len(variants)) for j in range(i + 1, len(variants))]
    if not pairs:
        return pd.DataFrame()
    seeds = [tables[v][0] for v in variants]
    if all(np.array_equal(seeds[0], s) for s in seeds):
        y = np.stack([tables[v][1] for v in variants])  # (k, S, Q)
        index = np.array(pairs)
        fields = crossed_variance(y[index[:, 0]] - y[index[:, 1]])
        rows = pd.DataFrame(fields)
        rows["seeds"], rows["questions"] = y.shape[1], y.shape[2]
    else:
        rows = pd.DataFrame([pair_variance_crossed(store_or_frame, variants[i], variants[j], primary, task=task)[2]
                             for i, j in pairs])
    rows.insert(0, "variant_i", [variants[i] for i, _ in pairs])
    rows.insert(1, "variant_j", [variants[j] for _, j in pairs])
    rows["question_share"] = [_share(r) for r in rows.to_dict("records")]
    rows["half_width_seeds"] = half_width(rows["seeds_variance"], rows["seeds_df"])
    rows["half_width_crossed"] = half_width(rows["variance"], rows["df"])
    return rows


def pair_matrices(pairs: pd.DataFrame, variants: list[str], *,
                  crossed: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(variance, df), each (k, k) symmetric over ``variants`` (nan on the diagonal and for a pair not in
    ``pairs``), from ``pair_variances``'s rows: what a procedure that takes each pair's own (variance, df) reads.
    ``crossed`` False: the seeds-only counterparts."""
    k = len(variants)
    variance, df = np.full((k, k), math.nan), np.full((k, k), math.nan)
    where = {v: n for n, v in enumerate(variants)}
    v_col, df_col = ("variance", "df") if crossed else ("seeds_variance", "seeds_df")
    for r in pairs.itertuples():
        if r.variant_i in where and r.variant_j in where:
            i, j = where[r.variant_i], where[r.variant_j]
            variance[i, j] = variance[j, i] = getattr(r, v_col)
            df[i, j] = df[j, i] = getattr(r, df_col)
    return variance, df


# ------------------------------------------------------------------------------------------------
# Which population a mark speaks for
# ------------------------------------------------------------------------------------------------


def population(store_or_frame, *, crossed: bool, task: Optional[str] = None) -> str:
    """The population a mark speaks for, as one phrase for the report's line.

    Every cell of a task evaluates the same questions when the cells' task options agree: a task's evaluation set
    follows from its options alone (a task is built from them, never from the run's seed; addition's held-out
    problems from ``problem_seed``, Reasoning Gym's from ``data_seed``, GSM8K's are the first N of a split). Then the
    seeds-only analysis speaks for "these N questions, new seeds" and the crossed one for a new draw of both.
    Where the options differ between a variant's seeds (a toy task whose problem draw follows the seed, e.g.
    addition with ``problem_seed`` set to each seed), each seed evaluates its own draw of questions: the seed-to-seed
    spread already holds the question draw, so the seeds-only analysis speaks for a new draw of both."""
    frame = store_or_frame if isinstance(store_or_frame, pd.DataFrame) else question_scores(store_or_frame)
    task = _task_of(frame, task)
    n = int(frame[frame["task"] == task].groupby(["variant", "seed"])["question"].size().max())
    options = (frame.attrs.get("task_options") or {}).get(task) or {}
    if any(len(seen) > 1 for seen in options.values()):
        return (f"{NEW_DRAW} (each seed evaluates its own draw of {n} questions, so the seed-to-seed spread already "
                "holds the question draw: the seeds-only analysis covers it)")
    if crossed:
        return f"{NEW_DRAW} (the {n} evaluation questions taken as a sample of the task's)"
    return f"these {n} questions, new seeds"
