"""A matrix report's page trimmed for a reader: the key to its marks and tables written once, in the results folder's
glossary, which each report links; where the numbers come from (device, sessions, code versions, the command) in a
last section; a variant's repeated notes grouped into one line."""

import re
import shutil

import pandas as pd

from benchmarks.report import flags, verdicts
from benchmarks.report.matrix import MEASURED_KEY, PROVENANCE, glossary_text, pair_sample_lines, render, report
from tests.benchmarks.report.test_matrix import matrix_dir  # noqa: F401  (the hand-made matrix, a fixture)

MARKS = "every claim comes from one family of simultaneous 95% intervals"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")


def test_reports_under_results_link_one_glossary_instead_of_repeating_the_key(matrix_dir, tmp_path):  # noqa: F811
    out = tmp_path / "results" / "m"
    shutil.copytree(matrix_dir, out)
    (tmp_path / "results" / "README.md").write_text("# results\n")
    report(out, readme=str(tmp_path / "results" / "README.md"), plot=False, progress=False)  # with its verdicts
    glossary = (tmp_path / "results" / "glossary.md").read_text()
    assert glossary == glossary_text()
    anchors = {_anchor(h) for h in re.findall(r"^## (.+)$", glossary, flags=re.M)}
    assert MARKS in glossary.lower().replace("\n", " ") and MEASURED_KEY.split(";")[0] in glossary.replace("\n", " ")
    assert max(map(len, glossary.splitlines())) <= 120
    for page, link in ((out / "README.md", "../glossary.md"), (tmp_path / "results" / "README.md", "glossary.md")):
        text = page.read_text()
        assert MARKS not in text.lower() and MEASURED_KEY not in text, page  # the key is not repeated
        targets = re.findall(r"\]\(([^)]*glossary\.md)#([^)]+)\)", text)
        assert targets and all(target == link and anchor in anchors for target, anchor in targets), (page, targets)
    assert "#how-to-read-the-marks" in (out / "README.md").read_text()
    assert "#every-measured-number" in (out / "README.md").read_text()


def test_a_report_outside_a_results_folder_keeps_its_key(matrix_dir):  # noqa: F811
    report(matrix_dir, plot=False, progress=False)  # its folder has no results/ above it
    text = (matrix_dir / "README.md").read_text()
    assert verdicts.HOW_TO_READ in text and MEASURED_KEY in text and "glossary" not in text
    assert not (matrix_dir.parent / "glossary.md").exists()


def test_where_the_numbers_come_from_closes_the_report(matrix_dir, tmp_path):  # noqa: F811
    out = tmp_path / "results" / "m"
    shutil.copytree(matrix_dir, out)
    data = report(out, plot=False, progress=False)
    # two commits, one outside the history, and uncommitted changes: provenance, not a flag of the comparison
    data["flags"]["code"].update(commits={"abc1234": 10, "def5678": 8}, not_in_history={"def5678": 8}, dirty=2)
    data["meta"]["file"] = "benchmarks/matrices/x.toml"
    text = render(data, data["summary"], [], "", str(out), glossary="../glossary.md")
    last = text.index(f"### {PROVENANCE}")
    assert last > text.index("#### Every measured number") > text.index("### Verdicts")
    assert text.index("Device: test CPU (fp32)") > last and text.count("Device:") == 1
    history = flags.history_lines(data["flags"])
    assert len(history) == 3 and all(text.index(line) > last for line in history)
    flags_section = text[text.index("#### Flags"):text.index("### Verdicts")]
    assert not any(line in flags_section for line in history)
    assert text.rstrip().endswith(f"grpo-bench report {out}`")  # the command is the last line
    brief = render(data, data["summary"], [], "m/", str(out), brief=True)
    assert "Device:" not in brief and PROVENANCE not in brief and "(m/README.md)" in brief


def test_a_variants_notes_on_several_tasks_are_one_line():
    rows = [{"task": task, "variant": "dpo", "seed": s, "step": step, "completions": 8.0, "pairs/samples": samples}
            for task, samples in (("pizza", 96.0), ("addition", 32.0)) for s in (0, 1) for step in (1, 2)]
    rows += [{"task": "pizza", "variant": "dpo_counted", "seed": s, "step": step,
              "completions": 8.0 + (48.0 if step == 1 else 0.0), "pairs/samples": 48.0} for s in (0, 1) for step in (1, 2)]
    budgets = pd.DataFrame({"task": ["pizza", "addition"], "budget": [64, 320]})
    lines = pair_sample_lines(pd.DataFrame(rows), budgets)
    assert len(lines) == 2
    assert lines[0] == ("`dpo` built its preference pairs from samples of the starting policy per cell, not counted "
                        "against the budget (count_pair_samples off): not like for like with the others on generated "
                        "completions. Samples per cell: pizza 96 (150% more generated completions than the budget of "
                        "64), addition 32 (10% more generated completions than the budget of 320).")
    assert lines[1].startswith("`dpo_counted` on pizza built its preference pairs from 48 samples") and (
        "counted against the budget (count_pair_samples): drawn up front" in lines[1])
