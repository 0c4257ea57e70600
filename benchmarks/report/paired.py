"""Paired significance tests for before/after evaluations on the same questions (``grpo-bench paired``).

``mcnemar_exact(before, after)``: McNemar's exact test. Only the discordant questions carry
information about a change: b = correct before and wrong after, c = wrong before and correct after.
Under "no change" each discordant question is equally likely to go either way, so b ~ Binomial(b + c, 1/2);
the two-sided p-value is the probability of a split at least as unbalanced as the one observed,
min(1, 2 * P(X <= min(b, c))), exactly what ``scipy.stats.binomtest(b, b + c, 0.5)`` returns (the
binomial at p = 1/2 is symmetric). Computed with integers here, so no scipy is needed.
"""

from __future__ import annotations

import json
from fractions import Fraction
from math import comb
from pathlib import Path
from typing import Callable, Optional, Sequence

from benchmarks.markdown import markdown_table


def mcnemar_exact(before: Sequence[bool], after: Sequence[bool]) -> dict:
    """{"b": right -> wrong, "c": wrong -> right, "n": questions, "p_value": two-sided exact McNemar p}."""
    if len(before) != len(after):
        raise ValueError(f"paired test needs the same questions before and after: {len(before)} != {len(after)}")
    b = sum(1 for x, y in zip(before, after) if bool(x) and not bool(y))
    c = sum(1 for x, y in zip(before, after) if not bool(x) and bool(y))
    n = b + c
    if n == 0:
        p = 1.0
    else:
        tail = Fraction(sum(comb(n, i) for i in range(min(b, c) + 1)), 2 ** n)
        p = float(min(Fraction(1), 2 * tail))
    return {"b": b, "c": c, "n": len(before), "p_value": p}


# Settings two evaluations must share to be compared question by question.
SAME_SETTINGS = ("eval_questions", "eval_max_steps", "eval_k", "eval_temperature", "eval_max_new_tokens", "think_prefill", "data", "system_prompt")


def _per_question_bools(values: list) -> list[bool]:
    return [bool(any(v)) if isinstance(v, list) else bool(v) for v in values]


def merge(parts: list[dict]) -> dict:
    """One ``eval`` result from several that evaluated consecutive slices of the questions with the same settings."""
    parts = sorted(parts, key=lambda r: r.get("questions", [0, 0])[0])
    head = dict(parts[0])
    for part in parts[1:]:
        if part["options"] != head["options"] or part["seed"] != head["seed"]:
            raise ValueError("the parts were evaluated with different options or seeds")
    head["per_question"] = {k: [x for part in parts for x in part["per_question"][k]] for k in parts[0]["per_question"]}
    head["questions"] = [parts[0]["questions"][0], parts[-1]["questions"][1]]
    head["seconds"] = {k: sum(part["seconds"][k] for part in parts) for k in parts[0]["seconds"]}
    head["metrics_by_part"] = [part["metrics"] for part in parts]
    head["command"] = [part["command"] for part in parts]
    return head


def compare(before: dict, after: dict) -> dict:
    """McNemar's exact test for each per-question correctness list of two ``eval`` results."""
    pb, pa = before["per_question"], after["per_question"]
    if pb.get("row") != pa.get("row") or before["seed"] != after["seed"]:
        raise ValueError("the two evaluations did not use the same questions and seed")
    db, da = before.get("describe", {}), after.get("describe", {})
    differ = [k for k in SAME_SETTINGS if db.get(k) != da.get(k)]
    if differ:
        raise ValueError(f"the two evaluations differ in {', '.join(differ)}")
    out = {"questions": len(pb["row"]), "seed": before["seed"], "before": before["label"], "after": after["label"],
           "tests": {}}
    for key in sorted(k for k in pb if k.startswith("correct") and k in pa):
        b, a = _per_question_bools(pb[key]), _per_question_bools(pa[key])
        test = mcnemar_exact(b, a)
        out["tests"][key] = {"accuracy_before": sum(b) / len(b), "accuracy_after": sum(a) / len(a),
                             "both_right": sum(x and y for x, y in zip(b, a)), **test,
                             "test": "McNemar exact (two-sided binomial on the discordant pairs)"}
    return out


def compare_files(before: Sequence[str], after: Sequence[str],
                  answers: Optional[Callable[[dict, dict], Optional[dict]]] = None) -> dict:
    """``compare`` of two ``paired eval`` results, each joined from its files in question order, with the settings
    they share, their evaluations' wall-clock and the files; with ``answers`` (given the two joined results: how
    alike each side answers and the most common reference answer, {"before"|"after"|"reference": {"top", "share"}},
    or None) that too, under "answers"."""
    first, second = (merge([json.loads(Path(p).read_text()) for p in files]) for files in (before, after))
    result = compare(first, second)
    alike = answers(first, second) if answers is not None else None
    if alike:
        result["answers"] = alike
    result["settings"] = {k: first.get("describe", {}).get(k) for k in SAME_SETTINGS}
    result["wall_clock_s"] = {"before": first["seconds"], "after": second["seconds"]}
    result["files"] = {"before": list(before), "after": list(after)}
    return result


def render_section(result: dict, command: str) -> str:
    """The README section of a ``compare_files`` result: what was compared, how it was sampled, each test."""
    rows = [[key.replace("correct", "accuracy").replace("_", " "), f"{t['accuracy_before']:.3f}",
             f"{t['accuracy_after']:.3f}", t["b"], t["c"], f"{t['p_value']:.3g}"] for key, t in result["tests"].items()]
    seconds = {side: sum(v.values()) for side, v in result["wall_clock_s"].items()}
    settings = result["settings"]
    subset = (f" (the first {result['questions']} whose reference solution takes at most {settings['eval_max_steps']} "
              "calculator steps)" if settings.get("eval_max_steps") else "")
    sampling = ("greedy" if not settings.get("eval_temperature") else
                f"{settings.get('eval_k')} samples per question at temperature {settings['eval_temperature']} (pass@k)")
    return (f"{result['before']} -> {result['after']}, the same {result['questions']} test questions{subset}, seed "
            f"{result['seed']}, {sampling}, {settings.get('eval_max_new_tokens')} new tokens "
            f"({seconds['before']:.0f} s and {seconds['after']:.0f} s of evaluation on this CPU):\n\n"
            + markdown_table(["metric", "before", "after", "right -> wrong (b)", "wrong -> right (c)",
                              "McNemar exact p"], rows)
            + _answers_text(result.get("answers"))
            + f"\n\nRegenerate: `{command}`\n")


def _answers_text(answers: dict | None) -> str:
    """How alike each side answers, beside what the most common reference answer alone would score."""
    if not answers:
        return ""
    side = {k: f"{v['share']:.1%} of the answers are its most common one ({v['top']!r})" for k, v in answers.items()
            if k != "reference"}
    ref = answers["reference"]
    return (f"\n\nAnswers alike: before, {side['before']}; after, {side['after']}. The most common reference answer "
            f"({ref['top']!r}) is the answer to {ref['share']:.3f} of the questions: a policy giving it to every question "
            "scores that much without the skill.")
