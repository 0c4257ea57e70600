"""results/checks.md's index (``grpo-bench readme``): each report's row names the command that wrote it as it
stands, read from the report, not a command typed once into the index's table."""

from benchmarks import markdown


def test_the_index_names_the_command_the_report_says_wrote_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "a.md").write_text("# A\n\n**Headline a.**\n\nWritten by `grpo-bench calibration x y --sims 1000`.\n")
    (tmp_path / "results" / "b.md").write_text("# B\n\n**Headline b.**\n\nRegenerate: `grpo-bench bench roof --threads 1`\n")
    (tmp_path / "results" / "c.md").write_text("# C\n\n**Headline c.**\n")
    monkeypatch.setattr(markdown, "REPORTS", (("results/a.md", "A", "grpo-bench calibration x"),
                                              ("results/b.md", "B", "grpo-bench bench roof"),
                                              ("results/c.md", "C", "grpo-bench check c"),
                                              ("results/d.md", "D", "grpo-bench check d")))
    readme = tmp_path / "results" / "checks.md"
    readme.write_text("# Checks\n")
    lines = markdown.index_reports(readme)
    text = readme.read_text()
    assert "| [A](a.md) | **Headline a.** | `grpo-bench calibration x y --sims 1000` |" in text
    assert "| [B](b.md) | **Headline b.** | `grpo-bench bench roof --threads 1` |" in text
    assert "| [C](c.md) | **Headline c.** | `grpo-bench check c` |" in text  # no line of its own: the table's
    assert "results/d.md not written yet" in lines[0] and "[D]" not in text
