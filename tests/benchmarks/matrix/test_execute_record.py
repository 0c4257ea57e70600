"""The matrix's run record: an output folder it may write, a resume that keeps what finished, a pre-registration it
can show, safe cell folders, a full disk, and the code each cell ran (committed or marked dirty). The cells are
played by a one-line child that writes a finished summary (no training): these tests are about the record."""

import errno
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.cli.main import main
from benchmarks.errors import UsageError
from benchmarks.matrix import execute, parse
from benchmarks.store import ResultStore

FINISHED = ("import json, sys; open(sys.argv[1] + '/summary.json', 'w').write(json.dumps({'status': 'complete', "
            "'steps': 2, 'accuracy_before': 0.1, 'accuracy_after': 0.9, 'reward_before': 0.4, 'reward_after': 3.6, "
            "'completions_generated': 64, 'wall_clock_s': 1.0, 'peak_memory_bytes': 2**20}))")

TWO_VARIANTS = """\
seeds = [0, 1]
budget = 64

[tasks.pizza]
eval_samples = 16

[algorithms.grpo]

[algorithms.rloo]
"""


@pytest.fixture
def fake_cells(monkeypatch):
    """Every cell's process is FINISHED; returns the list of cell folders that ran, in order."""
    ran = []

    def command(cell_dir, resume, threads=0):
        ran.append(Path(cell_dir))
        return [sys.executable, "-c", FINISHED, str(cell_dir)]

    monkeypatch.setattr(execute, "cell_command", command)
    return ran


def _plan(tmp_path, text=TWO_VARIANTS, name="m.toml"):
    path = tmp_path / name
    path.write_text(text)
    return parse(path)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


# ------------------------------------------------------------------------------------------------
# The output folder: never the checkout, the current directory by accident, or a folder of someone else's files
# ------------------------------------------------------------------------------------------------


def test_an_empty_out_is_refused_and_the_current_folder_is_left_alone(tmp_path, monkeypatch, capsys, fake_cells):
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("[project]\nname = 'mine'\n")
    (project / "README.md").write_text("# my project\n")
    _plan(tmp_path)
    monkeypatch.chdir(project)
    code = main(["matrix", str(tmp_path / "m.toml"), "--out", "", "--executor", "subprocess", "--no-progress",
                 "--no-report", "--allow-dirty"])
    assert code == 2
    assert "--out is empty" in _one_line(capsys)  # not read as "." (here a project, refused for that too)
    assert sorted(p.name for p in project.iterdir()) == ["README.md", "pyproject.toml"]
    assert (project / "README.md").read_text() == "# my project\n"
    assert not fake_cells


@pytest.mark.parametrize("marker", ["pyproject.toml", ".git"])
def test_a_folder_holding_a_project_is_refused(tmp_path, marker, fake_cells):
    out = tmp_path / "out"
    out.mkdir()
    (out / marker).write_text("")
    with pytest.raises(UsageError, match="project"):
        execute.run_matrix(_plan(tmp_path), out, progress=False, allow_dirty=True)
    assert sorted(p.name for p in out.iterdir()) == [marker] and not fake_cells


def test_the_checkout_itself_is_refused(tmp_path, monkeypatch, fake_cells):
    checkout = tmp_path / "checkout"  # stands for the project's (a refusal that failed would write there)
    checkout.mkdir()
    (checkout / "notes.txt").write_text("")
    monkeypatch.setattr(execute, "CODE_ROOT", checkout)
    with pytest.raises(UsageError, match="checkout"):
        execute.run_matrix(_plan(tmp_path), checkout, progress=False, allow_dirty=True)
    assert sorted(p.name for p in checkout.iterdir()) == ["notes.txt"] and not fake_cells


def test_a_folder_of_files_the_tool_did_not_write_is_refused(tmp_path, fake_cells):
    out = tmp_path / "out"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    with pytest.raises(UsageError, match="thesis.tex"):
        execute.run_matrix(_plan(tmp_path), out, progress=False, allow_dirty=True)
    assert (out / "thesis.tex").read_text() == "years of work" and not (out / "matrix.json").exists()


def test_a_readme_the_tool_did_not_write_is_never_replaced(tmp_path, capsys, fake_cells):
    out = tmp_path / "d"
    out.mkdir()
    (out / "README.md").write_text("my notes\n")
    _plan(tmp_path)
    code = main(["matrix", str(tmp_path / "m.toml"), "--out", str(out), "--executor", "subprocess", "--no-progress",
                 "--allow-dirty"])
    assert code == 2
    assert "README.md" in _one_line(capsys)
    assert (out / "README.md").read_text() == "my notes\n" and not fake_cells
    # ``report`` on a matrix folder holding someone's README refuses too
    out2 = tmp_path / "done"
    assert execute.run_matrix(_plan(tmp_path), out2, progress=False, allow_dirty=True)["complete"] == 4
    (out2 / "README.md").write_text("my notes\n")
    assert main(["report", str(out2), "--no-plots"]) == 2
    assert "README.md" in _one_line(capsys) and (out2 / "README.md").read_text() == "my notes\n"


def test_a_folder_the_tool_wrote_is_resumed_and_overwritten(tmp_path, fake_cells):
    out = tmp_path / "out"
    plan = _plan(tmp_path)
    assert execute.run_matrix(plan, out, progress=False, allow_dirty=True)["complete"] == 4
    (out / "README.md").write_text("# grpo-bench results\n\nthe report\n")  # as the report writes it
    assert execute.run_matrix(plan, out, resume=True, progress=False, allow_dirty=True)["skipped"] == 4
    assert execute.run_matrix(plan, out, overwrite=True, progress=False, allow_dirty=True)["complete"] == 4


# ------------------------------------------------------------------------------------------------
# --resume with an edited matrix: the store keeps what finished
# ------------------------------------------------------------------------------------------------


def test_a_resume_never_deletes_finished_cells_of_a_variant_the_file_dropped(tmp_path, capsys, fake_cells):
    out = tmp_path / "out"
    assert execute.run_matrix(_plan(tmp_path), out, progress=False, allow_dirty=True)["complete"] == 4
    fewer = _plan(tmp_path, TWO_VARIANTS.replace("[algorithms.rloo]\n", ""))
    capsys.readouterr()
    counts = execute.run_matrix(fewer, out, resume=True, progress=False, allow_dirty=True)
    assert counts == {"complete": 0, "failed": 0, "skipped": 2}
    said = capsys.readouterr()
    assert "2 finished cell(s)" in said.out + said.err and "kept" in said.out + said.err
    assert sorted(ResultStore.open(out).cells) == ["pizza/grpo/seed0", "pizza/grpo/seed1", "pizza/rloo/seed0",
                                                   "pizza/rloo/seed1"]
    # the variant put back: its cells are there, finished, not run again
    del fake_cells[:]
    counts = execute.run_matrix(_plan(tmp_path), out, resume=True, progress=False, allow_dirty=True)
    assert counts == {"complete": 0, "failed": 0, "skipped": 4} and not fake_cells


def test_a_resume_that_would_replace_finished_cells_names_them_and_needs_overwrite(tmp_path, fake_cells):
    out = tmp_path / "out"
    assert execute.run_matrix(_plan(tmp_path), out, progress=False, allow_dirty=True)["complete"] == 4
    before = {k: v["summary"]["finished_at"] for k, v in ResultStore.open(out).cells.items()}
    changed = _plan(tmp_path, TWO_VARIANTS.replace("[algorithms.rloo]\n", "[algorithms.rloo]\nlearning_rate = 0.5\n"))
    del fake_cells[:]
    with pytest.raises(UsageError) as refused:
        execute.run_matrix(changed, out, resume=True, progress=False, allow_dirty=True)
    message = str(refused.value)
    assert "2 finished cell(s)" in message and "pizza/rloo/seed0" in message and "--overwrite" in message
    assert not fake_cells
    assert {k: v["summary"]["finished_at"] for k, v in ResultStore.open(out).cells.items()} == before
    # asked for: the changed cells run again, the others are kept
    counts = execute.run_matrix(changed, out, resume=True, overwrite=True, progress=False, allow_dirty=True)
    assert counts == {"complete": 2, "failed": 0, "skipped": 2}
    assert sorted(p.relative_to(out).as_posix() for p in fake_cells) == ["pizza/rloo/seed0", "pizza/rloo/seed1"]
    assert ResultStore.open(out).spec("pizza/rloo/seed0")["settings"]["learning_rate"] == 0.5


# ------------------------------------------------------------------------------------------------
# The pre-registration: recorded in the store before the first cell, never faked by a lost matrix.json
# ------------------------------------------------------------------------------------------------

ANALYSIS = "\n[analysis]\nmargin = 0.05\n"


def test_a_lost_matrix_json_is_rebuilt_from_the_store_without_faking_a_pre_registration(tmp_path, fake_cells):
    out = tmp_path / "out"
    plan = _plan(tmp_path, TWO_VARIANTS + ANALYSIS)
    execute.run_matrix(plan, out, progress=False, allow_dirty=True, procedure="pairs-test")
    first = json.loads((out / "matrix.json").read_text())
    stated_at = first["analysis"]["stated_at"]
    finished = [ResultStore.open(out).summary(c["dir"])["finished_at"] for c in first["cells"]]
    assert stated_at and stated_at <= min(finished)  # recorded before the first cell ended
    assert first["analysis"]["procedure"] == "pairs-test"
    assert ResultStore.open(out).record["analysis"] == first["analysis"]  # kept in the store too
    (out / "matrix.json").unlink()
    execute.run_matrix(plan, out, resume=True, progress=False, allow_dirty=True)
    rebuilt = json.loads((out / "matrix.json").read_text())
    assert rebuilt["rebuilt"] is True
    # the store's own record shows when the analysis was stated: that, never the time of the rebuild
    assert rebuilt["analysis"]["stated_at"] == stated_at
    # and the run history survives: the first session's cells and seconds
    assert rebuilt["sessions"][0]["cells_run"] == 4
    assert rebuilt["sessions"][0]["elapsed_s"] == first["sessions"][0]["elapsed_s"]


def test_a_store_without_its_record_claims_no_pre_registration(tmp_path, fake_cells):
    out = tmp_path / "out"
    plan = _plan(tmp_path, TWO_VARIANTS + ANALYSIS)
    execute.run_matrix(plan, out, progress=False, allow_dirty=True)
    store = ResultStore.open(out)
    store.record = {}  # a store written before the record existed
    store.write()
    (out / "matrix.json").unlink()
    execute.run_matrix(plan, out, resume=True, progress=False, allow_dirty=True)
    rebuilt = json.loads((out / "matrix.json").read_text())
    assert rebuilt["rebuilt"] is True and rebuilt["analysis"]["stated_at"] is None


def test_an_analysis_changed_after_cells_ran_is_refused_even_without_matrix_json(tmp_path, fake_cells):
    out = tmp_path / "out"
    execute.run_matrix(_plan(tmp_path, TWO_VARIANTS + ANALYSIS), out, progress=False, allow_dirty=True)
    (out / "matrix.json").unlink()
    moved = _plan(tmp_path, TWO_VARIANTS + ANALYSIS.replace("0.05", "0.2"))
    with pytest.raises(UsageError, match="analysis"):
        execute.run_matrix(moved, out, resume=True, progress=False, allow_dirty=True)
    # --overwrite: asked for; stated after cells ran, so not a pre-registration
    execute.run_matrix(moved, out, resume=True, overwrite=True, progress=False, allow_dirty=True)
    analysis = json.loads((out / "matrix.json").read_text())["analysis"]
    assert analysis["margin"] == 0.2 and analysis["stated_at"] is None


# ------------------------------------------------------------------------------------------------
# Cell folders: a variant's name is one safe path component
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["..", "."])
def test_a_variant_named_dot_or_dot_dot_is_refused(tmp_path, capsys, name):
    path = tmp_path / "m.toml"
    path.write_text(f'seeds = [0]\nbudget = 64\n[tasks.pizza]\n[tasks.bandit]\n[algorithms."{name}"]\nalgo = "grpo"\n')
    assert main(["matrix", str(path), "--out", str(tmp_path / "out"), "--dry-run"]) == 2
    assert name in _one_line(capsys)


# ------------------------------------------------------------------------------------------------
# A full disk: one line, what was kept
# ------------------------------------------------------------------------------------------------


def test_a_full_disk_is_one_line_naming_what_was_kept(tmp_path, monkeypatch, capsys, fake_cells):
    from benchmarks import store as store_module

    out = tmp_path / "out"
    _plan(tmp_path)
    writes = []
    original = store_module.ResultStore.write

    def fills_up(self):
        writes.append(1)
        if sum(1 for c in self.cells.values() if c["summary"].get("status") == "complete") >= 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(self)

    monkeypatch.setattr(store_module.ResultStore, "write", fills_up)
    code = main(["matrix", str(tmp_path / "m.toml"), "--out", str(out), "--executor", "subprocess", "--no-progress",
                 "--allow-dirty"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "No space left on device" in err and "1 finished cell" in err
    monkeypatch.setattr(store_module.ResultStore, "write", original)
    assert sorted(ResultStore.open(out).cells) == ["pizza/grpo/seed0"]


# ------------------------------------------------------------------------------------------------
# Provenance: committed code only, or marked dirty with the diff's hash
# ------------------------------------------------------------------------------------------------


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A git checkout standing for the project's: the matrix reads its state as the code the cells run."""
    repo = tmp_path / "checkout"
    (repo / "algorithms").mkdir(parents=True)
    (repo / "algorithms" / "loss.py").write_text("x = 1\n")
    (repo / "README.md").write_text("docs\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    monkeypatch.setattr(execute, "CODE_ROOT", repo)
    return repo


def test_a_dirty_checkout_is_refused_naming_allow_dirty(tmp_path, checkout, capsys, fake_cells):
    (checkout / "algorithms" / "loss.py").write_text("x = 2\n")
    _plan(tmp_path)
    assert main(["matrix", str(tmp_path / "m.toml"), "--out", str(tmp_path / "out"), "--executor", "subprocess",
                 "--no-progress"]) == 2
    assert "--allow-dirty" in _one_line(capsys)
    assert not fake_cells and not (tmp_path / "out" / "matrix.json").exists()


def test_an_untracked_code_file_is_dirty_too(tmp_path, checkout, fake_cells):
    (checkout / "algorithms" / "new_loss.py").write_text("y = 1\n")
    with pytest.raises(UsageError, match="--allow-dirty"):
        execute.run_matrix(_plan(tmp_path), tmp_path / "out", progress=False)


def test_allow_dirty_marks_every_cell_with_the_diffs_hash(tmp_path, checkout, fake_cells):
    (checkout / "algorithms" / "loss.py").write_text("x = 2\n")
    out = tmp_path / "out"
    assert execute.run_matrix(_plan(tmp_path), out, progress=False, allow_dirty=True)["complete"] == 4
    head = _git(checkout, "rev-parse", "HEAD").strip()
    diff = subprocess.run(["git", "-C", str(checkout), "diff", "HEAD", "--binary"], capture_output=True).stdout
    store = ResultStore.open(out)
    for relpath in store.cells:
        summary = store.summary(relpath)
        assert summary["commit"] == head and summary["dirty"] is True
        assert len(summary["diff_hash"]) == 64 and summary["diff_hash"] != hashlib.sha256(b"").hexdigest()
    # the hash is the diff's: the same diff, the same hash; another diff, another hash
    hashes = {store.summary(r)["diff_hash"] for r in store.cells}
    assert len(hashes) == 1 and diff
    (checkout / "algorithms" / "loss.py").write_text("x = 3\n")
    execute.run_matrix(_plan(tmp_path), out, overwrite=True, progress=False, allow_dirty=True)
    assert {ResultStore.open(out).summary(r)["diff_hash"] for r in store.cells}.isdisjoint(hashes)


def test_a_clean_checkout_runs_and_records_its_commit(tmp_path, checkout, capsys, fake_cells):
    out = tmp_path / "out"
    (checkout / "results").mkdir()
    (checkout / "README.md").write_text("docs edited while a matrix runs\n")  # not code
    assert execute.run_matrix(_plan(tmp_path), out, progress=False)["complete"] == 4
    head = _git(checkout, "rev-parse", "HEAD").strip()
    store = ResultStore.open(out)
    assert all(store.summary(r)["commit"] == head and store.summary(r)["dirty"] is False
               and store.summary(r)["diff_hash"] == "" for r in store.cells)
    # a new commit, then --resume: one line says the matrix now mixes code versions (not refused)
    (checkout / "algorithms" / "loss.py").write_text("x = 2\n")
    _git(checkout, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "second")
    store.put("pizza/rloo/seed1", store.spec("pizza/rloo/seed1"), {"status": "failed"}, [])  # one cell to run
    (out / "pizza/rloo/seed1/summary.json").unlink()
    capsys.readouterr()
    counts = execute.run_matrix(_plan(tmp_path), out, resume=True, progress=False)
    assert counts == {"complete": 1, "failed": 0, "skipped": 3}
    said = capsys.readouterr()
    assert "mixes code versions" in said.out + said.err
    assert ResultStore.open(out).summary("pizza/rloo/seed1")["commit"] == _git(checkout, "rev-parse", "HEAD").strip()


def test_outside_a_git_checkout_needs_allow_dirty(tmp_path, monkeypatch, fake_cells):
    monkeypatch.setattr(execute, "CODE_ROOT", tmp_path / "installed")
    (tmp_path / "installed").mkdir()
    with pytest.raises(UsageError, match="no commit.*--allow-dirty|--allow-dirty.*no commit"):
        execute.run_matrix(_plan(tmp_path), tmp_path / "out", progress=False)
    assert execute.run_matrix(_plan(tmp_path), tmp_path / "out", progress=False, allow_dirty=True)["complete"] == 4
    summary = ResultStore.open(tmp_path / "out").summary("pizza/grpo/seed0")
    assert summary["dirty"] is True and summary["commit"] == "" and summary["diff_hash"] == ""
