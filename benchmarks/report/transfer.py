"""Does one matrix's ranking of the algorithms carry over to another's? ``compare``, what ``grpo-bench brief`` reads
for each pair of skills and for a toy matrix against each skill.

Two matrices rank algorithms on different tasks (the toy addition task, a real LM on Reasoning Gym). For the
algorithms both ran (``pairs``: the first's variant name and the second's, which may differ, e.g. a tuned variant on
the toy), ``compare`` puts side by side each matrix's mean of its own primary metric (what its verdicts rank by:
benchmarks/report/curves.py's per-cell ``primary``) with a 95% interval, its mark against that matrix's best, and the
two rankings of the common algorithms, and measures their agreement with Kendall's tau-b (scipy), whose p-value tests
"no association". With a handful of algorithms that test has little power (with 6 only a near-perfect agreement
reaches p < 0.05): ``tau_needed`` is the smallest tau that would.

Tau's interval is a bootstrap over both matrices' seed noise (``resampled_means``): each resample draws each
matrix's seeds with replacement, recomputes every variant's mean and tau-b; the table's intervals are the same
resamples' percentiles. A matrix is blocked by seed (every variant ran the same seeds, which share their random
numbers, and the verdicts pair the cells by seed), so one draw of seed indices serves every variant of that matrix.

Like for like: per pairing, the algorithm settings the two matrices' cells ran with (matrix.json's resolved
``settings``) that differ, and the precision they ran at. Which keys are algorithm settings is the algorithm
registry's (passed in by benchmarks/commands.py: the report does not import ``algorithms``), less learning_rate and
the keys the matrices' [tuning] grids varied for the variant, which are expected to differ.

It reads the two result stores and matrix.json files only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from benchmarks.errors import UsageError
from benchmarks.report.matrix import analyse, collect
from benchmarks.report.stats import REPS, SEED

ALWAYS_EXCLUDED = "learning_rate"  # each matrix sets or tunes its own, for its task and model
NOT_RECORDED = "not recorded"


def read_matrix(directory: Path) -> dict:
    """A matrix directory as its report reads it (benchmarks/report/matrix.py's ``collect`` and ``analyse``): its
    plan (``meta``), its cells, each cell's primary metric (``curves["cells"]["primary"]``) and its verdicts."""
    return analyse(collect(directory))


def _ranking_task(verdicts: pd.DataFrame, directory: Path) -> pd.DataFrame:
    tasks = sorted(set(verdicts["task"])) if "task" in verdicts else []
    if len(tasks) != 1:
        raise UsageError(f"{directory}: a ranking compares one task per matrix, found {', '.join(tasks) or 'none'}")
    return verdicts.set_index("variant")


def smallest_significant_tau(n: int, alpha: float = 0.05) -> Optional[float]:
    """The smallest tau > 0 that Kendall's exact test (two-sided) calls at ``alpha`` with ``n`` untied items
    (None: none can): tau = 1 - 2 d / C(n, 2) for d discordant pairs, tried from the most d down."""
    from scipy.stats import kendalltau

    pairs = n * (n - 1) // 2
    for discordant in range(pairs // 2, -1, -1):
        left, code = discordant, []
        for i in range(n):  # a Lehmer code with ``discordant`` inversions, greedily
            code.append(min(left, n - 1 - i))
            left -= code[-1]
        remaining = list(range(n))
        order = [remaining.pop(c) for c in code]
        result = kendalltau(range(n), order, method="exact")
        if result.statistic > 0 and result.pvalue < alpha:
            return float(result.statistic)
    return None


def primary_scores(per_cell: pd.DataFrame, variants: Sequence[str], directory: Path) -> dict[str, dict[int, float]]:
    """{variant: {seed: its cell's primary metric}} for ``variants``, the cells with a value (a curve with fewer
    evaluations than the metric needs has none)."""
    scores = {}
    for variant in variants:
        mine = per_cell[per_cell["variant"] == variant].sort_values("seed")
        scores[variant] = {int(s): float(x) for s, x in zip(mine["seed"], mine["primary"]) if np.isfinite(x)}
        if not scores[variant]:
            raise UsageError(f"{directory}: {variant} has no cell with a value of the primary metric")
    return scores


def resampled_means(scores: Mapping[str, Mapping[int, float]], rng: np.random.Generator,
                    reps: int) -> tuple[np.ndarray, bool]:
    """Each variant's mean over ``reps`` resamples of its seeds, (reps, variants) in ``scores``' order, and whether
    the seeds were resampled as blocks: when every variant has the same seeds, each resample draws one set of seed
    indices and applies it to every variant (a seed's cells share its random numbers, and the verdicts pair them);
    otherwise each variant's seeds are resampled on their own."""
    seeds = [sorted(by_seed) for by_seed in scores.values()]
    if all(s == seeds[0] for s in seeds):
        y = np.array([[by_seed[s] for s in seeds[0]] for by_seed in scores.values()])  # (variants, seeds)
        index = rng.integers(0, y.shape[1], size=(reps, y.shape[1]))
        return y[:, index].mean(-1).T, True
    columns = []
    for by_seed in scores.values():
        values = np.array([by_seed[s] for s in sorted(by_seed)])
        columns.append(values[rng.integers(0, len(values), size=(reps, len(values)))].mean(-1))
    return np.column_stack(columns), False


def tau_interval(toy: Mapping[str, Mapping[int, float]], real: Mapping[str, Mapping[int, float]], *,
                 reps: int = REPS, seed: int = SEED) -> dict:
    """Kendall's tau-b of the toy's and the real matrix's variant means (``toy`` and ``real`` in the pairs' order)
    in ``reps`` seeded resamples of both matrices' seeds (``resampled_means``): its 95% percentile interval
    (``low``, ``high``: values tau can take), each matrix's resampled means and whether it was resampled in blocks.
    ``undefined``: resamples where one side's means all tie (no tau), left out."""
    from scipy.stats import kendalltau

    rng = np.random.default_rng(seed)
    toy_means, toy_blocked = resampled_means(toy, rng, reps)
    real_means, real_blocked = resampled_means(real, rng, reps)
    taus = np.array([kendalltau(x, y).statistic for x, y in zip(toy_means, real_means)])
    taus = taus[np.isfinite(taus)]
    low, high = ((float(np.percentile(taus, 2.5, method="lower")), float(np.percentile(taus, 97.5, method="higher")))
                 if len(taus) else (np.nan, np.nan))
    return {"low": low, "high": high, "reps": reps, "seed": seed, "undefined": reps - len(taus),
            "toy_means": toy_means, "real_means": real_means, "toy_blocked": toy_blocked, "real_blocked": real_blocked}


def ran_with(data: dict, variant: str) -> dict:
    """What a variant's cells ran with: its algorithm, its first planned cell's resolved settings (the cells of a
    variant differ in the seed alone), the precision its complete cells recorded, and the settings the matrix's
    [tuning] grid varied for it (the algo_options that differ among its tuning cells)."""
    planned = [c for c in (data.get("meta") or {}).get("cells", []) if c.get("variant") == variant]
    first = planned[0] if planned else {}
    cells = data.get("cells", pd.DataFrame())
    mine = cells[(cells["variant"] == variant) & (cells["status"] == "complete")] if "status" in cells else cells.iloc[:0]
    precision = sorted(mine["precision"].dropna().astype(str).unique()) if "precision" in mine else []
    grid: dict[str, set] = {}
    for cell in ((data.get("meta") or {}).get("tuning") or {}).get("cells", []):
        if cell.get("variant") == variant:
            for key, value in (cell.get("algo_options") or {}).items():
                grid.setdefault(key, set()).add(repr(value))
    return {"algo": first.get("algo"), "settings": first.get("settings") or {},
            "precision": "/".join(precision) or NOT_RECORDED, "tuned": {k for k, v in grid.items() if len(v) > 1}}


_ABSENT = object()  # a setting a cell's recorded settings lack


def _shown(value) -> str:
    return NOT_RECORDED if value is _ABSENT else str(value)


def setting_differences(toy: dict, real: dict, fields: Mapping[str, Sequence[str]], excluded: set[str]) -> list[str]:
    """The algorithm settings (``fields``: each algorithm's setting names) and the precision in which two variants'
    cells (``ran_with``) differ, each "key toy vs real", leaving out ``excluded``; a setting one side did
    not record (an older run) reads "not recorded" there."""
    out = [] if toy["algo"] == real["algo"] else [f"algo {toy['algo']} vs {real['algo']}"]
    out += [f"{algo}: not in the algorithm registry, its settings not compared"
            for algo in dict.fromkeys((toy["algo"], real["algo"])) if algo not in fields]
    keys = set(fields.get(toy["algo"], ())) | set(fields.get(real["algo"], ()))
    for key in sorted(keys - excluded):
        a, b = toy["settings"].get(key, _ABSENT), real["settings"].get(key, _ABSENT)
        if a != b:
            out.append(f"{key} {_shown(a)} vs {_shown(b)}")
    if toy["precision"] != real["precision"]:
        out.append(f"precision {toy['precision']} vs {real['precision']}")
    return out


def compare(toy_data: dict, real_data: dict, toy: Path, real: Path, pairs: Sequence[tuple[str, str]],
            algorithm_settings: Mapping[str, Sequence[str]], *, reps: int = REPS, seed: int = SEED) -> dict:
    """Per common algorithm: both matrices' mean primary metric with its interval, mark and rank, and the algorithm
    settings that differ; Kendall's tau-b of the two rankings with its p-value and a bootstrap interval over both
    matrices' seeds. ``toy_data`` and ``real_data``: the matrices as ``read_matrix`` gives them, ``toy`` and ``real``
    their folders; ``algorithm_settings``: each algorithm's setting names (the registry's configs)."""
    from scipy.stats import kendalltau

    toy_verdicts, real_verdicts = (_ranking_task(d["analysis"]["tasks"], p) for d, p in ((toy_data, toy), (real_data, real)))
    missing = [f"{toy}: {a}" for a, _ in pairs if a not in toy_verdicts.index]
    missing += [f"{real}: {b}" for _, b in pairs if b not in real_verdicts.index]
    if missing:
        raise UsageError(f"no finished cells for {missing[0]}")
    toy_scores = primary_scores(toy_data["curves"]["cells"], [a for a, _ in pairs], toy)
    real_scores = primary_scores(real_data["curves"]["cells"], [b for _, b in pairs], real)
    boot = tau_interval(toy_scores, real_scores, reps=reps, seed=seed)
    toy_task, real_task = str(toy_verdicts["task"].iloc[0]), str(real_verdicts["task"].iloc[0])
    rows, tuned_keys = [], {}
    for i, (toy_name, real_name) in enumerate(pairs):
        a, b = toy_verdicts.loc[toy_name], real_verdicts.loc[real_name]
        sides = ran_with(toy_data, toy_name), ran_with(real_data, real_name)
        for task, side in zip((toy_task, real_task), sides):
            for key in side["tuned"] - {ALWAYS_EXCLUDED}:
                tuned_keys.setdefault(key, []).append(f"{real_name} on {task}")
        excluded = {ALWAYS_EXCLUDED} | sides[0]["tuned"] | sides[1]["tuned"]
        row = {"algorithm": real_name, "toy_variant": toy_name,
               "differs": setting_differences(*sides, algorithm_settings, excluded)}
        for side, name, verdict, scores, means in (("toy", toy_name, a, toy_scores, boot["toy_means"]),
                                                   ("real", real_name, b, real_scores, boot["real_means"])):
            row.update({f"{side}_seeds": len(scores[name]), f"{side}_mean": float(np.mean(list(scores[name].values()))),
                        f"{side}_low": float(np.percentile(means[:, i], 2.5)),
                        f"{side}_high": float(np.percentile(means[:, i], 97.5)),
                        f"{side}_mark": verdict["mark"], f"{side}_in_set": bool(verdict["in_best_set"])})
        rows.append(row)
    table = pd.DataFrame(rows)
    table["toy_rank"] = table["toy_mean"].rank(ascending=False, method="min").astype(int)
    table["real_rank"] = table["real_mean"].rank(ascending=False, method="min").astype(int)
    tau = kendalltau(table["toy_mean"], table["real_mean"])
    return {"toy": str(toy), "real": str(real), "toy_task": toy_task, "real_task": real_task,
            "toy_primary": toy_data["analysis"]["spec"]["primary"], "real_primary": real_data["analysis"]["spec"]["primary"],
            "table": table.sort_values("real_rank"), "tau": float(tau.statistic), "p_value": float(tau.pvalue),
            "n": len(table), "tau_needed": smallest_significant_tau(len(table)),
            "tau_low": boot["low"], "tau_high": boot["high"],
            "bootstrap": {k: boot[k] for k in ("reps", "seed", "undefined", "toy_blocked", "real_blocked")},
            "like_for_like": int((table["differs"].str.len() == 0).sum()), "tuned_keys": tuned_keys}

