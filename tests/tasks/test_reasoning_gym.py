"""The reasoning_gym task: extraction and scoring on hand-made answers, the seeded disjoint split, one-line errors.

No policy is needed: the tokenizer is a stub without a chat template (prompts are then plain text) and the
evaluation's sampler is replaced by one that returns hand-written completions.
"""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("reasoning_gym")

from tasks import TaskError, make_task  # noqa: E402
from tasks import reasoning_gym as rg_task  # noqa: E402
from tasks.base import Samples  # noqa: E402
from tasks.reasoning_gym import extracted_answer, last_number, tagged_answer  # noqa: E402

SMALL = '{"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}'


class _PlainTokenizer:
    chat_template = None


@pytest.fixture
def plain_tokenizer(monkeypatch, tmp_path):
    monkeypatch.setattr(rg_task, "load_tokenizer", lambda model=None: _PlainTokenizer())
    monkeypatch.setenv("GRPO_BENCH_CACHE", str(tmp_path / "cache"))  # each test's own saved items


def _task(**options):
    return make_task("reasoning_gym", **{"dataset": "chain_sum", "dataset_config": SMALL, "eval_problems": 20,
                                         "train_problems": 50, "held_out": 20, **options})


@pytest.mark.parametrize("text, tagged, last", [
    ("<answer>42</answer>", "42", "42"),
    ("<answer> -7 </answer>", "-7", "-7"),
    ("<answer>1</answer> no, <answer>2</answer>", "2", "2"),  # the last group counts
    ("1 + 5 = 6.", None, "6"),
    ("4 - 1 - 7 = -4", None, "-4"),
    ("5-3", None, "3"),  # a subtraction, not a negative number
    ("<answer>12", None, "12"),  # unclosed: not tagged
    ("I do not know.", None, None),
    ("", None, None),
])
def test_extraction_rules(text, tagged, last):
    assert tagged_answer(text) == tagged
    assert extracted_answer(text, "tags") == tagged
    assert extracted_answer(text, "last_number") == (tagged if tagged is not None else last)
    assert last_number("x 3.5 then 10") == "10"


def test_scorer_on_right_wrong_and_malformed_answers(plain_tokenizer):
    task = _task(reward_mode="sum")
    prompt = task.eval_prompts[0]
    answer = task.eval_entries[0]["answer"]
    wrong = str(int(answer) + 1)
    assert task.grade(prompt, f"<answer>{answer}</answer>") == (1.0, True)
    assert task.grade(prompt, f"<answer>{wrong}</answer>") == (0.0, True)
    assert task.grade(prompt, f"The sum is {answer}.") == (1.0, False)  # right, without the format
    assert task.grade(prompt, "<answer>banana</answer>") == (0.0, True)  # formatted, malformed answer
    assert task.grade(prompt, "<answer></answer>") == (0.0, True)
    assert task.grade(prompt, "no idea") == (0.0, False)
    assert task.grade(prompt, f"<answer>{answer}") == (1.0, False)  # unclosed tag: the last number, no format
    assert task.reward([prompt] * 3, [f"<answer>{answer}</answer>", f"{answer}", "x"]) == pytest.approx([1.1, 1.0, 0.0])
    assert _task().reward([prompt] * 2, [f"<answer>{answer}</answer>", "<answer> and </answer>"]) == [1.0, 0.0]  # default: score
    strict = _task(extract="tags", reward_mode="score")
    assert strict.grade(prompt, f"The sum is {answer}.") == (0.0, False)
    assert strict.reward([prompt], [f"<answer>{answer}</answer>"]) == [1.0]
    with pytest.raises(TaskError, match="not one of this task's questions"):
        task.reward(["an unknown prompt"], ["1"])


def test_answer_prefill_is_read_in_front_of_the_completion(plain_tokenizer):
    task = _task(answer_prefill=True)
    prompt, answer = task.eval_prompts[0], task.eval_entries[0]["answer"]
    assert prompt.endswith("<answer>")
    assert task.grade(prompt, f" {answer} </answer>") == (1.0, True)


def test_split_is_seeded_and_disjoint(plain_tokenizer):
    a, b, other = _task(data_seed=3), _task(data_seed=3), _task(data_seed=4)
    questions = lambda entries: [e["question"] for e in entries]  # noqa: E731
    assert questions(a.eval_entries) == questions(b.eval_entries)
    assert questions(a.train_entries) == questions(b.train_entries)
    assert questions(a.eval_entries) != questions(other.eval_entries)
    held_out, train = set(questions(a.eval_entries)), set(questions(a.train_entries))
    assert len(held_out) == 20 and len(train) == 50 and not held_out & train
    assert a.train_prompts() and all(p not in a.eval_prompts for p in a.train_prompts())
    # fewer evaluation questions: the same first ones, and the same training problems (the reserve is fixed)
    fewer = _task(data_seed=3, eval_problems=5)
    assert questions(fewer.eval_entries) == questions(a.eval_entries)[:5]
    assert questions(fewer.train_entries) == questions(a.train_entries)


def test_spread_split_gives_both_sides_the_easy_questions():
    """A generator that repeats its 10 easy questions: 'first' holds them all out and trains on hard ones only;
    'spread' puts them on both sides in proportion, seeded, still disjoint."""
    import random

    from tasks.reasoning_gym import split_questions

    rng = random.Random(0)
    stream = [{"question": f"easy {rng.randrange(10)}"} if i % 2 else {"question": f"hard {i}"} for i in range(600)]
    easy = lambda entries: sum(e["question"].startswith("easy") for e in entries)  # noqa: E731
    kept, train = split_questions(stream, 40, 40, "first")
    assert easy(kept) == 10 and easy(train) == 0
    kept, train = split_questions(stream, 40, 40, "spread", seed=1)
    assert len(kept) == len(train) == 40 and 2 <= easy(train) <= 8 and easy(kept) + easy(train) == 10
    assert not {e["question"] for e in kept} & {e["question"] for e in train}
    assert (kept, train) == split_questions(stream, 40, 40, "spread", seed=1)
    assert kept != split_questions(stream, 40, 40, "spread", seed=2)[0]


def _count_generated(monkeypatch) -> tuple[list[int], object]:
    """(the indices of every item reasoning-gym generates from now on, the real create_dataset)."""
    made = []
    real = rg_task.create_dataset

    def counting(*args, **kwargs):
        dataset = real(*args, **kwargs)
        generate = type(dataset).__getitem__

        class Counted(type(dataset)):
            def __getitem__(self, i):
                made.append(i)
                return generate(self, i)

        dataset.__class__ = Counted
        return dataset

    monkeypatch.setattr(rg_task, "create_dataset", counting)
    return made, real


def test_each_item_is_generated_once_per_process_and_the_split_is_unchanged(plain_tokenizer, monkeypatch):
    """The split and the validation walk read reasoning-gym's items through one memo, so a task built again (a warm
    matrix worker's next cell) generates none; what they hold is what the dataset itself gives."""
    from tasks.reasoning_gym import split_questions, validation_questions

    made, real = _count_generated(monkeypatch)
    monkeypatch.setattr(rg_task.GeneratedItems, "_kept", (None, {}))
    first = _task(data_seed=5, eval_set="validation")
    assert len(made) == len(set(made)) > 70  # the validation walk starts again at item 0: from the memo
    again = _task(data_seed=5, eval_set="validation")
    assert len(made) == len(set(made))  # nothing generated twice
    questions = lambda entries: [e["question"] for e in entries]  # noqa: E731
    assert questions(again.eval_entries) == questions(first.eval_entries)
    assert questions(again.train_entries) == questions(first.train_entries)
    # the same entries as walking the dataset itself, with no memo
    plain = real("chain_sum", first.config, seed=5, size=len(first.dataset))
    kept, train = split_questions(plain, 20, 50, "first", seed=5, draws=4 * 70)
    assert questions(train) == questions(first.train_entries)
    validation = validation_questions(plain, set(questions(kept + train)), 20)
    assert questions(validation) == questions(first.eval_entries)
    # another dataset (here another seed) replaces the kept items rather than adding to them
    _task(data_seed=6)
    assert rg_task.GeneratedItems._kept[0][3] == 6 and len(rg_task.GeneratedItems._kept[1]) <= len(set(made))


def test_a_fresh_process_reads_the_saved_items_and_regenerates_a_corrupt_file(plain_tokenizer, monkeypatch, tmp_path,
                                                                             capsys):
    """A process's first task of a dataset saves the items it generated; a fresh process (an empty memo) reads them
    and generates none, with the same split; a corrupt or foreign file is said in one line and generated anew."""
    made, _ = _count_generated(monkeypatch)
    fresh = lambda: monkeypatch.setattr(rg_task.GeneratedItems, "_kept", (None, {}))  # noqa: E731 - a new process
    questions = lambda task: ([e["question"] for e in task.train_entries], [e["question"] for e in task.eval_entries])  # noqa: E731
    fresh()
    first = _task(data_seed=7, eval_set="validation")
    generated = len(made)
    files = list((tmp_path / "cache" / "reasoning-gym").glob("chain_sum-*.items"))
    assert generated > 70 and len(files) == 1 and files[0].stat().st_mode & 0o777 == 0o666 & ~_umask()
    fresh()
    again = _task(data_seed=7, eval_set="validation")
    assert len(made) == generated and questions(again) == questions(first)  # read, not generated
    assert [e["answer"] for e in again.eval_entries] == [e["answer"] for e in first.eval_entries]
    blob = bytearray(files[0].read_bytes())
    blob[-10] ^= 0xFF  # one flipped byte in the pickled items
    files[0].write_bytes(bytes(blob))
    fresh()
    repaired = _task(data_seed=7, eval_set="validation")
    assert "are corrupt or for another dataset; generating them again" in capsys.readouterr().err
    assert len(made) == 2 * generated and questions(repaired) == questions(first)
    fresh()
    _task(data_seed=7, eval_set="validation")
    assert len(made) == 2 * generated  # the file was written again, whole
    other = files[0].with_name("other.items")  # a whole file saved for another key, found under this one's name
    monkeypatch.setattr(rg_task, "items_cache", lambda key: other)
    _task(data_seed=8)
    fresh()
    monkeypatch.setattr(rg_task, "items_cache", lambda key: files[0] if key[3] == 7 else other)
    files[0].write_bytes(other.read_bytes())
    _task(data_seed=7, eval_set="validation")
    assert "another dataset" in capsys.readouterr().err and len(made) > 3 * generated


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_split_option_is_checked(plain_tokenizer):
    with pytest.raises(TaskError, match="split must be one of first, spread"):
        _task(split="halves")
    spread = _task(split="spread")
    assert spread.describe()["split"] == "spread" and len(spread.eval_entries) == 20
    assert not {e["question"] for e in spread.eval_entries} & {e["question"] for e in spread.train_entries}


def test_dataset_may_carry_its_config(plain_tokenizer):
    inline = make_task("reasoning_gym", dataset=f"chain_sum:{SMALL}", eval_problems=20, train_problems=50, held_out=20)
    assert inline.dataset_name == "chain_sum" and inline.config == _task().config
    assert [e["question"] for e in inline.eval_entries] == [e["question"] for e in _task().eval_entries]
    as_dict = _task(dataset_config={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2})  # the Python API's form
    assert [e["question"] for e in as_dict.eval_entries] == [e["question"] for e in _task().eval_entries]
    with pytest.raises(TaskError, match="set both"):
        make_task("reasoning_gym", dataset='chain_sum:{"max_terms": 2}', dataset_config='{"max_terms": 3}')


def test_too_few_distinct_questions_is_a_task_error(plain_tokenizer):
    with pytest.raises(TaskError, match="distinct"):
        _task(dataset_config='{"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}', eval_problems=500)


def test_evaluate_keeps_correctness_and_format_apart(plain_tokenizer):
    task = _task(eval_problems=4, reward_mode="sum")
    answers = [e["answer"] for e in task.eval_entries]
    written = [f"<answer>{answers[0]}</answer>", f"= {answers[1]}", "<answer>nope</answer>", "???"]

    def sampler(model, tokenizer, prompts, *, k, max_new_tokens, temperature, seed):
        return Samples([[written[task.eval_prompts.index(p)]] * k for p in prompts], [[False] * k for _ in prompts], 5 * k * len(prompts))

    task.eval_sampler = sampler
    metrics = task.evaluate_per_question(model=None)
    assert metrics["accuracy"] == 0.5 and metrics["format"] == 0.5 and metrics["score"] == 0.5
    assert metrics["reward"] == pytest.approx((1.1 + 1.0 + 0.1 + 0.0) / 4)
    assert metrics.per_question["correct"] == [[True], [True], [False], [False]]
    assert metrics.per_question["formatted"] == [[True], [False], [True], [False]]
    assert metrics.per_question["row"] == [0, 1, 2, 3]


def test_answer_concentration_counts_missing_answers_but_never_tops_with_them():
    from tasks.base import answer_concentration

    assert answer_concentration(["1", "2", "1", None]) == ("1", 0.5)
    assert answer_concentration(["2", "1", "1", "2"]) == ("2", 0.5)  # a tie: the first seen
    assert answer_concentration([None, None]) == (None, 0.0) and answer_concentration([]) == (None, 0.0)


def test_constant_baseline_is_the_best_single_answer_scored_by_the_dataset(plain_tokenizer):
    """letter_counting's short texts: most questions' answer is 1, so always answering 1 scores what the
    reference answers' mode covers (the dataset's scorer agreeing), well above chain_sum's."""
    task = _task(dataset="letter_counting", dataset_config='{"min_words": 3, "max_words": 5}', eval_problems=60,
                 held_out=60, train_problems=50)
    answers = [str(e["answer"]) for e in task.eval_entries]
    mode = max(set(answers), key=answers.count)
    answer, accuracy = task.constant_baseline()
    assert answer == mode == "1" and accuracy == pytest.approx(answers.count("1") / 60) and accuracy > 0.4
    chain = _task(eval_problems=20)
    chain_answers = [str(e["answer"]) for e in chain.eval_entries]
    assert chain.constant_baseline()[1] == max(chain_answers.count(a) for a in chain_answers) / 20 < accuracy
    # the dataset's own scorer decides: a scorer that accepts nothing gives no baseline
    chain.dataset.score_answer = lambda answer, entry: 0.0
    assert chain.constant_baseline() == (None, 0.0)


def test_evaluate_reports_how_alike_the_policy_answers_beside_the_constant_baseline(plain_tokenizer):
    """A policy that writes "1" to every question scores exactly the constant baseline, with every answer alike;
    one that answers each question right answers as its reference answers vary."""
    task = _task(dataset="letter_counting", dataset_config='{"min_words": 3, "max_words": 5}', eval_problems=40,
                 held_out=40, train_problems=50)
    answers = {p: str(e["answer"]) for p, e in zip(task.eval_prompts, task.eval_entries)}

    def constant(model, tokenizer, prompts, *, k, max_new_tokens, temperature, seed):
        return Samples([['The letter appears 1 time.'] * k for _ in prompts], [[False] * k for _ in prompts], k * len(prompts))

    def right(model, tokenizer, prompts, *, k, max_new_tokens, temperature, seed):
        return Samples([[f"It appears {answers[p]} times."] * k for p in prompts], [[False] * k for _ in prompts], k * len(prompts))

    task.eval_sampler = constant
    shortcut = task.evaluate_per_question(model=None)
    assert shortcut["answer_top_share"] == 1.0
    assert shortcut["accuracy"] == shortcut["constant_baseline"] == task.constant_baseline()[1] > 0.4
    assert shortcut.per_question["given"] == [["1"]] * 40
    task.eval_sampler = right
    skilled = task.evaluate_per_question(model=None)
    assert skilled["accuracy"] == 1.0 and skilled["constant_baseline"] == shortcut["constant_baseline"]
    assert skilled["answer_top_share"] == pytest.approx(list(answers.values()).count("1") / 40)
    assert skilled["answer_top_share"] < 1.0


@pytest.mark.parametrize("options, fragment", [
    ({"dataset": "nope"}, "unknown dataset 'nope'"),
    ({"dataset": "chain_sun"}, "did you mean chain_sum"),
    ({"dataset_config": '{"no_such_field": 1}'}, "bad dataset_config"),
    ({"dataset_config": "{not json"}, "not JSON"),
    ({"dataset_config": '{"seed": 1}'}, "may not set seed"),
    ({"extract": "regex"}, "extract must be one of"),
])
def test_bad_options_are_task_errors(plain_tokenizer, options, fragment):
    with pytest.raises(TaskError, match=fragment):
        _task(**options)


def _one_line_exit_2(run_cli, *args) -> str:
    code, out, err = run_cli(*args)
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_cli_unknown_dataset_is_one_line_exit_2(run_cli, tmp_path):
    line = _one_line_exit_2(run_cli, "run", "--task", "reasoning_gym", "--dataset", "nope", "--algo", "grpo",
                            "--out", tmp_path / "run")
    assert "unknown dataset 'nope'" in line


def test_cli_missing_reasoning_gym_is_one_line_exit_2(run_cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym now raises ImportError
    line = _one_line_exit_2(run_cli, "run", "--task", "reasoning_gym", "--dataset", "chain_sum", "--algo", "grpo",
                            "--out", tmp_path / "run")
    assert "reasoning-gym package is not installed" in line and "pip install -e '.[reasoning]'" in line
    with pytest.raises(TaskError, match=r"\.\[reasoning\]"):
        rg_task.import_reasoning_gym()


def test_preference_pairs_prefer_the_higher_reward(plain_tokenizer):
    task = _task()

    def sampler(model, tokenizer, prompts, *, k, max_new_tokens, temperature, seed):
        answers = {p: task.entry_for(p)["answer"] for p in prompts}
        texts = [[f"<answer>{answers[p]}</answer>", "no idea", "<answer>x</answer>", "no idea"][:k] for p in prompts]
        return Samples(texts, [[False] * k for _ in prompts], 0)

    task.eval_sampler = sampler
    pairs = task.preference_pairs(None, 6, seed=0)
    assert len(pairs["chosen"]) == 6 and all(c.startswith("<answer>") and c != "<answer>x</answer>" for c in pairs["chosen"])
    assert all(r in ("no idea", "<answer>x</answer>") for r in pairs["rejected"])  # both score 0
    assert all(p in task.train_prompts() for p in pairs["prompts"])
