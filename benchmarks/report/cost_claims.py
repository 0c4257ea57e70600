"""Cost claims read from stored matrices: "A costs less than B at equal accuracy" (the published claim 9).

A claim of this kind is not one contrast of a matrix that ran for it: it reads a matrix that ran both variants for
another question (a verdict matrix), so the claims file that states it (``[[cost_claims]]``, e.g.
benchmarks/matrices/claims_cost.toml) is a *reading*, written when it was, and the table says so. Where the store
stated its primary metric and margin before its cells ran, the reading must use them (it cannot choose another
after the fact); where the store stated none, the reading states them and the table marks them "stated after its
cells ran".

The rule, for a treatment T said to cost less than a control C at equal accuracy, with the store's margin m:

* accuracy: T - C on the primary metric, blocked by seed (``inference.contrasts``), a 97.5% interval [lo, hi].
  It holds where lo > -m (T is not less accurate by more than the margin), fails where hi < -m;
* training time: the per-seed ratio T / C of training seconds, its geometric mean with a 97.5% t-interval on the
  log ratios. It holds where the interval lies below 1, fails where it lies above 1;
* trained state (parameters + gradients + optimizer state, a critic included): the same in every seed, no noise;
  it holds where T's is smaller, fails otherwise.

The two intervals are Bonferroni-split (2 x 2.5%), so the mark holds with probability >= 95%: *supported* when all
three hold, *contradicted* when one fails, else *not resolved*, naming the part that is open. Peak process memory
(RSS) is described beside it (one-at-a-time 95%), not judged: it counts the interpreter and libraries too.
"""

from __future__ import annotations

import math
import tomllib
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.errors import UsageError
from benchmarks.report import curves as learning_curves
from benchmarks.report import inference
from benchmarks.report.matrix import collect
from benchmarks.report.stats import ratio_interval
from benchmarks.report.verdicts import analysis_spec

ALPHA_PART = inference.ALPHA / 2  # accuracy and training time, Bonferroni-split
KEYS = {"id": str, "source": str, "claim": str, "store": str, "task": str, "treatment": str, "control": str,
        "primary": str, "margin": float}
REQUIRED = ("id", "source", "claim", "store", "task", "treatment", "control")


def _bad(path: Path, message: str) -> UsageError:
    return UsageError(f"{path}: {message}")


def parse_reading(path: Path | str) -> tuple[str, str, list[dict]]:
    """(name, stated date, the [[cost_claims]] tables) of a reading file; one clear line for anything wrong."""
    path = Path(path)
    try:
        table = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise _bad(path, f"cannot read it as TOML ({exc})") from None
    stated = table.get("stated")
    if not isinstance(stated, str):
        raise _bad(path, 'needs stated = "YYYY-MM-DD", the day the reading was written')
    try:
        datetime.strptime(stated, "%Y-%m-%d")
    except ValueError:
        raise _bad(path, f"stated {stated!r} is not a date YYYY-MM-DD") from None
    claims = table.get("cost_claims")
    if not isinstance(claims, list) or not claims:
        raise _bad(path, "states no [[cost_claims]]")
    seen = set()
    for claim in claims:
        unknown = sorted(set(claim) - set(KEYS))
        if unknown:
            raise _bad(path, f"unknown key {unknown[0]!r} of [[cost_claims]] (known: {', '.join(KEYS)})")
        for key in REQUIRED:
            if not isinstance(claim.get(key), str) or not claim[key]:
                raise _bad(path, f"a [[cost_claims]] table needs {key} (a string)")
        if claim["treatment"] == claim["control"]:
            raise _bad(path, f"claim {claim['id']!r}: the treatment and the control are one variant")
        if claim["id"] in seen:
            raise _bad(path, f"claim ids repeat: {claim['id']!r}")
        seen.add(claim["id"])
    return str(table.get("name") or path.stem), stated, claims


def cost_mark(low: float, high: float, margin: float, time_high: float, time_low: float, state_ratio: float) -> str:
    """The module docstring's rule: supported, contradicted or not resolved."""
    fails = high < -margin or time_low > 1 or not state_ratio < 1
    holds = low > -margin and time_high < 1 and state_ratio < 1
    return inference.CONTRADICTED if fails else inference.SUPPORTED if holds else inference.CLAIM_OPEN


def _per_seed(frame: pd.DataFrame, variant: str, column: str) -> dict[int, float]:
    """{seed: value of ``column``} of ``variant``'s rows (its complete cells where the frame has a status)."""
    rows = frame[frame["variant"] == variant]
    if "status" in rows:
        rows = rows[rows["status"] == "complete"]
    return {int(s): float(v) for s, v in zip(rows["seed"], rows[column]) if pd.notna(v)}


def _judge(claim: dict, stated: str, name: str, path: Path) -> dict:
    store = Path(claim["store"])
    if not (store / "matrix.json").is_file():
        raise _bad(path, f"claim {claim['id']!r}: {store} is not a matrix folder (no matrix.json)")
    data = collect(store)
    spec = analysis_spec(data["meta"])
    if spec.get("stated_at"):  # the store's own stated analysis binds the reading
        for key in ("primary", "margin"):
            if key in claim and claim[key] != spec[key]:
                raise _bad(path, f"claim {claim['id']!r}: {store} stated {key} {spec[key]!r} before its cells ran; "
                                 f"a reading cannot use {claim[key]!r}")
        primary, margin, when = spec["primary"], spec["margin"], spec["stated_at"]
    else:
        if "primary" not in claim or "margin" not in claim:
            raise _bad(path, f"claim {claim['id']!r}: {store} states no analysis, so the reading must state primary "
                             "and margin")
        primary, margin, when = claim["primary"], float(claim["margin"]), None
    cells = data["cells"]
    cells = cells[cells["task"] == claim["task"]]
    for variant in (claim["treatment"], claim["control"]):
        if not (cells["variant"] == variant).any():
            raise _bad(path, f"claim {claim['id']!r}: {store} has no variant {variant!r} on task {claim['task']!r}")
    per_cell = learning_curves.build(data["cells"], data["evals"], primary).get("cells", pd.DataFrame())
    per_cell = per_cell[per_cell["task"] == claim["task"]] if not per_cell.empty else per_cell
    scores = {v: _per_seed(per_cell, v, "primary") if not per_cell.empty else {}
              for v in (claim["treatment"], claim["control"])}
    contrast = {"id": claim["id"], "treatment": claim["treatment"], "control": claim["control"], "expects": "equal"}
    table, _ = inference.contrasts(scores, [contrast], margin=margin, alpha=ALPHA_PART)
    accuracy = table.iloc[0]
    time = ratio_interval(_per_seed(cells, claim["treatment"], "wall_clock_s"),
                          _per_seed(cells, claim["control"], "wall_clock_s"), 1 - ALPHA_PART)
    states = [_per_seed(cells, v, "training_state_bytes") for v in (claim["treatment"], claim["control"])]
    state = (np.mean(list(states[0].values())) / np.mean(list(states[1].values()))
             if all(states) else math.nan)
    rss = ratio_interval(_per_seed(cells, claim["treatment"], "peak_memory_bytes"),
                         _per_seed(cells, claim["control"], "peak_memory_bytes"), 1 - inference.ALPHA)
    missing = int((cells["variant"].isin([claim["treatment"], claim["control"]]) & (cells["status"] != "complete")).sum())
    low, high = float(accuracy.get("low", math.nan)), float(accuracy.get("high", math.nan))
    mark = (cost_mark(low, high, margin, time[2], time[1], state)
            if not any(math.isnan(x) for x in (low, high, *time, state)) else inference.CLAIM_OPEN)
    return {"matrix": name, "task": claim["task"], "id": claim["id"], "source": claim["source"], "claim": claim["claim"],
            "treatment": claim["treatment"], "control": claim["control"], "expects": "cheaper", "primary": primary,
            "margin": margin, "stated_at": when, "reading_stated": stated, "reading_of": data["meta"].get("name", store.name),
            "seeds": accuracy["seeds"], "cells_missing": missing,
            **{k: accuracy.get(k, math.nan) for k in ("treatment_mean", "control_mean", "difference", "low", "high",
                                                      "mdd", "seeds_for_margin")},
            "mark": mark, "time_ratio": time[0], "time_low": time[1], "time_high": time[2], "state_ratio": state,
            "rss_ratio": rss[0], "rss_low": rss[1], "rss_high": rss[2], "report": str(store / "README.md")}


def cost_claims_of(path: Path | str) -> pd.DataFrame:
    """One row per [[cost_claims]] table of the reading file at ``path``."""
    path = Path(path)
    name, stated, claims = parse_reading(path)
    return pd.DataFrame([_judge(c, stated, name, path) for c in claims])


def cost_mark_text(r) -> str:
    """The mark in words, naming what is open or what failed."""
    if r["mark"] == inference.SUPPORTED:
        return "supported"
    parts = []
    if r["high"] < -r["margin"]:
        parts.append(f"less accurate by more than {r['margin']:g}")
    if r["time_low"] > 1:
        parts.append("slower")
    if not r["state_ratio"] < 1:
        parts.append("no smaller trained state")
    if r["mark"] == inference.CONTRADICTED:
        return "contradicted: " + ", ".join(parts)
    open_parts = []
    if not r["low"] > -r["margin"]:
        need = r.get("seeds_for_margin")
        if r["high"] < 0:  # separated from 0, not beyond the margin: described, the mark stays open
            why = f"less accurate, separated from 0 but not shown beyond -{r['margin']:g}"
        else:
            why = f"the interval reaches {r['low']:+.3f}, beyond -{r['margin']:g}; MDD {r['mdd']:.3f}" + (
                f"; the margin needs ~{int(need)} seeds" if need and not math.isnan(need) else "")
        open_parts.append(f"equal accuracy not shown ({why})")
    if not r["time_high"] < 1:
        open_parts.append("faster not shown")
    held = [p for p, ok in (("faster", r["time_high"] < 1), ("smaller trained state", r["state_ratio"] < 1)) if ok]
    return "not resolved: " + "; ".join(open_parts) + (f" ({' and '.join(held)}: shown)" if held else "")
