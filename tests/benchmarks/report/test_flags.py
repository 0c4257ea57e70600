"""The flags a matrix's report raises by itself, each planted in a hand-made store (no training) and seen to fire
with its numbers; a clean store raises none."""

import json
import math

import pandas as pd
import pytest
from scipy import stats

from benchmarks.git import git
from benchmarks.report import flags
from benchmarks.report.matrix import collect, report
from benchmarks.store import ResultStore

HEAD = git(str(flags.REPO), "rev-parse", "HEAD").decode().strip()  # a commit this repository's history holds
GONE = "deadbeef" * 5  # one it does not
EPYC, XEON = "AMD EPYC (1 threads)", "Intel(R) Xeon(R) Processor (1 threads)"
BUDGET, CPS = 64, 16
SEEDS = (0, 1, 2)


def _cell(rel, task, variant, seed, *, mu=1, finals=(0.5, 0.6), noise=0.0, commit=HEAD, dirty=False, host=EPYC,
          step_noise=0.0, bf16=None):
    """(planned cell, summary, metrics rows) of a complete cell: 4 steps of 16 completions, one evaluation."""
    steps = BUDGET // CPS
    spec = {"task_label": task, "task": task, "variant": variant, "algo": "grpo", "seed": seed, "steps": steps,
            "budget": BUDGET, "completions_per_step": CPS, "settings": {"mu": mu, "learning_rate": 1e-4}}
    mid, after = finals[0] + noise, finals[1] + noise
    rows = [{"step": s, "completions": float(CPS), "loss": 0.1 * s + step_noise + 0.01 * seed,
             "reward/mean": 0.2 + 0.1 * s, "time/step": 0.5 + 0.01 * s + 0.1 * seed + len(variant),
             "time/wall": s * (0.5 + len(variant)),
             **({"eval/accuracy": mid} if s == 2 else {})} for s in range(1, steps + 1)]
    summary = {"status": "complete", "task": task, "seed": seed, "steps": steps, "accuracy_before": 0.1,
               "accuracy_after": after, "reward_before": 0.1, "reward_after": after, "completions_generated": BUDGET,
               "wall_clock_s": 3.0, "time_per_step_s": 0.75, "precision": "bf16", "device": "cpu", "device_name": host,
               "config": {"environment": {"device": "cpu", "device_name": host,
                                          "rounding": {"cpu_capability": "AVX512"},
                                          "code": {"commit": commit, "dirty": dirty},
                                          **({"cpu_bf16": bf16} if bf16 else {})}}}
    return {"dir": rel, **spec}, summary, rows


def _matrix(tmp_path, variants, *, tuning=None, name="m"):
    """A matrix directory: ``variants`` {name: keyword arguments of _cell, per seed where a callable}, each on
    SEEDS; ``tuning``: (planned tuning cells with their summaries and rows, the table)."""
    out = tmp_path / name
    out.mkdir()
    store = ResultStore.open(out)
    planned = []
    for variant, options in variants.items():
        for seed in SEEDS:
            kwargs = options(seed) if callable(options) else options
            cell, summary, rows = _cell(f"t/{variant}/seed{seed}", "t", variant, seed, **kwargs)
            planned.append(cell)
            store.cells[cell["dir"]] = {"spec": {k: v for k, v in cell.items() if k != "dir"}, "summary": summary}
            store.steps[cell["dir"]] = rows
    meta = {"name": name, "cells": planned, "sessions": []}
    if tuning:
        cells, table = tuning
        for cell, summary, rows in cells:
            store.cells[cell["dir"]] = {"spec": {k: v for k, v in cell.items() if k != "dir"}, "summary": summary}
            store.steps[cell["dir"]] = rows
        meta["tuning"] = {"seeds": [100, 101], "cells": [c for c, _, _ in cells], "table": table}
    store.write()
    (out / "matrix.json").write_text(json.dumps(meta))
    return out


def _tuning(points, *, chosen, host=EPYC):
    """Tuning cells of variant 'a' on task t, one grid point per (learning rate, its seeds' final accuracies), and
    the table the choice wrote (mean final accuracy per point)."""
    cells, table = [], []
    for lr, finals in points:
        rels = []
        for seed, final in zip((100, 101), finals):
            cell, summary, rows = _cell(f"tune/t/a/learning_rate={lr}/seed{seed}", "t", "a", seed,
                                        finals=(final, final), host=host)
            cell["settings"]["learning_rate"] = lr
            cells.append((cell, summary, rows))
            rels.append(cell["dir"])
        mean = sum(finals) / len(finals)
        table.append({"point": f"learning_rate={lr}", "settings": {"learning_rate": lr}, "cells": rels, "seeds": 2,
                      "failed": 0, "primary_metric": "final", "primary": mean, "auc": mean, "final_accuracy": mean})
    return cells, [{"task": "t", "variant": "a", "chosen": chosen, "points": table}]


CLEAN_TUNING = [(1e-5, (0.40, 0.41)), (1e-4, (0.60, 0.61)), (1e-3, (0.30, 0.31))]  # the middle point, far ahead


def _found(out):
    data = collect(out)
    return flags.find(data["meta"], data["store"], data["steps"])


def _noise(seed):  # each variant's seeds differ, and the variants differ from each other
    return {"noise": 0.01 * seed}


@pytest.fixture
def clean(tmp_path):
    return _matrix(tmp_path, {"a": _noise, "b": lambda s: {"noise": 0.02 * s + 0.05, "step_noise": 0.3}},
                   tuning=_tuning(CLEAN_TUNING, chosen=1))


def test_a_clean_store_flags_nothing(clean):
    found = _found(clean)
    assert flags.lines(found) == []
    assert found["code"]["commits"] == {HEAD: 6 + 6} and found["code"]["not_in_history"] == {}
    assert found["reliability"][0]["probability"] == 1.0
    page = report(clean, plot=False)
    text = (clean / "README.md").read_text()
    assert flags.render(found).endswith("choices.\n\nNone.\n")
    assert flags.render(found, history=False).endswith("at different code.\n\nNone.\n")
    assert flags.render(found, history=False) in text  # the code versions go to the provenance at the end
    assert page["flags"] == found


def test_a_different_update_count_at_equal_completions_is_flagged(tmp_path):
    out = _matrix(tmp_path, {"a": _noise, "b": lambda s: {"mu": 2, "noise": 0.1 + 0.01 * s, "step_noise": 1.0}})
    found = _found(out)
    assert found["updates"] == [{"task": "t", "budget": BUDGET, "spearman": None,
                                 "variants": {"a": (4, 4), "b": (8, 8)}}]
    assert flags.lines(found) == ["Optimizer updates per cell differ at 64 completions on t: `a` 4, `b` 8."]


def test_the_update_count_is_set_against_the_ranking(tmp_path):
    out = _matrix(tmp_path, {"a": {"mu": 1}, "b": {"mu": 2, "step_noise": 1.0}, "c": {"mu": 3, "step_noise": 2.0}})
    records = flags.cell_records(json.loads((out / "matrix.json").read_text()), ResultStore.open(out))
    found = flags.update_counts(records, scores={("t", "a"): 0.5, ("t", "b"): 0.4, ("t", "c"): 0.6})
    assert found[0]["spearman"] == pytest.approx(0.5)  # ranks of (4, 8, 12) against ranks of (0.5, 0.4, 0.6)


def test_a_code_version_mix_is_flagged_with_a_commit_not_in_history(tmp_path):
    # b's seed 1 ran at a commit the history lacks; a's seed 2 with uncommitted changes
    out = _matrix(tmp_path, {"a": lambda s: {"noise": 0.01 * s, "dirty": s == 2},
                             "b": lambda s: {"noise": 0.2 + 0.01 * s, "commit": GONE if s == 1 else HEAD,
                                             "step_noise": 1.0}})
    code = _found(out)["code"]
    assert code["commits"] == {HEAD: 5, GONE: 1} and code["not_in_history"] == {GONE: 1}
    assert code["dirty"] == 1 and code["dirty_unknown"] == 0
    assert code["comparisons"] == [{"task": "t", "codes": 3, "variants": {"a": {HEAD[:7]: 2, HEAD[:7] + "+changes": 1},
                                                                         "b": {HEAD[:7]: 2, GONE[:7]: 1}}}]
    text = flags.lines(_found(out))
    assert text[0] == f"Code versions: 6 cells ran at 2 commits ({HEAD[:7]} x5, deadbee x1)."
    assert text[1] == ("Code not in this repository's history: 1 of 6 cells ran at 1 of their 2 commits that it lacks "
                       "(deadbee x1).")
    assert text[2] == "Uncommitted changes: 1 of 6 cells ran with changes no commit holds."


def test_a_tuning_cell_at_other_code_counts_and_one_variant_is_cells_not_variants(tmp_path):
    cells, table = _tuning(CLEAN_TUNING, chosen=1)
    cells[0][1]["config"]["environment"]["code"]["commit"] = GONE
    out = _matrix(tmp_path, {"a": lambda s: {"noise": 0.01 * s, "dirty": s == 0}}, tuning=(cells, table))
    text = flags.lines(_found(out))
    assert text[0] == f"Code versions: 9 cells (6 tuning cells included) ran at 2 commits ({HEAD[:7]} x8, deadbee x1)."
    assert text[3] == f"Cells at different code on t (2 versions): `a` {HEAD[:7]} x2, {HEAD[:7]}+changes x1."


def test_a_stores_own_dirty_column_wins_and_an_unreadable_history_is_not_known(tmp_path):
    out = _matrix(tmp_path, {"a": _noise})
    store, meta = ResultStore.open(out), json.loads((out / "matrix.json").read_text())
    store.cells["t/a/seed0"]["dirty"] = True  # as a store with per-cell dirty and diff_hash columns reads
    store.cells["t/a/seed0"]["diff_hash"] = "abcdef123456"
    store.cells["t/a/seed1"]["summary"]["config"]["environment"]["code"] = {"commit": HEAD, "dirty": None}
    del store.cells["t/a/seed2"]["summary"]["config"]  # a store from before the environment was recorded
    records = {r["cell"]: r for r in flags.cell_records(meta, store)}
    assert records["t/a/seed0"]["dirty"] is True
    assert flags.code_label(records["t/a/seed0"]) == HEAD[:7] + "+changes abcdef1"
    code = flags.code_versions(list(records.values()), in_history=lambda commits: flags.commits_in_history(
        commits, repo=tmp_path))  # tmp_path is no git checkout
    assert code["not_in_history"] is None and code["not_recorded"] == 1 and code["dirty_unknown"] == 1
    assert code["dirty"] == 1


def test_a_host_mix_is_flagged_across_variants_and_between_tuning_and_evaluation(tmp_path):
    out = _matrix(tmp_path, {"a": _noise, "b": lambda s: {"noise": 0.1 + 0.01 * s, "host": XEON if s else EPYC,
                                                         "step_noise": 1.0}},
                  tuning=_tuning(CLEAN_TUNING, chosen=1, host=XEON))
    hosts = _found(out)["hosts"]
    assert hosts == [{"task": "t", "evaluation": {f"{EPYC}, AVX512": {"a": 3, "b": 1}, f"{XEON}, AVX512": {"b": 2}},
                      "tuning": {f"{XEON}, AVX512": 6}, "across_stages": True, "precisions": ["bf16"]}]
    assert flags.lines(_found(out)) == [
        f"Mixed hosts on t (bf16): tuning cells on {XEON}, AVX512 x6; evaluation cells on {EPYC}, AVX512 x4 "
        f"(a x3, b x1); {XEON}, AVX512 x2 (b x2)."]


def test_one_cpu_model_with_and_without_amx_is_a_host_mix(tmp_path):
    # The same model name and vector capability: only the recorded bf16 instructions tell the two machines apart.
    out = _matrix(tmp_path, {"a": lambda s: {"noise": 0.01 * s, "bf16": "AMX-BF16, AVX512-BF16" if s else "none"}})
    assert _found(out)["hosts"][0]["evaluation"] == {f"{EPYC}, AVX512, bf16 AMX-BF16, AVX512-BF16": {"a": 2},
                                                     f"{EPYC}, AVX512, bf16 none": {"a": 1}}


def test_tuning_on_another_host_alone_is_flagged(tmp_path):
    out = _matrix(tmp_path, {"a": _noise}, tuning=_tuning(CLEAN_TUNING, chosen=1, host=XEON))
    assert [h["across_stages"] for h in _found(out)["hosts"]] == [True]


def test_a_bit_identical_pair_is_flagged_whatever_its_timings(tmp_path):
    out = _matrix(tmp_path, {"a": _noise, "b": lambda s: {"noise": 0.2 + 0.01 * s, "step_noise": 1.0},
                             "a_twin": _noise})  # a's numbers, its own timings (time/step depends on the name)
    steps = collect(out)["steps"]
    timings = {v: steps[steps["variant"] == v]["time/step"].tolist() for v in ("a", "a_twin")}
    assert timings["a"] != timings["a_twin"]
    assert flags.identical_pairs(steps) == [{"task": "t", "first": "a", "second": "a_twin", "seeds": 3, "identical": 3}]
    assert ("Identical runs, not a comparison: `a` and `a_twin` on t are bit-identical on all 3 shared seed(s)."
            in flags.lines(_found(out)))


def test_a_pair_identical_on_some_seeds_only_is_not_a_twin(tmp_path):
    out = _matrix(tmp_path, {"a": _noise,
                             "a_near": lambda s: {"noise": 0.01 * s, "step_noise": 1e-12 if s == 0 else 0}})
    steps = collect(out)["steps"]
    assert flags.identical_pairs(steps) == []  # one seed differs in its last bit
    assert flags.identical_pairs(steps, least=0.5) == [{"task": "t", "first": "a", "second": "a_near", "seeds": 3,
                                                        "identical": 2}]
    line = "Mostly identical runs: `a` and `a_near` on t are bit-identical on 2 of their 3 shared seeds."
    assert line in flags.lines(_found(out))


def test_a_choice_at_the_grid_edge_is_flagged(tmp_path):
    points = [(1e-5, (0.40, 0.41)), (1e-4, (0.50, 0.51)), (1e-3, (0.70, 0.71))]  # the largest rate wins
    out = _matrix(tmp_path, {"a": _noise}, tuning=_tuning(points, chosen=2))
    edges = _found(out)["grid_edges"]
    assert edges == [{"task": "t", "groups": 1, "at_edge": [
        {"variant": "a", "point": "learning_rate=0.001", "edges": [{"setting": "learning_rate", "value": 1e-3,
                                                                    "side": "largest"}]}]}]
    assert flags.lines(_found(out)) == [
        "Tuning at a grid edge on t: 1 of 1 variants (`a` learning_rate 0.001 (largest))."]


def test_a_rerun_of_a_close_tuning_picks_the_same_point_as_often_as_the_spread_says(tmp_path):
    # two points 0.02 apart, each seed pair 0.1 apart: sd 0.0707, its mean's se 0.05
    points = [(1e-5, (0.50, 0.60)), (1e-4, (0.52, 0.62)), (1e-3, (0.0, 0.0))]
    out = _matrix(tmp_path, {"a": _noise}, tuning=_tuning(points, chosen=1))
    (row,) = _found(out)["reliability"]
    expected = stats.norm.cdf(0.02 / math.sqrt(2 * 0.05 ** 2))  # P(the chosen mean's redraw beats the other's)
    assert row["probability"] == pytest.approx(expected, abs=0.01) and row["points"] == 3
    p = f"{row['probability']:.2f}"
    assert flags.lines(_found(out)) == [f"Tuning reliability on t: a rerun of the tuning picks the same point with "
                                        f"probability {p}; under 0.90 for 1 of 1 variants (`a` {p})."]


def test_a_point_with_one_seed_leaves_the_reliability_unknown(tmp_path):
    cells, table = _tuning(CLEAN_TUNING, chosen=1)
    out = _matrix(tmp_path, {"a": _noise}, tuning=(cells[1:], table))  # the first point's seed 100 never ran
    assert [r["probability"] for r in _found(out)["reliability"]] == [None]


def test_the_report_lists_what_fires(tmp_path):
    out = _matrix(tmp_path, {"a": _noise, "b": lambda s: {"mu": 2, "noise": 0.1 + 0.01 * s, "step_noise": 1.0}})
    report(out, plot=False)
    section = (out / "README.md").read_text().split("#### Flags")[1].split("\n\n")[2]
    assert section == "- Optimizer updates per cell differ at 64 completions on t: `a` 4, `b` 8."


def test_an_empty_steps_frame_has_no_pairs():
    assert flags.identical_pairs(pd.DataFrame()) == []


def test_a_tuning_stage_page_flags_its_tuning_cells(tmp_path):
    cells, _ = _tuning(CLEAN_TUNING, chosen=1, host=XEON)
    cells[0][1]["config"]["environment"]["device_name"] = EPYC
    out = _matrix(tmp_path, {}, tuning=(cells, None))
    data = report(out, plot=False)
    assert "tuning_stage" in data and data["flags"]["hosts"][0]["tuning"] == {f"{XEON}, AVX512": 5,
                                                                             f"{EPYC}, AVX512": 1}
    page = (out / "README.md").read_text()
    assert page.endswith(f"- Mixed hosts on t (bf16): tuning cells on {XEON}, AVX512 x5; {EPYC}, AVX512 x1.\n")
