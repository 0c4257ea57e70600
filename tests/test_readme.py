"""The README's set-up commands are the ones CI runs (.ci/run reads them from the README)."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands():
    spec = importlib.util.spec_from_file_location("readme_commands", ROOT / ".ci" / "readme_commands.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_has_the_two_commands_ci_runs():
    module = _readme_commands()
    commands = module.commands()
    assert commands["main"].startswith("pip install torch==2.13.0 && pip install -e .")
    assert module.DEFAULT_MATRIX in commands["main"] and module.DEFAULT_OUT in commands["main"]
    assert (ROOT / module.DEFAULT_MATRIX).is_file()
    assert commands["tests"].startswith("pip install torch==2.13.0 && ") and commands["tests"].endswith("pytest tests")
    # the fast tier's extra stays small: the trackers and cluster engines are the integration tests' own extra
    assert "integrations" not in commands["tests"] and '".[integrations]"' in commands["integrations"]
    assert "-m \"integration" in commands["integrations"]


def test_ci_runs_the_readme_commands_not_a_copy():
    ci = (ROOT / ".ci" / "run").read_text()
    assert all(f"readme_commands.py {which}" in ci for which in ("main", "tests", "integrations"))
    assert "python3 -m venv" in ci  # a fresh environment, not the machine's Python
    commands = _readme_commands().commands()
    assert all(command not in ci for command in commands.values())


def test_ci_runs_the_main_job_as_written_into_a_scratch_directory(capsys):
    module = _readme_commands()
    module.main(["main", "--out", "/tmp/x"])
    command = capsys.readouterr().out.strip()
    assert module.DEFAULT_MATRIX in command and "--out /tmp/x" in command and module.DEFAULT_OUT not in command
    module.main(["main", "--matrix", "benchmarks/matrices/smoke.toml", "--out", "/tmp/x"])
    command = capsys.readouterr().out.strip()
    assert "benchmarks/matrices/smoke.toml" in command and "default.toml" not in command


def _git(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)


def _ignored(path: str) -> bool:
    """Whether git leaves ``path`` out of ``git status`` here: .gitignore matches it and nothing under it is tracked
    (a tracked file is shown when it changes, ignored or not)."""
    return not _git("ls-files", "--", path).stdout.strip() and _git("check-ignore", "-q", "--", path).returncode == 0


def _main_job_out(command: str) -> str:
    words = shlex.split(command.split("&&")[-1])
    return words[words.index("--out") + 1]


def test_what_the_readme_commands_write_is_ignored_by_git():
    if _git("rev-parse", "--is-inside-work-tree").returncode != 0:
        pytest.skip("not a git checkout")
    out = _main_job_out(_readme_commands().commands()["main"])
    written = [f"{out}/README.md", f"{out}/results.parquet", f"{out}/plots/final_accuracy.png",
               f"{out}/pizza/grpo/seed0/metrics.jsonl",  # the main job's store, report and cells
               ".pytest_cache/v/cache/lastfailed", "grpo_bench.egg-info/PKG-INFO",  # the tests, pip install -e .
               "runs/pizza-grpo-seed0/config.json"]  # `grpo-bench run`'s default folder
    assert [path for path in written if not _ignored(path)] == []
    # the check sees a tracked folder (the committed demo store the main job once rewrote) and an unignored one
    assert not _ignored("results/demo/README.md") and not _ignored("results/new-matrix/README.md")


@pytest.mark.slow  # the main job on the smoke matrix in a copy of the checkout: about 90 s
def test_the_main_job_leaves_a_fresh_checkout_clean(tmp_path):
    if _git("rev-parse", "--is-inside-work-tree").returncode != 0:
        pytest.skip("not a git checkout")
    copy = tmp_path / "checkout"
    for name in _git("ls-files", "--cached", "--others", "--exclude-standard", "-z").stdout.split("\0"):
        if name and (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "copy"]):
        assert _git(*args, cwd=copy).returncode == 0
    module = _readme_commands()
    command = module.commands()["main"].replace(module.DEFAULT_MATRIX, "benchmarks/matrices/smoke.toml")
    words = shlex.split(command.split("&&")[-1])  # past the pip installs: this environment has them
    assert words[0] == "grpo-bench"
    done = subprocess.run([sys.executable, "-m", "benchmarks.cli.main", *words[1:]], cwd=copy, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(copy)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert (copy / _main_job_out(command) / "README.md").is_file()
    assert _git("status", "--porcelain", "--untracked-files=all", cwd=copy).stdout == ""


def _layout_rows() -> dict[str, str]:
    """The Layout table (benchmarks/README.md, beside the code it describes): folder cell -> modules cell."""
    text = (ROOT / "benchmarks" / "README.md").read_text()
    section = text[text.index("## Layout"):]
    section = section[: section.index("\n## ", 1)]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            rows[cells[0]] = cells[1]
    return rows


def _named_modules(rows: dict[str, str]) -> set[str]:
    """Every module the table names, as a path: `name.py` in a folder's row (the bottom row is benchmarks/)."""
    import re

    named = set()
    for folder_cell, modules in rows.items():
        folder = re.match(r"`([\w/]+)/`", folder_cell)
        if not folder:
            continue
        for name in re.findall(r"`([\w]+\.py)`", modules):
            named.add(f"{folder.group(1)}/{name}")
    return named


def _tree_modules() -> set[str]:
    found = set()
    for package in ("algorithms", "tasks", "benchmarks"):
        for path in (ROOT / package).rglob("*.py"):
            if path.name != "__init__.py" and "__pycache__" not in path.parts:
                found.add(path.relative_to(ROOT).as_posix())
    return found


def test_the_layout_table_names_every_module_and_only_modules_that_exist():
    named, tree = _named_modules(_layout_rows()), _tree_modules()
    assert not tree - named, f"modules the Layout table (benchmarks/README.md) leaves out: {sorted(tree - named)}"
    assert not named - tree, f"modules the Layout table (benchmarks/README.md) names that do not exist: {sorted(named - tree)}"


def test_the_layout_check_can_fail():
    rows = _layout_rows()
    first = next(iter(rows))
    shrunk = {**rows, first: rows[first].replace("`losses.py`", "")}
    assert "algorithms/losses.py" in _tree_modules() - _named_modules(shrunk)
    grown = {**rows, first: rows[first] + " `imaginary.py`"}
    assert "algorithms/imaginary.py" in _named_modules(grown) - _tree_modules()


FRONT = "front-answer"  # the front page's section that `grpo-bench brief --front README.md` writes
FIRST_SCREEN = 60  # lines


def _brief_command() -> list[str]:
    """The brief's command as the tool recorded it on its page (results/reasoning-gym/verdict.md's Regenerate line)."""
    import shlex

    page = (ROOT / "results" / "reasoning-gym" / "verdict.md").read_text()
    return shlex.split(page.split("Regenerate: `")[1].split("`")[0])


def _fresh_answer(command: list[str]) -> str:
    """The front page's answer as the tool writes it from the committed result stores now: the recorded command's
    skills, page and front page (the bootstrap's resamples do not reach the answer's numbers: fewer of them here)."""
    from benchmarks.report.brief import front, read_matrix, skill

    directories = [ROOT / d for d in command[2:command.index(next(a for a in command[2:] if a.startswith("--")))]]
    out, page = ROOT / command[command.index("--out") + 1], ROOT / command[command.index("--front") + 1]
    result = {"skills": [skill(read_matrix(d, reps=200), d.relative_to(ROOT)) for d in directories]}
    return front(result, page.parent, figure_path=out.with_suffix(".png"), page=out)


def front_page_problems(text: str, fresh: str) -> list[str]:
    """What keeps the README's first screen from being the answer: the tool's section (``fresh``, the tables and the
    figure) missing, stale, after the findings or not in the first 60 lines, or its figure file missing."""
    lines = text.splitlines()
    start, end = f"<!-- grpo-bench:{FRONT} -->", f"<!-- /grpo-bench:{FRONT} -->"
    if lines.count(start) != 1 or lines.count(end) != 1:
        return ["no single front-answer section"]
    a, b = lines.index(start), lines.index(end)
    problems = []
    if "\n".join(lines[a + 1:b]) + "\n" != fresh:
        problems.append("the answer is not what grpo-bench brief writes from the committed stores now")
    findings = [i for i, line in enumerate(lines) if line.startswith("## What the suite found")]
    if not findings or findings[0] < b:
        problems.append("the answer does not come before the findings")
    set_up = next(i for i, line in enumerate(lines) if line.startswith("```bash"))
    if [line for line in lines[set_up:a] if line.startswith("## ")][1:]:
        problems.append("a section stands between the set-up commands and the answer")
    tables = [i for i in range(a, b) if lines[i].startswith("| ")]
    figures = re.findall(r"!\[[^]]*\]\(([^)]+\.png)\)", "\n".join(lines[a:b]))
    if not tables or tables[-1] >= FIRST_SCREEN:
        problems.append(f"the answer's tables are not within the first {FIRST_SCREEN} lines")
    shown = [i for i in range(a, b) if lines[i].startswith("![")]
    if len(figures) != 1 or shown[0] >= FIRST_SCREEN:
        problems.append(f"no one figure within the first {FIRST_SCREEN} lines")
    elif not ((ROOT / figures[0]).is_file() and (ROOT / figures[0]).read_bytes().startswith(b"\x89PNG")):
        problems.append(f"the figure {figures[0]} is missing")
    return problems


@pytest.fixture(scope="module")
def fresh_answer():
    return _fresh_answer(_brief_command())


def test_the_front_page_answers_first_with_the_tables_and_figure_the_tool_writes_from_the_stores(fresh_answer):
    assert "--front" in _brief_command() and "README.md" in _brief_command()
    assert front_page_problems((ROOT / "README.md").read_text(), fresh_answer) == []


def test_the_front_page_check_fails_on_a_stale_late_or_figureless_answer(fresh_answer):
    text = (ROOT / "README.md").read_text()
    section = text[text.index(f"<!-- grpo-bench:{FRONT} -->"):text.index(f"<!-- /grpo-bench:{FRONT} -->")]
    row = next(line for line in section.splitlines() if line.startswith("| `"))
    stale = text.replace(row, row.replace(" | ", " | 0", 1))
    assert front_page_problems(stale, fresh_answer) == [
        "the answer is not what grpo-bench brief writes from the committed stores now"]
    late = text.replace("## Set up and run", "\n" * FIRST_SCREEN + "## Set up and run")
    assert front_page_problems(late, fresh_answer) == [
        f"the answer's tables are not within the first {FIRST_SCREEN} lines", f"no one figure within the first {FIRST_SCREEN} lines"]
    findings = text[text.index("## What the suite found"):text.index("## Glossary")]
    moved = text.replace(findings, "").replace("## Set up and run", findings + "## Set up and run")
    assert "the answer does not come before the findings" in front_page_problems(moved, fresh_answer)
    figure = re.search(r"!\[[^]]*\]\(([^)]+\.png)\)", section).group(1)
    assert front_page_problems(text.replace(figure, "results/none.png"), fresh_answer) == [
        "the answer is not what grpo-bench brief writes from the committed stores now",
        "the figure results/none.png is missing"]


def test_the_front_page_links_resolve():
    import re

    text = (ROOT / "README.md").read_text()
    targets = {t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if not t.startswith(("http", "#"))}
    missing = sorted(t for t in targets if not (ROOT / t).exists())
    assert not missing, f"README.md links to paths that do not exist: {missing}"


def test_tool_written_sections_live_on_their_pages_and_the_defaults_point_there():
    from benchmarks.perf.vs_trl import PerfSettings
    from benchmarks.commands import ReadmeSettings

    front = (ROOT / "README.md").read_text()
    assert re.findall(r"<!-- grpo-bench:(\S+) -->", front) == [FRONT]  # the answer, `grpo-bench brief --front`'s
    checks = (ROOT / "results" / "checks.md").read_text()
    for name in ("checks", "perf", "features"):
        assert f"<!-- grpo-bench:{name} -->" in checks and f"<!-- /grpo-bench:{name} -->" in checks
    results = (ROOT / "results" / "README.md").read_text()
    for name in ("matrix-verdicts-tuned-verdicts", "matrix-reasoning-gym-verdicts", "matrix-ppo-ties-verdicts"):
        assert results.count(f"<!-- grpo-bench:{name} -->") == 1 and results.count(f"<!-- /grpo-bench:{name} -->") == 1
    from benchmarks.perf.commands import GrpoVsTrl

    assert GrpoVsTrl().readme_section(PerfSettings(device="cpu"))[0] == "results/checks.md"  # with the default --out
    assert ReadmeSettings.readme == "results/checks.md"


def test_the_test_extra_leaves_the_trackers_and_cluster_engines_to_the_integrations_extra():
    import re
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def closure(name: str) -> set[str]:  # the requirement names an extra pulls, through grpo-bench[...] references
        names = set()
        for requirement in extras[name]:
            if requirement.startswith("grpo-bench["):
                for inner in requirement[len("grpo-bench["):-1].split(","):
                    names |= closure(inner)
            else:
                names.add(re.split(r"[<>=!\[; ]", requirement, maxsplit=1)[0] + ("[" if "[" in requirement else ""))
        return names

    fast = closure("test")
    assert not fast & {"wandb", "trackio", "tensorboard", "submitit", "ray["}, fast  # bare ray only (references)
    assert {"wandb", "trackio", "tensorboard", "submitit", "ray["} <= closure("integrations")
