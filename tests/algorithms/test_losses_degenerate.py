"""Every algorithm survives degenerate batches -- every completion empty (EOS first), one-token
completions, rewards that all tie, groups of two -- with finite metrics, and takes no optimizer step
where the batch carries no signal (every advantage 0, no KL term): AdamW would otherwise still move the
weights by its momentum, and a tied group's float32 mean (eight 0.3s: off by 3e-8) scaled by 1/std or a
whitening would become a full-size AdamW step on rounding noise. ``skipped_update`` says so."""

import copy
import dataclasses
import math

import pytest
import torch

from algorithms import ALGORITHMS
from algorithms import rollout as rollout_lib
from algorithms.base import Sampling
from algorithms.losses import batch_whiten, carries_signal, group_advantages, masked_whiten, rloo_advantages
from algorithms.rollout import Rollout, rollout_from_text
from tasks.base import TaskError

PROMPT = "ravin likes "
TIE = 0.3  # not a dyadic fraction: its float32 group mean is not exactly 0.3 at G = 8
SAMPLED = ["reinforce", "ppo", "grpo", "rloo", "reinforce_pp"]
GROUP_OPTION = {"grpo": "group_size", "rloo": "group_size"}  # the others: samples_per_prompt
NO_KL = {"reinforce": {"beta": 0.0}, "ppo": {"kl_coef": 0.0, "epochs": 1}, "grpo": {"beta": 0.0}, "rloo": {"beta": 0.0},
         "reinforce_pp": {"kl_coef": 0.0}}


@pytest.fixture(scope="module")
def pizza():
    from tasks import make_task

    return make_task("pizza")


class ScriptedTask:
    """Pizza's model and tokenizer; ``score`` returns ``self.rewards`` (set by the test) whatever was sampled."""

    recommended_learning_rate = 5e-5

    def __init__(self, pizza):
        self.pizza, self.tokenizer, self.rewards = pizza, pizza.tokenizer, None
        self.generation = pizza.generation

    def load_policy(self, device):
        return self.pizza.load_policy(device)

    def train_prompts(self):
        return [PROMPT]

    def score(self, prompts, completions):
        return list(self.rewards) if self.rewards is not None else [float(i % 2) for i in range(len(completions))]

    def preference_pairs(self, policy, n, *, seed=0):
        return self.pizza.preference_pairs(policy, n, seed=seed)


def build(name, task, **options):
    cls = ALGORITHMS[name]
    torch.manual_seed(0)
    policy = task.load_policy(torch.device("cpu"))
    config = cls.Config(learning_rate=1e-3, **options)
    ref = copy.deepcopy(policy).requires_grad_(False) if cls.needs_reference(config) else None
    return cls(policy, ref, task, config, Sampling(max_new_tokens=task.generation.max_new_tokens), seed=0)


def build_sampled(name, task, group_size, **options):
    return build(name, task, **{GROUP_OPTION.get(name, "samples_per_prompt"): group_size, "prompts_per_step": 2,
                                **NO_KL[name], **options})


def batch(task, kind: str, group_size: int, n_prompts: int = 2) -> Rollout:
    """n_prompts x G completions of one kind: "empty" (EOS only), "one_token" (one token, no EOS: cut at
    max_new_tokens = 1; different tokens) or "ordinary" (different lengths)."""
    n = n_prompts * group_size
    texts = {"empty": [""] * n, "one_token": [["p", "z", "a", "i"][i % 4] for i in range(n)],
             "ordinary": [["pizza", "p", "pi zz", "", "piz"][i % 5] for i in range(n)]}[kind]
    rollout = dataclasses.replace(rollout_from_text(task.tokenizer, [PROMPT] * n, texts, torch.device("cpu")),
                                  group_size=group_size)
    if kind == "one_token":
        rollout = dataclasses.replace(rollout, completion_ids=rollout.completion_ids[:, :1],
                                      completion_mask=rollout.completion_mask[:, :1],
                                      truncated=torch.ones(n, dtype=torch.bool))
    return rollout


def step_on(algo, task, rollout: Rollout, rewards) -> dict:
    algo.generate = lambda prompts, group_size=None: rollout
    task.rewards = rewards
    return algo.step([PROMPT] * algo.config.prompts_per_step)


def policy_snapshot(algo):
    return [p.detach().clone() for p in algo.policy.parameters()]


def unchanged(before, algo) -> bool:
    return all(torch.equal(a, b) for a, b in zip(before, algo.policy.parameters()))


def assert_finite(metrics, algo):
    bad = {k: v for k, v in metrics.items() if not math.isfinite(v)}
    assert not bad, bad
    assert all(torch.isfinite(p).all() for p in algo.policy.parameters())


# --- the losses: a tie is exactly 0 ----------------------------------------------------------------------


def test_tied_groups_give_exactly_zero_advantages():
    rewards = torch.tensor([TIE] * 8 + [0.0, 1.0] * 4)
    assert (rewards[:8] - rewards[:8].mean()).abs().max() > 0  # the rounding these guard against
    for scale in ("group", "batch", "none"):
        assert group_advantages(rewards, 8, scale)[:8].eq(0).all()
    assert rloo_advantages(rewards, 8)[:8].eq(0).all()
    mask = torch.ones(8, 3)
    constant = torch.full((8, 3), TIE)
    assert masked_whiten(constant, mask).eq(0).all() and batch_whiten(constant, mask).eq(0).all()
    # one number computed in two rows of a batch can differ in its last bit (a critic's value on an AVX2 EPYC):
    # still a constant, where whitening would blow that rounding up to unit size
    ulp = torch.tensor([0.5209, 0.5209 + 2 * torch.finfo(torch.float32).eps]).repeat_interleave(4).reshape(8, 1)
    assert ulp.unique().numel() == 2
    assert masked_whiten(ulp, torch.ones(8, 1)).eq(0).all() and batch_whiten(ulp, torch.ones(8, 1)).eq(0).all()
    for relative in (1e-5, 1e-2):  # beyond rounding (1e-5 is 84 float32 eps): centred, then whitened
        apart = (ulp[:1] * torch.tensor([1.0, 1.0 + relative])).repeat_interleave(4).reshape(8, 1)
        assert masked_whiten(apart, torch.ones(8, 1)).ne(0).all() and batch_whiten(apart, torch.ones(8, 1)).ne(0).all()
    assert torch.allclose(masked_whiten(apart, torch.ones(8, 1)).abs(), torch.full((8, 1), math.sqrt(7 / 8)), rtol=1e-3)
    assert torch.allclose(batch_whiten(apart, torch.ones(8, 1)).abs(), torch.ones(8, 1), rtol=1e-3)
    assert not carries_signal(torch.zeros(8), mask) and carries_signal(group_advantages(rewards, 8), torch.ones(16, 3))
    # a nonzero advantage on a completion with no active token carries nothing
    assert not carries_signal(torch.tensor([1.0, 0.0]), torch.tensor([[0, 0], [1, 1]]))
    # untied values keep their exact numbers (bit for bit what the formulas gave before)
    x, m = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 100.0]]), torch.tensor([[1.0, 1, 1], [1, 1, 0]])
    mean = (x * m).sum() / m.sum()
    var = (((x - mean) ** 2) * m).sum() / (m.sum() - 1)
    assert torch.equal(masked_whiten(x, m), (x - mean) * torch.rsqrt(var + 1e-8) * m)


# --- the sampled algorithms ----------------------------------------------------------------------------


@pytest.mark.parametrize("group_size", [2, 8])
@pytest.mark.parametrize("kind", ["empty", "one_token"])
@pytest.mark.parametrize("name", SAMPLED)
def test_degenerate_batches_are_finite_and_still_learn_from_signal(pizza, name, kind, group_size):
    task = ScriptedTask(pizza)
    algo = build_sampled(name, task, group_size)
    rollout = batch(task, kind, group_size)
    before = policy_snapshot(algo)
    metrics = step_on(algo, task, rollout, [float(i % 2) for i in range(rollout.num_completions)])  # mixed
    assert_finite(metrics, algo)
    assert metrics["skipped_update"] == 0.0  # nonzero advantages: the step is taken
    if kind == "one_token":
        assert metrics["grad_norm"] > 0 and not unchanged(before, algo)
    # Identical empty completions with opposite advantages: their gradients cancel (and the first AdamW step
    # of a zero gradient moves nothing), so only finiteness is asserted for them.


@pytest.mark.parametrize("group_size", [2, 8])
@pytest.mark.parametrize("kind", ["empty", "one_token", "ordinary"])
@pytest.mark.parametrize("name", SAMPLED)
def test_no_signal_no_update(pizza, name, kind, group_size):
    """After a step with signal (so AdamW has momentum), a batch whose rewards all tie, with beta = 0, leaves
    the policy bit for bit as it was and reports skipped_update = 1."""
    task = ScriptedTask(pizza)
    # REINFORCE's moving-average baseline remembers the first batch, so a later tied batch is still r - b != 0:
    # without a baseline a tie at 0 is no signal.
    options, tie = ({"baseline": "none"}, 0.0) if name == "reinforce" else ({}, TIE)
    algo = build_sampled(name, task, group_size, **options)
    warm = batch(task, "ordinary", group_size)
    assert step_on(algo, task, warm, [float(i % 2) for i in range(warm.num_completions)])["skipped_update"] == 0.0
    rollout = batch(task, kind, group_size)
    before = policy_snapshot(algo)
    metrics = step_on(algo, task, rollout, [tie] * rollout.num_completions)
    assert_finite(metrics, algo)
    if name == "ppo" and kind == "ordinary":
        # PPO's advantages are r - V per token: a trained critic tells tokens apart even when the scores tie.
        assert metrics["skipped_update"] < 1.0
        return
    assert metrics["skipped_update"] == 1.0 and metrics["grad_norm"] == 0.0
    assert metrics["advantage/mean"] == 0.0
    assert unchanged(before, algo)


def test_reinforce_first_tied_batch_is_no_signal(pizza):
    """The moving-average baseline starts at the first batch's mean: a tied first batch has advantage 0 exactly."""
    task = ScriptedTask(pizza)
    algo = build_sampled("reinforce", task, 8)
    rollout = batch(task, "ordinary", 8)
    before = policy_snapshot(algo)
    metrics = step_on(algo, task, rollout, [TIE] * rollout.num_completions)
    assert metrics["skipped_update"] == 1.0 and metrics["baseline"] == pytest.approx(TIE)
    assert unchanged(before, algo)


@pytest.mark.parametrize("name", ["grpo", "reinforce", "rloo"])
def test_a_kl_term_is_signal(pizza, name):
    """With beta > 0 a tied batch is not skipped where the KL is a loss term (GRPO, REINFORCE); RLOO folds its
    KL into the advantages, which then differ from 0 once the policy has moved."""
    task = ScriptedTask(pizza)
    algo = build_sampled(name, task, 4, beta=0.1)
    warm = batch(task, "ordinary", 4)
    step_on(algo, task, warm, [float(i % 2) for i in range(warm.num_completions)])
    metrics = step_on(algo, task, batch(task, "ordinary", 4), [0.0] * warm.num_completions)
    assert_finite(metrics, algo)
    assert metrics["skipped_update"] == 0.0


@pytest.mark.parametrize("name", SAMPLED)
def test_real_sampler_all_eos_batch(pizza, name, monkeypatch):
    """The bandit/PPO crash once seen (an all-EOS batch at step 79): the real sampler, made to draw EOS first,
    then the real log-prob and critic forwards on (B, 1) completions."""
    task = ScriptedTask(pizza)
    algo = build_sampled(name, task, 4)
    eos = task.tokenizer.eos_token_id
    monkeypatch.setattr(rollout_lib, "sample_categorical", lambda probs, generator=None: torch.full(
        (probs.size(0),), eos, dtype=torch.long, device=probs.device))
    task.rewards = [0.0] * 8
    metrics = algo.step([PROMPT] * 2)
    assert metrics["tokens/generated"] == 8 and metrics["completions"] == 8  # one token (EOS) each
    assert_finite(metrics, algo)
    assert metrics["skipped_update"] == 1.0


# --- DPO: no sampling during training; its degenerate inputs are its pairs ---------------------------------


def pairs(chosen, rejected):
    return {"prompts": [PROMPT] * len(chosen), "chosen": list(chosen), "rejected": list(rejected), "samples": 2 * len(chosen),
            "ties_dropped": 0, "labelled_by": "test"}


def test_dpo_empty_and_one_token_pairs_are_finite_and_learn(pizza):
    task = ScriptedTask(pizza)
    algo = build("dpo", task, pairs_per_step=4)
    algo.pairs = pairs(["", "p", "", "p"], ["p", "", "pizza", "z"])  # empty vs one token, and one token vs more
    before = policy_snapshot(algo)
    metrics = algo.step([PROMPT])
    assert_finite(metrics, algo)
    assert metrics["skipped_update"] == 0.0 and not unchanged(before, algo)


def test_dpo_pairs_without_preference_take_no_step(pizza):
    """A batch whose pairs are the same text twice (both empty: EOS only) prefers nothing: after a real step
    (AdamW momentum) the policy is left as it was."""
    task = ScriptedTask(pizza)
    algo = build("dpo", task, pairs_per_step=2)
    algo.pairs = pairs(["pizza", "pizza"], ["p", "z"])
    algo.step([PROMPT])
    algo.pairs, algo.order = pairs(["", ""], ["", ""]), []
    before = policy_snapshot(algo)
    metrics = algo.step([PROMPT])
    assert_finite(metrics, algo)
    assert metrics["skipped_update"] == 1.0 and metrics["grad_norm"] == 0.0
    assert metrics["loss"] == pytest.approx(math.log(2))  # margin 0
    assert unchanged(before, algo)


def test_dpo_when_every_sample_ties_says_so(pizza):
    class AllTie(ScriptedTask):
        def preference_pairs(self, policy, n, *, seed=0):
            task = copy.copy(self.pizza)
            task.reward = lambda prompts, completions: [TIE] * len(completions)
            return task.preference_pairs(policy, n, seed=seed, max_rounds=1)

    algo = build("dpo", AllTie(pizza), pairs=8, pairs_per_step=4)
    with pytest.raises(TaskError, match="no preference pairs: all .* sampled completions tied"):
        algo.step([PROMPT])
