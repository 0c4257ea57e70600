"""How alike a paired evaluation's policy answers (``benchmarks.harness.paired.answers_alike``): from the answers the
evaluation kept, or, for a Reasoning Gym result written before it kept them, from its completions by the task's rule."""

from __future__ import annotations

from benchmarks.harness.paired import answers_alike


def _result(task="reasoning_gym", **per_question):
    return {"task": task, "describe": {"extract": "last_number", "answer_prefill": False}, "per_question": per_question}


def test_the_given_answers_or_the_completions_read_again_and_the_references():
    before = _result(answer=["1", "1", "3", "1"], given=[["1"], ["2"], ["2"], [None]])
    after = _result(completions=[["It appears 1 time."], ["1. The letter appears 1 time."], ["once, so 1"], ["1"]])
    assert answers_alike(before, after) == {"before": {"top": "2", "share": 0.5}, "after": {"top": "1", "share": 1.0},
                                            "reference": {"top": "1", "share": 0.75}}


def test_no_answers_known_is_none_rather_than_a_guess():
    gsm8k = _result(task="gsm8k", completions=[["12"]])  # no rule to read its answers by here
    assert answers_alike(_result(answer=["12"], given=[["12"]]), gsm8k) is None
    assert answers_alike(_result(given=[["12"]]), _result(given=[["12"]])) is None  # no reference answers
    prefilled = _result(completions=[["7</answer> and 8"]])
    prefilled["describe"]["answer_prefill"] = True  # the tag the prompt opened is read in front: 7, not 8
    assert answers_alike(_result(answer=["7"], given=[["7"]]), prefilled)["after"] == {"top": "7", "share": 1.0}
