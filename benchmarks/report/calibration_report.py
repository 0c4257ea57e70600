"""``grpo-bench calibration DIR [DIR ...] --out OUT``: the verdict procedure's calibration, as committed numbers.

Three measurements of the same claim -- "a mark at the 95% level is wrong about 5% of the time":

  * coverage: the share of simulated 95% intervals of a difference of two means that contain the true difference
    (``calibration.coverage``: known means, the seed counts the matrices use, three spread scenarios), per method;
  * simulated A/A: the share of simulated pairs of *identical* variants (true difference 0, the addition task's
    seed-to-seed spread) that a method separates -- the false-separation rate the verdicts would have if every
    comparison were an A/A one;
  * measured A/A: every pair of variants that a committed matrix declares equivalent (``equivalent`` in its matrix
    file: variants that compute the same update), on every task, compared by the verdicts' own interval; the share
    separated, with a Wilson interval.

It reads the result stores and matrix.json files it is given, and writes OUT/report.md and OUT/calibration.json.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from benchmarks.io import atomic_write_json, atomic_write_text
from benchmarks.markdown import markdown_table
from benchmarks.report import calibration, stats

SEEDS = (3, 5, 10)
AA_SD = 0.05  # the addition task's typical seed-to-seed spread (calibration.SCENARIOS' equal spread)


def simulated_false_separation(methods: Sequence[str] = calibration.CANDIDATES, seeds: Sequence[int] = SEEDS, *,
                               sims: int = 4000, reps: int = 2000, sd: float = AA_SD, seed: int = 0) -> pd.DataFrame:
    """Per (method, seeds): the share of simulated A/A pairs (two variants with the same true mean and spread
    ``sd``, independent seeds) whose 95% interval of the difference excludes 0."""
    rows = []
    for n in seeds:
        rng = np.random.default_rng([seed, n, 7])
        a, b = calibration.simulate_seeds(n, sims, sd, sd, 0.0, rng, diff=0.0)
        for method in methods:
            low, high = calibration.INTERVALS[method](a, b, reps=reps, rng=np.random.default_rng([seed, n, 8]))
            rows.append({"method": method, "seeds": n, "false_separation": float(np.mean((low > 0) | (high < 0)))})
    return pd.DataFrame(rows)


def declared_groups(meta: dict) -> tuple[list[list[str]], str]:
    """A matrix's equivalent groups and where they were read: the matrix file as it ran (matrix.json's copy), else
    the matrix file it names as it is now -- equivalence is a property of the algorithms, not of the run, so a
    declaration added after a matrix ran applies to its cells as well."""
    groups = calibration.equivalent_groups(meta)
    if groups:
        return groups, "the matrix file as it ran"
    path = Path(meta.get("file") or "")
    if path.is_file():
        groups = calibration.equivalent_groups({"toml": path.read_text()})
        if groups:
            return groups, f"{path} (declared after the run)"
    return [], "none declared"


def measured_false_separation(directories: Sequence[Path | str]) -> tuple[pd.DataFrame, dict[str, str]]:
    """Every declared A/A pair of every given matrix, on every task, by the verdicts' interval (stats.METHOD), and
    for each matrix where its groups were read."""
    from benchmarks.report.curves import build
    from benchmarks.report.matrix import collect

    frames, sources = [], {}
    for directory in directories:
        data = collect(Path(directory))
        groups, sources[Path(directory).name] = declared_groups(data["meta"])
        per_cell = build(data["cells"], data["evals"]).get("cells", pd.DataFrame())
        if groups and not per_cell.empty:
            frames.append(calibration.false_separation(per_cell, groups).assign(matrix=Path(directory).name))
    columns = ["matrix", "task", "a", "b", "diff", "low", "high", "separated"]
    measured = pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)
    return measured, sources


def render(cover: pd.DataFrame, simulated: pd.DataFrame, measured: pd.DataFrame, sources: dict[str, str],
           command: str) -> str:
    n_sep, n_pairs = int(measured["separated"].sum()), len(measured)
    low, high = stats.wilson_interval(n_sep, n_pairs)
    welch_cover = cover[(cover["method"] == stats.METHOD) & (cover["scenario"] != "all")]
    welch_sim = simulated[simulated["method"] == stats.METHOD]
    headline = (f"**The verdicts' interval ({stats.METHOD} t, 95%): coverage {welch_cover['coverage'].min():.3f}-"
                f"{welch_cover['coverage'].max():.3f} over the simulated scenarios at {', '.join(map(str, SEEDS))} seeds; "
                f"simulated A/A false separation {welch_sim['false_separation'].min():.3f}-"
                f"{welch_sim['false_separation'].max():.3f}; measured on the committed matrices' declared-equivalent "
                f"pairs: {n_sep} of {n_pairs} separated"
                + (f" ({n_sep / n_pairs:.0%}, Wilson 95% [{low:.2f}, {high:.2f}])" if n_pairs else "") + ".**")
    pivot = cover.pivot_table(index=["method", "scenario"], columns="seeds", values="coverage", sort=False)
    cover_rows = [[m, s] + [f"{pivot.loc[(m, s), n]:.3f}" for n in pivot.columns] for m, s in pivot.index]
    sim_pivot = simulated.pivot_table(index="method", columns="seeds", values="false_separation", sort=False)
    sim_rows = [[m] + [f"{sim_pivot.loc[m, n]:.3f}" for n in sim_pivot.columns] for m in sim_pivot.index]
    pair_rows = [[r.matrix, r.task, f"`{r.a}`", f"`{r.b}`", f"{r.diff:+.4f}", f"[{r.low:+.4f}, {r.high:+.4f}]",
                  "**yes**" if r.separated else "no"] for r in measured.itertuples()]
    lines = [
        "# Calibration of the verdicts", "", headline, "",
        "Matrices read, and where their equivalent groups come from: "
        + "; ".join(f"`{name}`: {source}" for name, source in sources.items()) + f". Written by `{command}`.", "",
        "## Coverage", "",
        f"Share of simulated 95% intervals of mean(A) - mean(B) that contain the true difference "
        f"({calibration.TRUE_DIFF}); {len(SEEDS)} seed counts, the scenarios of benchmarks/report/calibration.py "
        "(equal spreads sd 0.05; unequal 0.02 against 0.08; seeds correlated rho 0.5), 'all' their mean. "
        "A calibrated method reads about 0.95.", "",
        markdown_table(["method", "scenario"] + [f"{n} seeds" for n in pivot.columns], cover_rows), "",
        "## Simulated A/A", "",
        f"Share of simulated pairs of identical variants (true difference 0, seed-to-seed sd {AA_SD}, independent "
        "seeds) that a method separates at 95%. A calibrated method reads about 0.05.", "",
        markdown_table(["method"] + [f"{n} seeds" for n in sim_pivot.columns], sim_rows), "",
        "## Measured A/A", "",
        "Every pair of variants a matrix declares equivalent (same update; `equivalent` in its matrix file), on "
        "every task, by the verdicts' interval. Pairs whose runs are bit-identical seed for seed (GRPO at the token and "
        "the sequence level and SAPO at mu = 1, on pizza and the bandits) differ by exactly 0 and cannot be separated; "
        "the informative pairs are those where rounding let the runs drift apart (addition, and CISPO everywhere). "
        "Pairs that share a variant are not independent, so the Wilson interval of the headline is optimistic.", "",
        markdown_table(["matrix", "task", "A", "B", "mean(A) - mean(B)", "95% interval", "separated"], pair_rows)
        if pair_rows else "No declared pairs in these matrices.", "",
    ]
    return "\n".join(lines)


def write_calibration(directories: Sequence[Path | str], out: Path | str, *, sims: int = 4000, reps: int = 2000,
                      command: str = "grpo-bench calibration") -> str:
    cover = calibration.coverage(seeds=SEEDS, sims=sims, reps=reps)
    simulated = simulated_false_separation(sims=sims, reps=reps)
    measured, sources = measured_false_separation(directories)
    text = render(cover, simulated, measured, sources, command)
    out = Path(out)
    atomic_write_text(out / "report.md", text)
    atomic_write_json(out / "calibration.json", {
        "coverage": cover.to_dict(orient="records"), "simulated_aa": simulated.to_dict(orient="records"),
        "measured_aa": measured.to_dict(orient="records"), "matrices": [str(d) for d in directories],
        "groups_from": sources,
        "sims": sims, "reps": reps, "method": stats.METHOD})
    return text
