"""Every task's ``eval_set``: "test" (what the verdicts judge on, unchanged) or "validation" (what a matrix's tuning
stage selects on), disjoint from the test questions and never trained on; a bad value is one TaskError line.

Addition's own split is tested in test_addition.py. No policy is sampled here: the toy tasks load their shipped
models, and the real-model tasks get a stub tokenizer without a chat template (prompts are then plain text).
"""

from __future__ import annotations

import hashlib
import json

import pytest

from tasks import TASKS, TaskError, bandit, make_task, pizza
from tasks import gsm8k as gsm8k_task
from tasks.custom import PromptsTask
from tasks.tiny_lm import char_tokenizer, tiny_llama


class _PlainTokenizer:
    chat_template = None


def _digest(texts) -> str:
    return hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:16]


def _one_line_error(make, match):
    with pytest.raises(TaskError, match=match) as raised:
        make()
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("name", ["addition", "pizza", "bandit", "gsm8k", "reasoning_gym", "prompts"])
def test_every_task_has_the_option(name):
    option = TASKS[name].options()["eval_set"]
    assert option.default == "test" and option.kind is str and "validation" in option.help


# --- pizza and bandit: no problems to hold out ------------------------------------------------------------------
def test_pizza_validation_samples_an_independent_seed_stream(monkeypatch):
    seeds = []

    def sampler(model, tokenizer, prompts, *, num_samples, seed, **kwargs):
        seeds.append(seed)
        return [["pizza"] * num_samples]

    monkeypatch.setattr(pizza, "sample_completions", sampler)
    test, validation = pizza.PizzaTask(eval_samples=4), pizza.PizzaTask(eval_samples=4, eval_set="validation")
    assert test.evaluate(None, seed=3)["accuracy"] == validation.evaluate(None, seed=3)["accuracy"] == 1.0
    assert seeds == [3, 3 + 2**32]  # the test evaluation as before; validation past every seed a run uses
    assert (test.describe()["eval_set"], validation.describe()["eval_set"]) == ("test", "validation")
    _one_line_error(lambda: pizza.PizzaTask(eval_set="train"), "eval_set must be one of test, validation, got 'train'")


def test_bandit_validation_is_the_same_exact_evaluation():
    test, validation = bandit.BanditTask(), bandit.BanditTask(eval_set="validation")
    model = test.load_policy("cpu")
    assert validation.evaluate(model, seed=0) == test.evaluate(model, seed=1)
    described = validation.describe()
    assert described["eval_set"] == "validation" and "the evaluation is exact" in described["eval_set_note"]
    _one_line_error(lambda: bandit.BanditTask(eval_set="Validation"), "eval_set must be one of")


# --- reasoning_gym: the questions after the split -------------------------------------------------------------
SMALL = '{"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}'


@pytest.fixture
def reasoning_gym(monkeypatch):
    pytest.importorskip("reasoning_gym")
    from tasks import reasoning_gym as rg_task

    monkeypatch.setattr(rg_task, "load_tokenizer", lambda model=None: _PlainTokenizer())

    def make(**options):
        return make_task("reasoning_gym", **{"dataset": "chain_sum", "dataset_config": SMALL, "eval_problems": 20,
                                             "train_problems": 50, "held_out": 20, **options})

    return make


@pytest.mark.parametrize("split, eval_digest, train_digest", [
    # The eval and training prompts before eval_set existed (digests taken from the code before the change).
    ("first", "753ea552d2967b61", "abd8e5aedb8bd931"),
    ("spread", "b57c181aaf7595a4", "172841e1342cfce1"),
])
def test_reasoning_gym_validation_is_disjoint_and_test_is_unchanged(reasoning_gym, split, eval_digest, train_digest):
    test = reasoning_gym(split=split, eval_set="test")
    assert (_digest(test.eval_prompts), _digest(test.train_prompts())) == (eval_digest, train_digest)
    validation = reasoning_gym(split=split, eval_set="validation")
    assert validation.train_prompts() == test.train_prompts()  # tuning and evaluation runs train on the same questions
    questions = [e["question"] for e in validation.eval_entries]
    assert len(set(questions)) == 20
    assert not set(questions) & {e["question"] for e in test.eval_entries + test.train_entries}
    assert not set(validation.eval_prompts) & set(test.eval_prompts + test.train_prompts())
    assert validation.describe()["eval_set"] == "validation" and test.describe()["eval_set"] == "test"


def test_reasoning_gym_default_test_set_is_unchanged(reasoning_gym):
    # chain_sum as the committed results ran it: 500 held-out questions, 2000 training ones.
    task = reasoning_gym(dataset_config=None, eval_problems=500, train_problems=2000, held_out=500, eval_set="test")
    assert (_digest(task.eval_prompts), _digest(task.train_prompts())) == ("657bd9eb9eec325f", "b93e19e2c979d2fc")


def test_reasoning_gym_validation_needs_questions_left_after_the_split(reasoning_gym):
    digits = '{"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}'  # 200 distinct questions (+ and -)
    assert len(reasoning_gym(dataset_config=digits, train_problems=60, eval_set="validation").eval_prompts) == 20
    _one_line_error(lambda: reasoning_gym(dataset_config=digits, train_problems=170, eval_set="validation"),
                    r"only \d distinct questions left after the split .* eval_set validation needs 20")
    _one_line_error(lambda: reasoning_gym(eval_set="tuning"), "eval_set must be one of test, validation")


# --- gsm8k: train questions picked by a hash, never trained on ------------------------------------------------
def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def plain_gsm8k(monkeypatch):
    monkeypatch.setattr(gsm8k_task, "load_tokenizer", lambda model=None: _PlainTokenizer())


@pytest.fixture
def gsm8k_folder(tmp_path, plain_gsm8k):
    """71 train questions (4 of them validation ones by the hash) and 6 test questions, one also a train question."""
    folder = tmp_path / "gsm8k"
    folder.mkdir()
    train = [{"question": f"train {i}?", "answer": f"a <<1+1=2>>2\n#### {i}"} for i in range(71)]
    picked = [r["question"] for r in train if gsm8k_task.is_validation(gsm8k_task.Problem(r["question"], 0, 0))]
    assert len(picked) == 4
    _write(folder / "train.jsonl", train)
    _write(folder / "test.jsonl", [{"question": f"test {i}?", "answer": f"#### {i}"} for i in range(5)]
           + [{"question": picked[0], "answer": "#### 1"}])
    return folder, picked


def test_gsm8k_validation_questions_are_never_trained_on_and_not_test_questions(gsm8k_folder):
    folder, picked = gsm8k_folder
    test = gsm8k_task.GSM8KTask(data=str(folder), eval_questions=5, starting_policy="sft", sft_examples=60)
    validation = gsm8k_task.GSM8KTask(data=str(folder), eval_questions=3, eval_set="validation")
    assert [p.question for p in test.eval_problems] == [f"test {i}?" for i in range(5)]  # the test split, as before
    assert [p.question for p in validation.eval_problems] == picked[1:]  # picked[0] is also a test question
    assert validation.train_prompts() == test.train_prompts() and len(test.train_prompts()) == 67
    trained = set(test.train_prompts()) | set(test.sft_data()[0])
    assert not trained & set(validation.eval_prompts)
    assert not {p.question for p in validation.eval_problems} & {p.question for p in test.test.problems}
    described = validation.describe()
    assert (described["eval_set"], described["train_questions"], described["validation_questions"]) == ("validation", 67, 4)
    _one_line_error(lambda: gsm8k_task.GSM8KTask(data=str(folder), eval_questions=4, eval_set="validation"),
                    "eval_questions 4 > the 3 validation questions in")
    _one_line_error(lambda: gsm8k_task.GSM8KTask(data=str(folder), eval_set="dev"), "eval_set must be one of")


def test_gsm8k_test_set_is_unchanged_on_the_real_data(plain_gsm8k, gsm8k_data):
    test = gsm8k_task.GSM8KTask(eval_questions=500, eval_set="test")
    assert _digest(test.eval_prompts) == "4beefe4fd6e86ecb"  # the first 500 test questions, as before eval_set
    validation = gsm8k_task.GSM8KTask(eval_questions=100, eval_set="validation")
    assert len(test.train_prompts()) == 7473 - 491 and validation.train_prompts() == test.train_prompts()
    assert not set(validation.eval_prompts) & set(test.eval_prompts + test.train_prompts())


# --- prompts: the user's validation prompts -------------------------------------------------------------------
@pytest.fixture
def tiny_policy():
    tokenizer = char_tokenizer(list("abcdefghijklmnopqrstuvwxyz ?"))
    return tiny_llama(tokenizer, hidden_size=8, num_layers=1, num_heads=2), tokenizer


def _reward(prompts, completions):
    return [float(len(c)) for c in completions]


def test_prompts_validation_evaluates_the_validation_prompts(tiny_policy, tmp_path):
    model, tokenizer = tiny_policy
    test = PromptsTask.from_objects(model, tokenizer, ["a b?", "c d?"], _reward, eval_prompts=["e f?"], chat_template=False)
    assert test._eval_prompts == ["e f?"] and test.describe()["eval_set"] == "test"
    validation = PromptsTask.from_objects(model, tokenizer, ["a b?", "c d?"], _reward, eval_prompts=["e f?"],
                                          chat_template=False, eval_set="validation", validation_prompts=["g h?", "i?"])
    assert validation._eval_prompts == ["g h?", "i?"] and validation.train_prompts() == test.train_prompts()
    assert validation.describe()["eval_set"] == "validation" and validation.describe()["eval_prompts"] == 2
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    (tmp_path / "train.txt").write_text("a b?\nc d?\n")
    (tmp_path / "valid.txt").write_text("g h?\n")
    by_name = PromptsTask(reward_fn=_reward, model=str(tmp_path / "model"), prompts=str(tmp_path / "train.txt"),
                          chat_template=False, eval_set="validation", validation_prompts=str(tmp_path / "valid.txt"))
    assert by_name._eval_prompts == ["g h?"] and by_name.train_prompts() == ["a b?", "c d?"]


def test_prompts_validation_needs_held_out_prompts(tiny_policy):
    model, tokenizer = tiny_policy

    def make(**options):
        return PromptsTask.from_objects(model, tokenizer, ["a b?"], _reward, eval_prompts=["e f?"], chat_template=False,
                                        **options)

    _one_line_error(lambda: make(eval_set="validation"), "eval_set validation needs validation_prompts")
    _one_line_error(lambda: make(eval_set="validation", validation_prompts=["z?", "e f?"]),
                    r"validation_prompts\[1\] \('e f\?'\) is also a training or evaluation prompt")
    _one_line_error(lambda: make(eval_set="validation", validation_prompts=["a b?"]), "also a training")
    _one_line_error(lambda: make(eval_set="holdout"), "eval_set must be one of test, validation, got 'holdout'")
