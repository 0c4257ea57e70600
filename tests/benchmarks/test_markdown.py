"""results/checks.md's index (``grpo-bench readme``): the reports it lists are data (results/reports.toml), each row's
headline and command are read from the report itself, and a retired command's row names the last commit that ran it."""

import pytest

from benchmarks import markdown
from benchmarks.errors import UsageError
from tests.conftest import ROOT


def _entry(path: str, what: str, command: str, retired: str = "") -> str:
    return f'[[report]]\npath = "{path}"\nwhat = "{what}"\ncommand = "{command}"\n' + (
        f'retired = "{retired}"\n' if retired else "")


def test_the_index_names_the_command_the_report_says_wrote_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()
    results = tmp_path / "results"
    (results / "a.md").write_text("# A\n\n**Headline a.**\n\nWritten by `grpo-bench calibration x y --sims 1000`.\n")
    (results / "b.md").write_text("# B\n\n**Headline b.**\n\nRegenerate: `grpo-bench bench roof --threads 1`\n")
    (tmp_path / "results" / "c.md").write_text("# C\n\n**Headline c.**\n")
    (tmp_path / "results" / "e.md").write_text("# E, its title\n\nRegenerate: `grpo-bench survey --out results`\n")
    index = tmp_path / "results" / "reports.toml"
    index.write_text("\n".join([_entry("results/a.md", "A", "grpo-bench calibration x"),
                                _entry("results/b.md", "B", "grpo-bench bench roof"),
                                _entry("results/c.md", "C", "grpo-bench check c"),
                                _entry("results/d.md", "D", "grpo-bench check d"),
                                _entry("results/e.md", "E", "grpo-bench survey", retired="abc1234")]))
    readme = tmp_path / "results" / "checks.md"
    readme.write_text("# Checks\n")
    lines = markdown.index_reports(readme, index=index)
    text = readme.read_text()
    assert "| [A](a.md) | **Headline a.** | `grpo-bench calibration x y --sims 1000` |" in text
    assert "| [B](b.md) | **Headline b.** | `grpo-bench bench roof --threads 1` |" in text
    assert "| [C](c.md) | **Headline c.** | `grpo-bench check c` |" in text  # no line of its own: the index's
    assert "| [E](e.md) | E, its title | `grpo-bench survey --out results` (retired; last run at abc1234) |" in text
    assert text.index("[A]") < text.index("[B]") < text.index("[C]") < text.index("[E]")  # the index's order
    assert "results/d.md not written yet" in lines[0] and "[D]" not in text
    assert lines[-1].endswith("section checks <- 4 reports")


@pytest.mark.parametrize("content, problem", [
    ("[[report]]\npath = \"results/a.md\"\nwhat = \"A\"\n", "report 1 needs a path, what and command"),
    ("[[report]\n", "not a readable index of reports"),
    (None, "not a readable index of reports"),
])
def test_a_bad_index_is_one_line(tmp_path, content, problem):
    index = tmp_path / "reports.toml"
    if content is not None:
        index.write_text(content)
    with pytest.raises(UsageError, match=problem) as caught:
        markdown.indexed_reports(index)
    assert "\n" not in str(caught.value)


def test_the_committed_index_lists_written_reports_and_dates_each_retired_one():
    entries = markdown.indexed_reports(ROOT / markdown.REPORTS_INDEX)
    assert len({e["path"] for e in entries}) == len(entries) and all((ROOT / e["path"]).is_file() for e in entries)
    retired = {e["path"]: e["retired"] for e in entries if "retired" in e}
    assert retired["results/shape/report.md"] == "9fb5d1f" and retired["results/mu1/report.md"] == "1d7c1ed"
    assert len(retired) == 23
