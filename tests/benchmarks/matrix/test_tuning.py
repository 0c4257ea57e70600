"""Tuned baselines: a matrix's [tuning] grid runs on its own seeds, each variant's evaluation seeds run at the
point of highest mean AUC, a resumed matrix chooses the same points and re-runs nothing, and the report shows
the grid with the chosen point and the sensitivity."""

import json
import shutil

import pytest

from benchmarks.matrix import parse, run_matrix
from benchmarks.matrix.plan import MatrixError
from benchmarks.curve import accuracy_curve, normalised_auc
from benchmarks.matrix.tuning import choose
from benchmarks.store import ResultStore

MATRIX = """\
seeds = [0]
budget = 64
eval_every = 32
device = "cpu"

[tuning]
seeds = [10, 11]
learning_rate = [1e-5, 1e-3]

[tuning.algorithms.dpo]
beta = [0.1, 0.5]

[tasks.pizza]
eval_samples = 8

[algorithms.grpo]
[algorithms.dpo]
"""


def _plan(tmp_path, text=MATRIX):
    path = tmp_path / "m.toml"
    path.write_text(text)
    return parse(path)


def _warm():
    """Warm workers, two at a time: a fresh process per cell would spend most of the test importing torch."""
    from benchmarks.matrix.executors import make_executor

    return make_executor("local", jobs=2)


def test_the_grid_is_each_tables_product_on_the_tuning_seeds(tmp_path):
    plan = _plan(tmp_path)
    assert plan.cells == [] and plan.tuning_seeds == [10, 11]
    grids = {g.variant: [p for p in g.points] for g in plan.tuning}
    assert grids["grpo"] == [{"learning_rate": 1e-5}, {"learning_rate": 1e-3}]
    assert grids["dpo"] == [{"learning_rate": lr, "beta": b} for lr in (1e-5, 1e-3) for b in (0.1, 0.5)]
    tuning = plan.tuning_cells()
    assert len(tuning) == (2 + 4) * 2 and {c.seed for c in tuning} == {10, 11}
    cell = next(c for c in tuning if c.variant == "dpo" and c.seed == 11 and c.settings["beta"] == 0.5
                and c.settings["learning_rate"] == 1e-3)
    assert cell.relpath == "tune/pizza/dpo/learning_rate=0.001_beta=0.5/seed11"
    assert "tuning_point" not in cell.spec()  # the point is in the settings already
    chosen = plan.choose([1, 2])
    assert [(c.variant, c.seed, c.settings["learning_rate"], c.settings["beta"]) for c in chosen.cells] == [
        ("grpo", 0, 1e-3, 0.04), ("dpo", 0, 1e-3, 0.1)]  # grpo keeps its own default beta
    assert [c.relpath for c in chosen.cells] == ["pizza/grpo/seed0", "pizza/dpo/seed0"]


@pytest.mark.parametrize("edit, words", [
    (("seeds = [10, 11]", "seeds = [0, 11]"), "tuning seeds must differ from the evaluation seeds; both have [0]"),
    (("learning_rate = [1e-5, 1e-3]", "learning_rat = [1e-5]"), "tuning key 'learning_rat' is not an option of grpo"),
    (("learning_rate = [1e-5, 1e-3]", "learning_rate = 1e-5"), "tuning key learning_rate must be a non-empty list"),
    (("[tuning.algorithms.dpo]", "[tuning.algorithms.ppo]"), "no [algorithms.ppo] table to tune"),
    (("seeds = [10, 11]\n", ""), "tuning needs seeds = a list of distinct integers"),
])
def test_a_bad_tuning_table_is_one_line_naming_its_line(tmp_path, edit, words):
    with pytest.raises(MatrixError) as info:
        _plan(tmp_path, MATRIX.replace(*edit))
    message = str(info.value)
    assert words in message and "\n" not in message and message.startswith(f"{tmp_path / 'm.toml'}:")


def _fake_store(tmp_path, finals: dict) -> ResultStore:
    """Tuning cells whose accuracy jumps from 0.2 to ``final`` at the first evaluation (or that failed)."""
    plan = _plan(tmp_path)
    store = ResultStore(tmp_path / "results.parquet", {}, {})
    for group in plan.tuning:
        for i, cells in enumerate(group.tuning_cells):
            for cell in cells:
                final = finals.get((group.variant, i), 0.5)
                status = "failed" if final is None else "complete"
                summary = {"status": status, "accuracy_before": 0.2, "accuracy_after": final or 0.0,
                           "completions_generated": 64}
                rows = [{"step": 1, "completions": 32, "eval/accuracy": final or 0.0}, {"step": 2, "completions": 32}]
                store.cells[cell.relpath] = {"spec": cell.spec(), "summary": summary}
                store.steps[cell.relpath] = rows
    return plan, store


def test_the_point_of_highest_mean_auc_is_chosen_failed_points_never_ties_to_the_first(tmp_path):
    plan, store = _fake_store(tmp_path, {("grpo", 0): 0.9, ("grpo", 1): 0.6,
                                         ("dpo", 0): None, ("dpo", 1): 0.4, ("dpo", 2): 0.7, ("dpo", 3): 0.7})
    chosen, table = choose(plan, store)
    assert chosen == [0, 2]  # dpo: point 0 failed (would score 0 < 0.7 anyway), 2 and 3 tie -> 2
    grpo = table[0]["points"]
    # By hand: (0, 0.2) -> (32, 0.9) -> (64, 0.9) over 64 completions: (0.2 + 0.9) / 2 * 0.5 + 0.9 * 0.5 = 0.725.
    assert grpo[0]["auc"] == pytest.approx(0.725) and grpo[0]["final_accuracy"] == 0.9 and grpo[0]["seeds"] == 2
    assert table[1]["points"][0]["failed"] == 2 and table[1]["points"][0]["seeds"] == 0
    plan, store = _fake_store(tmp_path, {("grpo", 0): None, ("grpo", 1): 0.1})
    assert choose(plan, store)[0][0] == 1  # a failed point loses even to a poor one


def test_accuracy_curve_matches_the_reports_auc():
    summary = {"accuracy_before": 0.25, "accuracy_after": 0.75, "completions_generated": 96}
    rows = [{"completions": 32}, {"completions": 32, "eval/accuracy": 0.5}, {"completions": 32}]
    x, y = accuracy_curve(summary, rows)
    assert x.tolist() == [0, 64, 96] and y.tolist() == [0.25, 0.5, 0.75]
    assert normalised_auc(x, y, 96) == pytest.approx(((0.25 + 0.5) / 2 * 64 + (0.5 + 0.75) / 2 * 32) / 96)


def test_a_tuned_matrix_runs_chooses_resumes_and_reports(tmp_path, capsys):
    # 1e-3 first: the point pizza's 64 completions choose is then not the grid's last (the resume below checks
    # that a finished evaluation cell at any point is kept, where only the last point's were)
    plan = _plan(tmp_path, MATRIX.replace("[tuning.algorithms.dpo]\nbeta = [0.1, 0.5]\n", "")
                 .replace("[algorithms.dpo]\n", "[algorithms.reinforce]\n")
                 .replace("learning_rate = [1e-5, 1e-3]", "learning_rate = [1e-3, 1e-5]"))
    out = tmp_path / "out"
    counts = run_matrix(plan, out, progress=False, executor=_warm(), allow_dirty=True)
    assert counts == {"complete": 4 * 2 + 2, "failed": 0, "skipped": 0}
    meta = json.loads((out / "matrix.json").read_text())
    assert [s["stage"] for s in meta["sessions"]] == ["tuning", "evaluation"]
    store = ResultStore.open(out)
    for group in meta["tuning"]["table"]:
        aucs = [p["auc"] for p in group["points"]]
        assert group["chosen"] == aucs.index(max(aucs))
        # The evaluation cell ran at the chosen learning rate.
        chosen_lr = group["points"][group["chosen"]]["settings"]["learning_rate"]
        assert store.spec(f"pizza/{group['variant']}/seed0")["settings"]["learning_rate"] == chosen_lr
        # And the table's AUC is the one the tuning cells' stored curves give.
        for point in group["points"]:
            cells = point["cells"]
            by_hand = [normalised_auc(*accuracy_curve(store.summary(c), store.metrics(c)), 64) for c in cells]
            assert point["auc"] == pytest.approx(sum(by_hand) / len(by_hand))
    assert [g["chosen"] for g in meta["tuning"]["table"]] == [0, 0]
    made = {c: store.summary(c)["matrix_session"] for c in ("pizza/grpo/seed0", "pizza/reinforce/seed0")}
    assert made == {"pizza/grpo/seed0": 1, "pizza/reinforce/seed0": 1}
    # A clean clone holds the store, not the cells' folders: a resume keeps every finished cell, evaluation cells
    # at whichever grid point the tuning chose included, with the session that made it, and runs none again.
    for relpath in made:
        shutil.rmtree(out / relpath)
    again = run_matrix(plan, out, resume=True, progress=False, executor=_warm(), allow_dirty=True)
    assert again == {"complete": 0, "failed": 0, "skipped": 4 * 2 + 2}
    assert {c: ResultStore.open(out).summary(c)["matrix_session"] for c in made} == made
    # --rerun names an evaluation cell by its path: before the tuning has chosen, it is one of the grid's
    # candidates (a pattern that matched only the tuning cells refused every evaluation cell)
    (out / "pizza/grpo/seed0").mkdir(parents=True, exist_ok=True)
    (out / "pizza/grpo/seed0/stale.txt").write_text("from the first run")
    rerun = run_matrix(plan, out, resume=True,
                       progress=False, executor=_warm(), rerun=["pizza/grpo/seed0"], allow_dirty=True)
    assert rerun == {"complete": 1, "failed": 0, "skipped": 4 * 2 + 1}
    assert not (out / "pizza/grpo/seed0/stale.txt").exists()
    from benchmarks.report.matrix import report

    data = report(out, plot=False)
    assert set(data["analysis"]["tuning"]["variant"]) == {"grpo", "reinforce"}
    text = (out / "README.md").read_text()
    assert "Tuning (2 tuning seed(s), disjoint from the seeds above)" in text and "learning_rate=1e-05: " in text
    assert "on the task's validation problems" in text


def test_a_stored_evaluation_cell_at_any_grid_point_is_still_planned(tmp_path):
    """Before the tuning has chosen, every grid point's candidates share the evaluation cells' paths: a finished
    cell at any of them is kept (only the last point's were, and a resumed clean clone ran the others again)."""
    from benchmarks.matrix.execute import still_planned

    plan = _plan(tmp_path)
    kept = still_planned(plan.cells + plan.tuning_cells() + plan.candidate_cells())
    candidates = plan.candidate_cells()
    assert len({c.relpath for c in candidates}) < len(candidates)  # paths shared across grid points
    assert all(kept(c.relpath, c.spec()) for c in candidates + plan.tuning_cells())
    other = {**candidates[0].spec(), "settings": {**candidates[0].spec()["settings"], "learning_rate": 0.5}}
    assert not kept(candidates[0].relpath, other) and not kept("pizza/ppo/seed0", candidates[0].spec())


def test_a_choice_at_the_edge_of_the_learning_rate_grid_is_flagged():
    from benchmarks.report.verdicts import _tuning_lines, tuning_table

    def group(variant, chosen, rates, betas=(None,)):
        points = [{"point": f"lr={r}" + (f"_beta={b}" if b else ""), "settings": {"learning_rate": r, **({"beta": b} if b else {})},
                   "seeds": 2, "failed": 0, "primary_metric": "last_3", "primary": 0.3 + 0.01 * i, "auc": 0.2,
                   "final_accuracy": 0.3} for i, (r, b) in enumerate((r, b) for r in rates for b in betas)]
        return {"task": "t", "variant": variant, "chosen": chosen, "points": points}

    meta = {"tuning": {"table": [group("top", 2, [1e-6, 1e-5, 1e-4]), group("middle", 1, [1e-6, 1e-5, 1e-4]),
                                 group("dpo", 5, [1e-6, 1e-5, 1e-4], betas=(0.1, 0.3)),  # lr 1e-4, beta 0.3: the edge
                                 group("dpo_mid", 3, [1e-6, 1e-5, 1e-4], betas=(0.1, 0.3)),  # lr 1e-5: inside
                                 group("one", 0, [1e-5])]}}
    table = tuning_table(meta)
    edge = table[table["chosen"]].set_index("variant")["at_edge"].to_dict()
    assert edge == {"top": True, "middle": False, "dpo": True, "dpo_mid": False, "one": False}
    text = "\n".join(_tuning_lines({"tuning": table}, "t"))
    assert "| top | lr=0.0001 (grid edge) |" in text and "| middle | lr=1e-05 |" in text and "*Grid edge*" in text
