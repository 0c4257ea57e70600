"""``grpo-bench calibration DIR [DIR ...] [--aa AA_DIR] --out OUT``: the verdict procedure's error rates, as
committed numbers.

The claim to check: all the marks of a task (benchmarks/report/inference.py) hold together with probability
>= 95%, i.e. the family-wise rate of false claims ("worse" by more than the truth, "best" or "equivalent" when not,
the best left out of the could-be-best set) is <= 5%. Three measurements:

  * simulated, at each given matrix's own design: its variants, seeds and each variant's observed seed-to-seed sd
    (on its primary metric), Gaussian noise; under the global null (every variant equal) and partial nulls (the top
    2, 3 and 6 equal, the rest spaced a pooled sd apart below); the share of simulated matrices with any false claim
    and with any interval missing its truth;
  * measured A/A on real replicates (``--aa``): a matrix of one variant on many independent seeds (e.g.
    benchmarks/matrices/calibration_aa.toml, 60 cells). Its cells are partitioned at random into null matrices of a
    verdict matrix's shape (every cell once per matrix) and the procedure is applied to each; the share with any
    false claim is the family-wise rate under the real distribution of the primary metric (its tails, its skew near
    the ceiling), which the Gaussian simulation assumes away. The partitions share cells, so their count is not the
    evidence: the interval comes from a bootstrap over the cells (resample the cells, partition again);
  * the declared A/A pairs of the given matrices (``equivalent`` groups, e.g. an independent replicate of a variant
    under a second name): how many the procedure separates;
  * simulated at a matrix file's planned design (``--plans FILE``), before its cells run: its variants and
    evaluation seeds, the spread of the sds, heavy tails and ties varied (no sd is known yet, and the procedure
    is scale-free);
  * the claims' procedure (``--claims FILE``: a matrix file stating ``[[analysis.claims]]``, parsed by the command
    line, judged by
    ``inference.contrasts``): simulated at the file's own design (its claim variants, seeds and contrasts) under the
    global null with equal and unequal spreads, and on the real A/A cells cut into null matrices with the same
    variants and contrasts (as many seeds as the cells allow);
  * crossed-v4, the offered procedure whose marks speak for the task's questions rather than the Q drawn
    (``crossed_measurements``): simulated at each given store's design that keeps per-question records, its seed,
    question and residual parts as the store estimates them, beside the current procedure judged against the same
    skill-level truth; and on an A/A store's per-question cells cut into null matrices. ``python -m
    benchmarks.report.calibration_report DIR ... --aa AA_DIR`` rewrites its section of OUT/report.md alone.

It reads the result stores and matrix.json files it is given; the study (benchmarks/commands.py) writes OUT/report.md
and OUT/calibration.json.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import pandas as pd

from benchmarks.errors import UsageError
from benchmarks.markdown import marked_section, markdown_table
from benchmarks.report import crossed, inference, stats
from benchmarks.report.curves import build
from benchmarks.report.matrix import analyse, collect
from benchmarks.report.verdicts import analysis_spec

PARTIAL_NULLS = (2, 3, 6)
AA_SHAPES = ((15, 4), (6, 3), (4, 5), (8, 3))  # (variants, seeds) of the null matrices cut from the A/A cells; 8 x 3:
# the real-LM verdicts' 8 variants at the seeds a small real-LM A/A allows


def _primary_cells(directory: Path | str) -> tuple[str, dict, pd.DataFrame]:
    """(matrix name, its stated analysis, per complete cell: task, variant, seed, primary)."""
    data = collect(Path(directory))
    spec = analysis_spec(data["meta"])
    cells = data["cells"][data["cells"]["status"] == "complete"]
    per_cell = build(cells, data["evals"], spec["primary"]).get("cells", pd.DataFrame())
    name = data["meta"].get("name") or Path(directory).name
    return name, spec, per_cell


def matrix_designs(directories: Sequence[Path | str]) -> list[dict]:
    """Per (matrix, task): the design the simulation reproduces -- variants, seeds each (the complete blocks),
    each variant's observed sd -- and the fitted procedure's numbers."""
    designs = []
    for directory in directories:
        name, spec, per_cell = _primary_cells(directory)
        for task, frame in per_cell.groupby("task", sort=False):
            scores = {v: dict(zip(g["seed"].astype(int), g["primary"])) for v, g in frame.groupby("variant", sort=False)}
            fit = inference.fit({v: s for v, s in scores.items() if len(s) >= 3})
            if fit is None or fit.sd == 0:
                continue
            designs.append({"matrix": name, "dir": str(directory), "task": task, "primary": spec["primary"],
                            "k": len(fit.variants), "n": int(np.median(fit.n)), "sds": fit.sds.tolist(), "sd": fit.sd,
                            "c": fit.c, "model": fit.model})
    return designs


def _design_scenarios(d: dict) -> list[tuple[str, inference.Design]]:
    """A committed design's scenarios: the global null and the partial nulls, at its variants' own sds."""
    k, n, sds = d["k"], d["n"], np.asarray(d["sds"])
    means = [("global null", None)] + [(f"top {m} equal, the rest {d['sd']:.3f} apart below",
                                        inference.partial_null(k, m, d["sd"])) for m in PARTIAL_NULLS if m < k]
    return [(label, inference.Design(k, n, sds=sds, means=m)) for label, m in means]


def simulated(designs: list[dict], *, sims: int = 2000, reps: int = 1000, tick: Callable[[], None] = lambda: None
              ) -> pd.DataFrame:
    """Per design and scenario: the family-wise rates of ``inference.family_error``; ``tick`` after each."""
    rows = []
    for d in designs:
        for label, design in _design_scenarios(d):
            rates = inference.family_error(design, sims=sims, reps=reps)
            rows.append({"matrix": d["matrix"], "task": d["task"], "variants": d["k"], "seeds": d["n"],
                         "scenario": label, **rates})
            tick()
    return pd.DataFrame(rows)


def _null_matrices(values: np.ndarray, k: int, n: int, draws: int, rng: np.random.Generator) -> np.ndarray:
    """``draws`` null matrices (draws, k, n), each a random assignment of k * n distinct cells of ``values``."""
    picks = np.argsort(rng.random((draws, len(values))), axis=1)[:, : k * n]
    return values[picks].reshape(draws, k, n)


def real_aa(directory: Path | str, *, shapes: Sequence[tuple[int, int]] = AA_SHAPES, draws: int = 1000,
            outer: int = 100, inner: int = 100, reps: int = 1000, seed: int = 0,
            tick: Callable[[], None] = lambda: None) -> tuple[dict, pd.DataFrame]:
    """The A/A matrix's primary metric per cell, and per null-matrix shape: the family-wise rate of false claims
    over ``draws`` random partitions, its 95% interval from ``outer`` bootstrap resamples of the cells (``inner``
    partitions each), and for contrast the rate of Tukey's critical value with the pooled sd on the same draws;
    ``tick`` after each shape."""
    name, spec, per_cell = _primary_cells(directory)
    variants = sorted(set(per_cell["variant"])) if not per_cell.empty else []
    if len(variants) != 1:
        raise ValueError(f"{directory}: an A/A matrix runs one variant, found {len(variants)}: {', '.join(variants)}")
    values = per_cell["primary"].to_numpy(float)
    values = values[np.isfinite(values)]
    rng = np.random.default_rng(seed)
    rows = []
    for k, n in shapes:
        tick()
        if k * n > len(values):
            continue
        y = _null_matrices(values, k, n, draws, rng)
        low, high = inference.procedure(y, blocked=False, reps=reps, seed=seed + 11)
        rate = inference.error_rates(low, high, np.zeros(k), spec.get("margin"))
        ss = ((y - y.mean(-1, keepdims=True)) ** 2).sum(-1)
        sd = np.sqrt(ss.sum(-1) / (k * (n - 1)))
        tl, th = inference.intervals(y.mean(-1), inference.pooled_half_widths(np.full(k, n), sd,
                                                                              inference.tukey_value(k, k * (n - 1))))
        boot = []
        for b in range(outer):
            resampled = values[rng.integers(0, len(values), len(values))]
            yb = _null_matrices(resampled, k, n, inner, rng)
            lb, hb = inference.procedure(yb, blocked=False, reps=reps // 2, seed=seed + 13 + b)
            boot.append(inference.error_rates(lb, hb, np.zeros(k), spec.get("margin"))["false_claim"])
        rows.append({"variants": k, "seeds": n, "draws": draws, "false_claim": rate["false_claim"],
                     "low": float(np.quantile(boot, 0.025)), "high": float(np.quantile(boot, 0.975)),
                     "false_equivalent": rate["false_equivalent"],
                     "tukey_pooled": inference.error_rates(tl, th, np.zeros(k), None)["false_claim"]})
    skew = float(pd.Series(values).skew()) if len(values) > 2 else math.nan
    kurt = float(pd.Series(values).kurt()) if len(values) > 3 else math.nan
    summary = {"matrix": name, "dir": str(directory), "variant": variants[0], "primary": spec["primary"],
               "margin": spec.get("margin"), "cells": int(len(values)), "mean": float(np.mean(values)),
               "sd": float(np.std(values, ddof=1)), "skewness": skew, "excess_kurtosis": kurt,
               "min": float(np.min(values)), "max": float(np.max(values))}
    return summary, pd.DataFrame(rows)


CLAIM_SPREADS = (0.0, 0.5, 1.0)  # log-sd spreads of the variants' sds in the claims' simulations
CLAIM_PATTERNS = 4  # the variants' sds drawn this many times at each unequal spread
PLAN_TAIL_DF = 4.0  # heavy-tailed noise (Student t) in a planned design's scenarios
PLAN_WIDE = 5.0  # one variant's sd against the others' in a planned design's scenarios (a variant that collapses on some seeds)


def plan_designs(plan) -> list[dict]:
    """A matrix file's planned design per task, before any cell runs, from its parsed plan (``benchmarks.matrix.parse``,
    which the command line calls): its variants and each one's evaluation seeds (a tuned matrix's, from its first
    grid point's cells), the median if they differ."""
    cells = plan.cells or [c for group in plan.tuning for c in group.candidates[0]]
    seeds: dict[str, dict[str, set]] = {}
    for c in cells:
        seeds.setdefault(c.task_label, {}).setdefault(c.variant, set()).add(c.seed)
    return [{"file": str(plan.path), "name": plan.name, "task": task, "k": len(variants),
             "n": int(np.median([len(s) for s in variants.values()]))}
            for task, variants in seeds.items() if len(variants) >= 2]


def _plan_scenarios(design: dict) -> list[tuple[str, inference.Design]]:
    """A planned design's scenarios: where no sd is known yet the scale drops out of the procedure, so they vary what
    does not -- the spread of the variants' sds (each simulated matrix draws its own, or one variant collapses on
    some seeds and spreads ``PLAN_WIDE`` times the others), heavy tails, and how many variants tie for best."""
    k, n = design["k"], design["n"]
    scenarios = [("global null, equal sds", inference.Design(k, n))]
    scenarios += [(f"global null, unequal sds (log-sd spread {spread:g})", inference.Design(k, n, unequal_sd=spread))
                  for spread in CLAIM_SPREADS if spread]
    wide = np.ones(k)
    wide[0] = PLAN_WIDE
    scenarios.append((f"global null, one variant's sd {PLAN_WIDE:g}x the others'", inference.Design(k, n, sds=wide)))
    scenarios.append((f"global null, t noise ({PLAN_TAIL_DF:g} df)", inference.Design(k, n, tail_df=PLAN_TAIL_DF)))
    scenarios += [(f"top {m} equal, the rest 1 sd apart below", inference.Design(k, n, means=inference.partial_null(k, m, 1.0)))
                  for m in PARTIAL_NULLS if m < k]
    return scenarios


def plan_simulated(design: dict, *, sims: int = 2000, reps: int = 1000, tick: Callable[[], None] = lambda: None
                   ) -> pd.DataFrame:
    """A planned design's family-wise rates (``inference.family_error``, blocked by seed as its cells will be), one
    row per scenario of ``_plan_scenarios``; ``tick`` after each."""
    rows = []
    for label, d in _plan_scenarios(design):
        rates = inference.family_error(d, sims=sims, reps=reps)
        rows.append({"matrix": design["name"], "task": design["task"], "variants": design["k"], "seeds": design["n"],
                     "scenario": label, **rates})
        tick()
    return pd.DataFrame(rows)


def claims_design(plan) -> dict:
    """A claims matrix's design, from its parsed plan (``benchmarks.matrix.parse``, which the command line calls: the
    report reads run data, not matrix files): the variants its claims name, its seeds, the contrasts (index pairs)."""
    path = plan.path
    claims = plan.analysis.claims if plan.analysis else ()
    if not claims:
        raise ValueError(f"{path}: states no claims ([[analysis.claims]])")
    names = list(dict.fromkeys(v for c in claims for v in (c.treatment, c.control)))
    pairs = [(names.index(c.treatment), names.index(c.control)) for c in claims]
    cells = plan.cells or [c for group in plan.tuning for c in group.candidates[0]]  # a tuned matrix's evaluation seeds
    seeds = len({c.seed for c in cells})
    return {"file": str(path), "name": plan.name, "variants": names, "k": len(names), "n": seeds, "pairs": pairs,
            "margin": plan.analysis.margin}


def claims_simulated(design: dict, *, sims: int = 2000, reps: int = 1000, seed: int = 3,
                     patterns: int = CLAIM_PATTERNS, tick: Callable[[], None] = lambda: None) -> pd.DataFrame:
    """The claims' family-wise rates under the global null at the design: equal sds, and ``patterns`` draws of the
    variants' sds at each unequal spread (which variants of which contrasts get the wide sds moves the rate, so one
    draw is not the spread); ``tick`` after each. Each spread's first pattern is the one drawn before there were
    several (the same generator, in the same order)."""
    rng = np.random.default_rng(seed)
    first = {spread: np.exp(rng.normal(0.0, spread, design["k"])) for spread in CLAIM_SPREADS if spread}
    more = np.random.default_rng(seed + 104729)  # the further patterns: their own generator
    cases = [(0.0, 0, np.ones(design["k"]))]
    for spread in first:
        cases += [(spread, j, first[spread] if j == 0 else np.exp(more.normal(0.0, spread, design["k"])))
                  for j in range(patterns)]
    rows = []
    for spread, j, sds in cases:
        rates = inference.contrast_error(design["k"], design["n"], design["pairs"], sds=sds, block_sd=0.5,
                                         margin=None, sims=sims, reps=reps, seed=seed + int(10 * spread) + 1000 * j)
        label = "global null, equal sds" if not spread else (
            f"global null, log-sd spread {spread:g}" + (f", sd pattern {j + 1} of {patterns}" if patterns > 1 else "")
            + f" (largest/smallest sd {sds.max() / sds.min():.1f})")
        rows.append({"matrix": design["name"], "variants": design["k"], "seeds": design["n"],
                     "claims": len(design["pairs"]), "scenario": label, **rates})
        tick()
    return pd.DataFrame(rows)


def claims_real_aa(design: dict, directory: Path | str, *, draws: int = 1000, outer: int = 100, inner: int = 100,
                   reps: int = 1000, seed: int = 0) -> dict:
    """The A/A cells cut into null matrices of the claims' variants (as many seeds each as the cells allow, one-way:
    the cells share no seed) judged by the claims' procedure: the rate of any false mark, with a bootstrap interval
    over the cells."""
    _, _, per_cell = _primary_cells(directory)
    values = per_cell["primary"].to_numpy(float)
    values = values[np.isfinite(values)]
    k = design["k"]
    n = min(design["n"], len(values) // k)
    if n < 2:
        return {"variants": k, "seeds": n, "draws": 0}
    rng = np.random.default_rng(seed)
    truth = np.zeros(len(design["pairs"]))
    y = _null_matrices(values, k, n, draws, rng)
    low, high = inference.contrast_procedure(y, design["pairs"], blocked=False, reps=reps, seed=seed + 17)
    rate = inference.contrast_rates(low, high, truth, design["margin"])
    boot = []
    for b in range(outer):
        resampled = values[rng.integers(0, len(values), len(values))]
        lb, hb = inference.contrast_procedure(_null_matrices(resampled, k, n, inner, rng), design["pairs"],
                                              blocked=False, reps=reps // 2, seed=seed + 19 + b)
        boot.append(inference.contrast_rates(lb, hb, truth, design["margin"])["false_claim"])
    return {"variants": k, "seeds": n, "draws": draws, "false_claim": rate["false_claim"],
            "low": float(np.quantile(boot, 0.025)), "high": float(np.quantile(boot, 0.975))}


def declared_pairs(directories: Sequence[Path | str]) -> pd.DataFrame:
    """Every declared-equivalent pair of the given matrices, on every task, judged by the verdicts' procedure."""
    frames = []
    for directory in directories:
        aa = analyse(collect(Path(directory)))["analysis"].get("aa", pd.DataFrame())
        if aa is not None and not aa.empty:
            frames.append(aa.assign(matrix=Path(directory).name))
    columns = ["matrix", "task", "a", "b", "diff", "half_width", "separated"]
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)


def render(sim: pd.DataFrame, aa: Sequence[tuple[dict, pd.DataFrame]], pairs: pd.DataFrame, command: str,
           claims: Sequence[tuple[dict, pd.DataFrame, Optional[dict]]] = (),
           planned: Optional[pd.DataFrame] = None) -> str:
    """The report below its title: the headline of every measurement, then a section each (simulated, planned
    designs, real A/A, declared pairs, and each claims matrix)."""
    planned = pd.DataFrame() if planned is None else planned
    lines = [f"**The verdict procedure (benchmarks/report/inference.py, 95% simultaneous): "
             + "; ".join(_headline(sim, aa, pairs, claims, planned)) + ".**", "",
             f"Written by `{command}`.", ""]
    lines += _simulated_section(sim)
    lines += _planned_section(planned)
    lines += _real_aa_section(aa)
    lines += _pairs_section(pairs)
    for design, rates, real in claims:
        lines += _claims_section(design, rates, real)
    return "\n".join(lines)


def _headline(sim: pd.DataFrame, aa: Sequence[tuple[dict, pd.DataFrame]], pairs: pd.DataFrame,
              claims: Sequence[tuple[dict, pd.DataFrame, Optional[dict]]], planned: pd.DataFrame) -> list[str]:
    """One clause per measurement: the worst simulated rate, at the planned designs too, the real A/A rates, the pairs
    separated, each claims matrix's rates."""
    worst = sim["false_claim"].max() if not sim.empty else math.nan
    head = [f"the simulated family-wise rate of false claims is at most {worst:.3f} over {len(sim)} scenarios at the "
            "committed matrices' designs" if not sim.empty else "no committed design simulated"]
    for (name, task), rows in (planned.groupby(["matrix", "task"], sort=False) if not planned.empty else ()):
        head.append(f"at `{name}`'s planned {rows['variants'].iloc[0]} x {rows['seeds'].iloc[0]} ({task}) at most "
                    f"{rows['false_claim'].max():.3f} over {len(rows)} scenarios")
    for summary, rates in aa:
        if not rates.empty:
            head.append(f"on real A/A replicates of `{summary['matrix']}` (" + "; ".join(
                f"{r.variants} x {r.seeds}: {r.false_claim:.3f} [{r.low:.3f}, {r.high:.3f}]" for r in rates.itertuples())
                + f", from {summary['cells']} cells)")
    if not pairs.empty:
        head.append(f"{int(pairs['separated'].sum())} of {len(pairs)} declared-equivalent pairs separated")
    for design, rates, real in claims:
        text = (f"the claims of `{design['name']}` (simulated at most {rates['false_claim'].max():.3f} over "
                f"{len(rates)} scenarios")
        if real and real.get("draws"):
            text += f"; real A/A {real['false_claim']:.3f} [{real['low']:.3f}, {real['high']:.3f}]"
        head.append(text + ")")
    return head


def _rates_table(sim: pd.DataFrame) -> str:
    """One row per design and scenario: its family-wise rates."""
    rows = [[r.matrix, r.task, f"{r.variants} x {r.seeds}", r.scenario, f"{r.false_claim:.3f}", f"{r.noncoverage:.3f}",
             f"{r.any_worse:.3f}", r.sims] for r in sim.itertuples()]
    return markdown_table(["matrix", "task", "design", "scenario", "false claim", "non-coverage", "any worse",
                           "simulated matrices"], rows)


def _simulated_section(sim: pd.DataFrame) -> list[str]:
    """The family-wise rates simulated at each matrix's design, per scenario."""
    if sim.empty:
        return []
    return ["## Simulated at the matrices' own designs", "",
            "Each committed matrix's variants, seeds and per-variant seed-to-seed sds (of its primary metric), "
            "Gaussian noise, the procedure applied as the report applies it (critical value calibrated per "
            "simulated matrix). *False claim*: any variant marked worse by more than its true gap, best or "
            "equivalent when it is not, or a best variant left out of the could-be-best set; *non-coverage*: "
            "any simultaneous interval missing its true gap; *any worse*: matrices with at least one variant "
            "marked worse (power, under the partial nulls). A controlled procedure reads <= 0.05 within "
            f"simulation error (+-{2 * math.sqrt(0.05 * 0.95 / max(int(sim['sims'].min()), 1)):.3f}).", "",
            _rates_table(sim), ""]


def _planned_section(planned: pd.DataFrame) -> list[str]:
    """The family-wise rates simulated at matrix files' planned designs, before their cells run."""
    if planned.empty:
        return []
    return ["## Simulated at planned designs, before their cells run", "",
            "A matrix file's variants and evaluation seeds, blocked by seed as its cells will be, with no sd known yet: "
            "the procedure is scale-free, so the scenarios vary what it is not -- each simulated matrix draws its "
            "variants' sds with the log-sd spread shown, the noise is Gaussian or Student t, and the top variants tie "
            "with the rest one sd apart below. The margin of equivalence is not simulated here (it is in sd units "
            "only once the sd is known); the matrix's own design, with its observed sds, is simulated above once its "
            "cells are in. Columns as above.", "",
            _rates_table(planned), ""]


def _real_aa_section(aa: Sequence[tuple[dict, pd.DataFrame]]) -> list[str]:
    """Each A/A matrix's cells described, and the rates of the null matrices cut from them."""
    lines = ["## Real A/A replicates", ""] if aa else []
    for summary, rates in aa:
        lines += _real_aa_lines(summary, rates)
    return lines


def _real_aa_lines(summary: dict, rates: pd.DataFrame) -> list[str]:
    """One A/A matrix: its cells described, and its null matrices' rates."""
    lines = [f"`{summary['matrix']}` ({summary['dir']}): `{summary['variant']}` on {summary['cells']} independent "
             f"seeds; primary metric {summary['primary']}: mean {summary['mean']:.4f}, sd {summary['sd']:.4f}, "
             f"range [{summary['min']:.4f}, {summary['max']:.4f}], skewness {summary['skewness']:+.2f}, excess "
             f"kurtosis {summary['excess_kurtosis']:+.2f}. Its cells, partitioned at random into null matrices "
             "(every cell at most once per matrix; the cells share no seed, so the one-way model), judged by the "
             "procedure; the interval is a bootstrap over the cells. *Tukey, pooled*: the textbook critical value "
             "on the same draws, for contrast.", ""]
    if rates.empty:
        return lines + ["Too few cells for any null-matrix shape yet.", ""]
    rows = [[f"{r.variants} x {r.seeds}", r.draws, f"{r.false_claim:.3f} [{r.low:.3f}, {r.high:.3f}]",
             f"{r.false_equivalent:.3f}", f"{r.tukey_pooled:.3f}"] for r in rates.itertuples()]
    return lines + [markdown_table(["null matrix", "partitions", "false claim [95% bootstrap]",
                                    "false equivalence", "Tukey, pooled"], rows), ""]


def _pairs_section(pairs: pd.DataFrame) -> list[str]:
    """Each declared-equivalent pair and whether the procedure separates it."""
    if pairs.empty:
        return []
    rows = [[r.matrix, r.task, f"`{r.a}`", f"`{r.b}`", f"{r.diff:+.4f}", f"+-{r.half_width:.4f}",
             "**yes**" if r.separated else "no"] for r in pairs.itertuples()]
    return ["## Declared A/A pairs", "",
            "Pairs of variants a matrix declares equivalent (`equivalent` in its matrix file: the same update, or "
            "an independent replicate of a variant under a second name), judged by the procedure's simultaneous "
            "interval of their difference. Rounding twins (bit-identical runs) cannot be separated and say little.",
            "", markdown_table(["matrix", "task", "A", "B", "mean(A) - mean(B)", "simultaneous interval",
                                "separated"], rows), ""]


def _claims_section(design: dict, rates: pd.DataFrame, real: Optional[dict]) -> list[str]:
    """One claims matrix: its claims' simulated rates, and the rate on the real A/A cells where measured."""
    rows = [[r.scenario, f"{r.variants} x {r.seeds}", r.claims, f"{r.false_claim:.3f}", f"{r.noncoverage:.3f}",
             r.sims] for r in rates.itertuples()]
    lines = [f"## The claims of `{design['name']}` ({design['file']})", "",
             f"Its {len(design['pairs'])} claims (a treatment against its control each) over {design['k']} "
             f"variants x {design['n']} seeds, judged as one family by `inference.contrasts` (blocked by seed, c "
             "calibrated for these contrasts). Simulated: Gaussian cells with a shared seed part, each variant's sd "
             "fixed within a scenario; at each unequal spread the sds are drawn several times (which variants, in "
             "which contrasts, get the wide sds moves the rate). *False claim*: any interval wholly above or below 0 for a null contrast.",
             "", markdown_table(["scenario", "design", "claims", "false claim", "non-coverage",
                                 "simulated matrices"], rows), ""]
    if real and real.get("draws"):
        lines += [f"On the real A/A cells: null matrices of the same {real['variants']} variants and contrasts at "
                  f"{real['seeds']} seeds each (all the cells allow; one-way, the cells share no seed): false claim "
                  f"{real['false_claim']:.3f} [{real['low']:.3f}, {real['high']:.3f}] over {real['draws']} "
                  "partitions (bootstrap interval over the cells).", ""]
    return lines


def calibration(directories: Sequence[Path | str], *, aa: Sequence[Path | str] = (), sims: int = 2000,
                claims: Sequence = (), plans: Sequence = (), progress: Optional[Callable[..., Any]] = None,
                claims_sims: Optional[int] = None) -> dict:
    """Every measurement of the report: the matrices' designs simulated, each parsed matrix file of ``plans`` at its
    planned design, each A/A matrix's cells (``aa``, directories) cut into null matrices, the declared pairs, and
    each parsed claims matrix of ``claims`` simulated (``claims_sims`` matrices a case, default ``sims``) and on the
    first A/A matrix's cells; and crossed-v4 at the stores' designs with per-question records and on the A/A
    stores' per-question cells (``crossed_measurements``). ``progress(total, desc=, unit=)``, the caller's (the
    report reads run data only), makes the object told of each case as it finishes (``update``, ``close``)."""
    designs = matrix_designs(directories)
    planned_designs = [d for plan in plans for d in plan_designs(plan)]
    claim_designs = [claims_design(plan) for plan in claims]  # parsed claims matrices
    cases = (sum(len(_design_scenarios(d)) for d in designs) + sum(len(_plan_scenarios(d)) for d in planned_designs)
             + len(AA_SHAPES) * len(aa)
             + len(claim_designs) * (1 + CLAIM_PATTERNS * (len(CLAIM_SPREADS) - 1) + bool(aa)))
    each = f"{sims} simulated matrices a case" + (f", {claims_sims} a claims case" if claims and claims_sims else "")
    bar = progress(cases, desc=f"calibration ({each})", unit="case") if progress else _Silent()
    sim = simulated(designs, sims=sims, tick=lambda: bar.update(1))
    planned = pd.concat([plan_simulated(d, sims=sims, tick=lambda: bar.update(1)) for d in planned_designs],
                        ignore_index=True) if planned_designs else pd.DataFrame()
    measured = [real_aa(d, tick=lambda: bar.update(1)) for d in aa]
    pairs = declared_pairs(directories)
    judged = []
    for design in claim_designs:
        rates = claims_simulated(design, sims=claims_sims or sims, tick=lambda: bar.update(1))
        real = claims_real_aa(design, aa[0]) if aa else None
        bar.update(bool(aa))
        judged.append((design, rates, real))
    bar.close()
    crossed_result = crossed_measurements(directories, aa, sims=sims, progress=progress)
    return {"designs": designs, "simulated": sim, "real_aa": measured, "declared_pairs": pairs, "claims": judged,
            "planned_designs": planned_designs, "planned": planned, "matrices": [str(d) for d in directories],
            "sims": sims, "claims_sims": claims_sims or sims, "crossed": crossed_result}


class _Silent:
    """No progress shown: ``update`` and ``close`` do nothing."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def render_calibration(result: dict, command: str) -> str:
    """``calibration``'s result rendered: the report below its title."""
    text = render(result["simulated"], result["real_aa"], result["declared_pairs"], command, result["claims"],
                  result.get("planned"))
    if result.get("crossed"):  # between its markers: ``main`` rewrites this section alone
        text = text.rstrip() + "\n\n" + marked_section(CROSSED_SECTION, crossed_section(result["crossed"], command))
    return text


def records(result: dict) -> dict:
    """``calibration``'s result as OUT/calibration.json keeps it."""
    return {"designs": result["designs"], "simulated": result["simulated"].to_dict(orient="records"),
            "real_aa": [{"summary": summary, "rates": rates.to_dict(orient="records")} for summary, rates in result["real_aa"]],
            "declared_pairs": result["declared_pairs"].to_dict(orient="records"), "matrices": result["matrices"],
            "claims": [{"design": d, "simulated": r.to_dict(orient="records"), "real_aa": a}
                       for d, r, a in result["claims"]],
            "planned": {"designs": result["planned_designs"], "simulated": result["planned"].to_dict(orient="records")},
            "sims": result["sims"], "claims_sims": result.get("claims_sims", result["sims"]), "alpha": inference.ALPHA,
            "seed": stats.SEED, **({"crossed": crossed_records(result["crossed"])} if result.get("crossed") else {})}


# ------------------------------------------------------------------------------------------------
# crossed-v4: claims about the skill, the questions sampled too
# ------------------------------------------------------------------------------------------------

CROSSED = "crossed-v4"
CROSSED_REPS = 1000  # simulated matrices behind each simulated matrix's c (its bootstrap and its floor): fewer
# err upward (a noisier c; measured at number_sequence's design, 2000 matrices: 0.056 with 1000, 0.0515 with 4000)
CROSSED_AA_REPS = 500  # the same on the A/A null matrices, whose rates sit far below 0.05
CROSSED_QUESTION_SCALE = 5.0  # the stress scenario: every question part's variance this many times the store's
CROSSED_AA_SHAPES = ((8, 3), (6, 4), (4, 6))  # null matrices cut from an A/A store's per-question cells (24 there)
CROSSED_SECTION = "crossed-v4"  # the report's section (markers): ``main`` rewrites it alone
CROSSED_JSON = "crossed.json"


def _split(pairs: np.ndarray) -> np.ndarray:
    """Per variant, the variance whose pairwise sums come closest to the pairs' (k, k) (``split_variance``)."""
    k = len(pairs)
    return inference.split_variance(np.where(np.eye(k, dtype=bool), 0.0, pairs))


def _covariance(pairs: np.ndarray) -> np.ndarray:
    """A covariance across variants whose pairs' variances S_ii + S_jj - 2 S_ij come closest to ``pairs`` (k, k):
    classical scaling, -J pairs J / 2 with J the centring matrix, its negative eigenvalues set to 0 (a pair's
    variance, unlike the additive split, need not be the sum of two variants' own)."""
    k = len(pairs)
    centre = np.eye(k) - 1.0 / k
    value, vector = np.linalg.eigh(-centre @ np.where(np.eye(k, dtype=bool), 0.0, pairs) @ centre / 2)
    return (vector * np.maximum(value, 0.0)) @ vector.T


def _misfit(covariance: np.ndarray, pairs: np.ndarray) -> float:
    """The median over pairs of |the covariance's pair variance - the pair's own|, over the pairs' mean."""
    i, j = np.triu_indices(len(pairs), 1)
    implied = covariance[i, i] + covariance[j, j] - 2 * covariance[i, j]
    return float(np.median(np.abs(implied - pairs[i, j])) / pairs[i, j].mean())


def crossed_designs(directories: Sequence[Path | str]) -> list[dict]:
    """Per (matrix, task) with per-question records and two or more variants on MIN_BLOCKS complete seeds: the
    design crossed-v4's simulation reproduces -- variants, seeds, questions, and per variant the sds of its own
    seed, question and residual parts (each pair's components, ``inference.crossed_parts``, split per variant),
    the sd of the question effect all variants share, and the question effects' covariance across variants that
    reproduces the pairs' question components without the split's additivity (``_covariance``, with its misfit)
    -- with the median over pairs of the question part over the
    seeds-only variance, and the stated margin."""
    designs = []
    for directory in directories:
        try:
            frame = crossed.question_scores(directory)
        except UsageError:  # no per-question records, or nothing to report yet
            continue
        margin = analysis_spec(collect(Path(directory))["meta"]).get("margin")
        for task in dict.fromkeys(frame["task"]):
            tables = crossed.variant_tables(frame, task=task)
            common = sorted(set.intersection(*(set(s.tolist()) for s, _ in tables.values())))
            if len(tables) < 2 or len(common) < inference.MIN_BLOCKS:
                continue
            y = np.stack([table[np.isin(seeds, common)] for seeds, table in tables.values()])  # (k, S, Q)
            t = inference.crossed_tables(y)
            components = inference.crossed_parts(t)
            seed_part, question_part, residual = (_split(x) for x in components)
            question_cov = _covariance(components[1])
            variance, _ = inference.crossed_pairs(t)
            ms_s = inference.pair_mean_squares(t)[0]
            i, j = np.triu_indices(len(y), 1)
            share = np.median((variance[i, j] - ms_s[i, j] / (t.seeds * t.questions))
                              / (ms_s[i, j] / (t.seeds * t.questions)))
            designs.append({"matrix": Path(directory).name, "dir": str(directory), "task": task,
                            "variants": list(tables), "k": len(y), "n": t.seeds, "questions": t.questions,
                            "seed_sds": np.sqrt(seed_part).tolist(), "question_sds": np.sqrt(question_part).tolist(),
                            "residual_sds": np.sqrt(residual).tolist(), "question_cov": question_cov.tolist(),
                            "question_cov_misfit": _misfit(question_cov, components[1]),
                            "shared_question_sd": float(y.mean((0, 1)).std(ddof=1)),
                            "sd": float(np.sqrt(np.mean(variance[i, j]) * t.seeds / 2)), "question_share": float(share),
                            "margin": margin})
    return designs


def _crossed_scenarios(d: dict) -> list[tuple[str, inference.Design]]:
    """A design's scenarios: the global null and the top 2 tied (the rest a pooled sd of a cell apart), at
    the store's own parts split per variant (as crossed-v4's calibration assumes); the global null with the question
    effects' covariance from the pairs instead (as the store shows them, not additive); and the global null with
    every question part CROSSED_QUESTION_SCALE times larger."""
    k, n = d["k"], d["n"]
    shape = dict(sds=np.asarray(d["seed_sds"]), questions=d["questions"], residual_sd=np.asarray(d["residual_sds"]),
                 shared_question_sd=d["shared_question_sd"], margin=d["margin"])
    question_sds = np.asarray(d["question_sds"])
    out = [("global null", inference.Design(k, n, question_sd=question_sds, **shape)),
           ("global null, the pairs' question parts (not split)",
            inference.Design(k, n, question_cov=np.asarray(d["question_cov"]), **shape))]
    out += [(f"top {m} equal, the rest {d['sd']:.3f} apart below",
             inference.Design(k, n, question_sd=question_sds, means=inference.partial_null(k, m, d["sd"]), **shape))
            for m in (2,) if m < k]  # measured with the top 3 tied too: 0.009 and 0.025, far below 0.05
    out.append((f"global null, question parts x{CROSSED_QUESTION_SCALE:g}",
                inference.Design(k, n, question_sd=question_sds * math.sqrt(CROSSED_QUESTION_SCALE), **shape)))
    return out


def crossed_simulated(designs: list[dict], *, sims: int = 1000, reps: int = CROSSED_REPS,
                      tick: Callable[[], None] = lambda: None) -> pd.DataFrame:
    """Per design and scenario: crossed-v4's family-wise rates (``inference.family_error`` on per-question
    matrices) and, on the same simulated matrices, the current procedure's (its seeds-only intervals judged
    against the skill's truth); ``tick`` after each."""
    rows = []
    for d in designs:
        for label, design in _crossed_scenarios(d):
            row = {"matrix": d["matrix"], "task": d["task"], "variants": d["k"], "seeds": d["n"],
                   "questions": d["questions"], "scenario": label, "sims": sims}
            for name in (CROSSED, inference.PROCEDURE):
                rates = inference.family_error(design, sims=sims, reps=reps, procedure=name)
                row.update({f"{name} {key}": rates[key] for key in ("false_claim", "noncoverage",
                                                                     "false_equivalent", "any_worse")})
            rows.append(row)
            tick()
    return pd.DataFrame(rows)


def crossed_real_aa(directory: Path | str, *, shapes: Sequence[tuple[int, int]] = CROSSED_AA_SHAPES,
                    draws: int = 1000, outer: int = 40, inner: int = 50, reps: int = CROSSED_AA_REPS, seed: int = 0,
                    tick: Callable[[], None] = lambda: None) -> tuple[dict, pd.DataFrame]:
    """An A/A store's cells with their per-question records (one variant, independent seeds, every cell on the
    same questions) cut at random into null matrices of k variants x n seeds, every cell at most once a matrix,
    paired by position (the cells are exchangeable, so any pairing is a valid block), judged by crossed-v4: the
    family-wise rate of false claims over ``draws`` partitions, and its 95% interval from ``outer`` bootstrap
    resamples of the cells (``inner`` partitions each); ``tick`` after each shape."""
    frame = crossed.question_scores(directory)
    tables = crossed.variant_tables(frame)
    if len(tables) != 1:
        raise ValueError(f"{directory}: an A/A matrix runs one variant, found {len(tables)}: {', '.join(tables)}")
    (variant, (_, cells)), = tables.items()  # (cells, Q)
    margin = analysis_spec(collect(Path(directory))["meta"]).get("margin")
    rng = np.random.default_rng(seed)

    def rates(values: np.ndarray, k: int, n: int, count: int, at: int) -> dict:
        picks = np.argsort(rng.random((count, len(values))), axis=1)[:, : k * n]
        y = values[picks].reshape(count, k, n, values.shape[-1])
        low, high, in_set = inference.crossed_procedure(y, reps=reps, seed=at)
        return inference.error_rates(low, high, np.zeros(k), margin, in_set)

    rows = []
    for k, n in shapes:
        tick()
        if k * n > len(cells):
            continue
        rate = rates(cells, k, n, draws, seed + 11)
        boot = [rates(cells[rng.integers(0, len(cells), len(cells))], k, n, inner, seed + 13 + b)["false_claim"]
                for b in range(outer)]
        rows.append({"variants": k, "seeds": n, "draws": draws, "false_claim": rate["false_claim"],
                     "low": float(np.quantile(boot, 0.025)), "high": float(np.quantile(boot, 0.975)),
                     "false_equivalent": rate["false_equivalent"], "noncoverage": rate["noncoverage"]})
    summary = {"matrix": Path(directory).name, "dir": str(directory), "variant": variant, "cells": len(cells),
               "questions": cells.shape[1], "margin": margin}
    return summary, pd.DataFrame(rows)


def crossed_measurements(directories: Sequence[Path | str], aa: Sequence[Path | str], *, sims: int = 1000,
                         progress: Optional[Callable[..., Any]] = None) -> dict:
    """crossed-v4's calibration: its designs (``crossed_designs``) simulated, and every A/A store of ``aa`` with
    per-question records cut into null matrices (``crossed_real_aa``)."""
    designs = crossed_designs(directories)
    held = [d for d in aa if _has_records(d)]
    cases = sum(len(_crossed_scenarios(d)) for d in designs) + len(CROSSED_AA_SHAPES) * len(held)
    bar = (progress(cases, desc=f"crossed-v4 ({sims} simulated matrices a case)", unit="case")
           if progress and cases else _Silent())
    sim = crossed_simulated(designs, sims=sims, tick=lambda: bar.update(1))
    measured = [crossed_real_aa(d, tick=lambda: bar.update(1)) for d in held]
    bar.close()
    return {"designs": designs, "simulated": sim, "real_aa": measured, "sims": sims, "reps": CROSSED_REPS}


def _has_records(directory: Path | str) -> bool:
    try:
        crossed.question_scores(directory)
    except UsageError:
        return False
    return True


def crossed_records(result: dict) -> dict:
    """``crossed_measurements``'s result as data (OUT/crossed.json, and calibration.json's ``crossed``)."""
    return {"designs": result["designs"], "simulated": result["simulated"].to_dict(orient="records"),
            "real_aa": [{"summary": s, "rates": r.to_dict(orient="records")} for s, r in result["real_aa"]],
            "sims": result["sims"], "reps": result["reps"], "alpha": inference.ALPHA}


def crossed_section(result: dict, command: str) -> str:
    """The section on crossed-v4: its rates at the real-LM designs beside the current procedure's, and on the
    A/A cells."""
    sim, current = result["simulated"], inference.PROCEDURE
    se = lambda p, n: math.sqrt(p * (1 - p) / max(n, 1))
    lines = [f"## `{CROSSED}`: claims about the skill, the questions sampled too", "",
             f"Written by `{command}`.", "",
             f"`{CROSSED}` (benchmarks/report/inference.py, offered, not current) judges each pair on its "
             "per-(seed, question) differences: the crossed seeds x questions variance, Satterthwaite's degrees of "
             "freedom, c the larger of the posterior bootstrap's and the equal-spread value, so its marks speak for "
             "the task's questions, not the Q drawn. Simulated at each store's design with its per-question records: "
             "each variant's own seed, question and residual parts as the store estimates them (each pair's "
             "components split per variant), a question effect all variants share, Gaussian parts, the questions "
             "drawn anew per simulated matrix; the truth is the skill's mean. *Question share*: the median over "
             "pairs of the question part over the seeds-only variance. Beside it, the current procedure "
             f"(`{current}`, seeds-only) on the same matrices, judged against the same truth. "
             f"Each simulated matrix's c from {result['reps']} matrices (a fit's from {inference.MCB_REPS}: "
             "fewer err upward); Monte Carlo SE of a rate near 0.05 at "
             f"{result['sims']} matrices: {se(0.05, result['sims']):.3f}.", ""]
    designs = {(d["matrix"], d["task"]): d for d in result["designs"]}
    if not sim.empty:
        rows = []
        for r in sim.to_dict(orient="records"):
            d = designs[(r["matrix"], r["task"])]
            rows.append([r["matrix"], r["task"], f"{r['variants']} x {r['seeds']} x {r['questions']}",
                         f"{d['question_share']:.2f}", r["scenario"],
                         f"{r[f'{CROSSED} false_claim']:.3f} +-{se(r[f'{CROSSED} false_claim'], r['sims']):.3f}",
                         f"{r[f'{CROSSED} noncoverage']:.3f}", f"{r[f'{CROSSED} false_equivalent']:.3f}",
                         f"{r[f'{CROSSED} any_worse']:.3f}",
                         f"{r[f'{current} false_claim']:.3f} +-{se(r[f'{current} false_claim'], r['sims']):.3f}",
                         f"{r[f'{current} any_worse']:.3f}", r["sims"]])
        lines += [markdown_table(["matrix", "task", "design (variants x seeds x questions)", "question share",
                                  "scenario", f"{CROSSED} false claim [+-SE]", "non-coverage", "false equivalence",
                                  "any worse", f"{current} false claim [+-SE]", f"{current} any worse",
                                  "simulated matrices"], rows), ""]
        fits = [f"`{d['matrix']}` {d['question_cov_misfit']:.2f}" for d in result["designs"]
                if "question_cov_misfit" in d]
        if fits:
            lines += ["*The pairs' question parts (not split)*: the question effects drawn from one covariance across "
                      "variants fitted to every pair's question component (classical scaling), where the other "
                      "scenarios split them per variant (additive; crossed-v4's calibration reads each matrix's own "
                      "covariance); its median misfit to the pairs' components, over their mean: "
                      + ", ".join(fits) + ".", ""]
    for summary, rates in result["real_aa"]:
        lines += [f"On real A/A replicates: `{summary['matrix']}` ({summary['dir']}), `{summary['variant']}` on "
                  f"{summary['cells']} independent seeds, every cell with its {summary['questions']} questions' "
                  "records, cut at random into null matrices (every cell at most once a matrix, paired by position: "
                  f"the cells are exchangeable), judged by `{CROSSED}`; the interval is a bootstrap over the cells. "
                  "The questions are the same in every cell, so the question part of a null pair is 0 here: this "
                  "checks the seed and residual parts' real distribution, the simulation the question part.", ""]
        if rates.empty:
            lines += ["Too few cells for any null-matrix shape.", ""]
            continue
        lines += [markdown_table(["null matrix", "partitions", "false claim [95% bootstrap]", "false equivalence",
                                  "non-coverage"],
                                 [[f"{r.variants} x {r.seeds}", r.draws, f"{r.false_claim:.3f} [{r.low:.3f}, "
                                   f"{r.high:.3f}]", f"{r.false_equivalent:.3f}", f"{r.noncoverage:.3f}"]
                                  for r in rates.itertuples()]), ""]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``DIR ... [--aa AA_DIR ...] [--out OUT] [--sims N]``: crossed-v4's calibration alone, written as the
    section ``crossed-v4`` of OUT/report.md (the rest of the page untouched) and OUT/crossed.json."""
    import sys

    from benchmarks.io import atomic_write_json
    from benchmarks.markdown import update_section

    args = list(sys.argv[1:] if argv is None else argv)
    usage = ("usage: python -m benchmarks.report.calibration_report DIR [DIR ...] [--aa AA_DIR ...] [--out OUT] "
             "[--sims N]")
    if "--help" in args or "-h" in args:
        print(main.__doc__.strip() + "\n" + usage)
        return 0
    dirs, aa, out, sims = [], [], "results/calibration", 1000
    at = dirs
    try:
        items = iter(args)
        for item in items:
            if item == "--aa":
                at = aa
            elif item in ("--out", "--sims"):
                value = next(items)
                if item == "--out":
                    out = value
                elif not value.isdigit():
                    raise ValueError(f"--sims takes a number of simulated matrices, got {value!r}")
                else:
                    sims = int(value)
            elif item.startswith("-"):
                raise ValueError(f"unknown option {item}")
            else:
                at.append(item)
        if sims < 100:
            raise ValueError(f"--sims must be at least 100, got {sims}")
        missing = [d for d in dirs + aa if not (Path(d) / "matrix.json").exists()]
        if not dirs or missing:
            raise ValueError(("not a result store (no matrix.json): " + ", ".join(missing)) if missing else "no DIR")
    except (StopIteration, ValueError) as error:
        print(f"error: {str(error) or 'an option without its value'}; {usage}", file=sys.stderr)
        return 2
    command = "python -m benchmarks.report.calibration_report " + " ".join(args)
    result = crossed_measurements(dirs, aa, sims=sims)
    update_section(Path(out) / "report.md", CROSSED_SECTION, crossed_section(result, command))
    atomic_write_json(Path(out) / CROSSED_JSON, crossed_records(result))
    print(f"wrote the {CROSSED_SECTION} section of {out}/report.md, {out}/{CROSSED_JSON}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
