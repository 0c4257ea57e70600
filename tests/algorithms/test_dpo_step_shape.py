"""DPO's step computes what the paper's Eq. 7 asks and no more: each pair's chosen and rejected rows
together, a run of one prompt encoded once, and the frozen reference's log-probs of each pair computed once and
kept, in the checkpoint too. Held against the step as it was (rows chosen first then rejected, each row its own
prompt, the reference run every step) on the same pairs: the same loss, the same gradient, to float32 rounding."""

import copy

import pytest
import torch

from algorithms import ALGORITHMS
from algorithms import rollout as rollout_lib
from algorithms.base import Sampling
from algorithms.losses import dpo_loss, sequence_logps
from algorithms.rollout import rollout_from_text

PAIRS = {"prompts": ["ravin likes ", "ravin likes ", "anna eats ", "ravin likes "],
         "chosen": ["pizza", "pizza and pasta", "pizza", "p"], "rejected": ["pasta", "", "soup", "pizzas"],
         "samples": 8, "ties_dropped": 0, "labelled_by": "test"}


@pytest.fixture(scope="module")
def pizza():
    from tasks import make_task

    return make_task("pizza")


def build(pizza, **options):
    torch.manual_seed(0)
    cls = ALGORITHMS["dpo"]
    policy = pizza.load_policy(torch.device("cpu"))
    config = cls.Config(learning_rate=1e-2, prompts_per_step=1, **options)
    algo = cls(policy, copy.deepcopy(policy).requires_grad_(False), pizza, config,
               Sampling(max_new_tokens=pizza.generation.max_new_tokens), seed=0)
    algo.pairs = copy.deepcopy(PAIRS)
    return algo


def as_it_was(algo, idx):
    """The loss of the pairs ``idx`` as the step computed it before: chosen rows first, then rejected, each row its
    own prompt (group size 1), the reference's log-probs computed on the same batch."""
    n = len(idx)
    batch = rollout_from_text(algo.tokenizer, [algo.pairs["prompts"][i] for i in idx] * 2,
                              [algo.pairs["chosen"][i] for i in idx] + [algo.pairs["rejected"][i] for i in idx],
                              algo.device)
    assert batch.group_size == 1
    ref = sequence_logps(algo.frozen_logps(algo.ref_policy, batch), batch.completion_mask)
    seq = sequence_logps(algo.logps(algo.policy, batch), batch.completion_mask)
    return dpo_loss(seq[:n], seq[n:], ref[:n], ref[n:], beta=algo.config.beta)


def test_a_step_has_the_loss_and_gradient_of_the_step_as_it_was(pizza):
    algo = build(pizza, pairs_per_step=4)
    losses = []

    def keep_gradient(loss, *args, **kwargs):  # the step's backward, without the optimizer's step
        algo.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        losses.append(float(loss.detach()))
        return 1.0

    algo.update = keep_gradient
    with torch.no_grad():  # the policy away from its reference, so that the margins are not 0
        for p in algo.policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    order = list(reversed(range(4)))  # _next_pairs pops from the end of a seeded permutation
    algo.order = list(order)
    metrics = algo.step([])
    now = {name: p.grad.clone() for name, p in algo.policy.named_parameters() if p.grad is not None}
    algo.optimizer.zero_grad(set_to_none=True)
    before = as_it_was(algo, order[::-1])
    before.backward()
    value = float(before.detach())
    assert metrics["loss"] == pytest.approx(value, rel=1e-5, abs=1e-6) and losses[0] == metrics["loss"]
    assert value != pytest.approx(0.6931, abs=1e-3)  # margins not 0: not log 2
    for name, p in algo.policy.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(now[name], p.grad, rtol=1e-4, atol=1e-6)
    assert any(float(g.abs().max()) > 0 for g in now.values())


def test_a_pairs_prompt_is_encoded_once(pizza):
    """The step's batch (pairs 0 and 1, as the step lays them out) takes the packed route: each prompt once with its
    two completions; the batch as it was runs every row whole."""
    algo = build(pizza)
    paired = rollout_from_text(algo.tokenizer, [p for p in PAIRS["prompts"][:2] for _ in range(2)],
                               ["pizza", "pasta", "pizza and pasta", ""], algo.device, group_size=2)
    layout = rollout_lib._layout(algo.policy, paired.prompt_ids, paired.prompt_mask, paired.completion_mask, 2)
    assert layout[0] == "packed" and layout[1].tolist() == [2, 2]
    assert rollout_lib.positions_processed(algo.policy, paired) < rollout_lib.positions_processed(
        algo.policy, rollout_from_text(algo.tokenizer, paired.prompts, paired.completions, algo.device))


def test_the_reference_runs_once_per_pair_and_gives_what_it_gives_each_step(pizza):
    algo = build(pizza, pairs_per_step=2)
    rows_scored = []
    frozen = algo.frozen_logps

    def counting(model, rollout):
        rows_scored.append(rollout.num_completions)
        return frozen(model, rollout)

    algo.frozen_logps = counting
    for _ in range(6):  # three passes over the 4 pairs, reshuffled after each
        algo.step([])
    assert sum(rows_scored) == 8  # each pair's two rows, once
    for i in range(4):
        key = (PAIRS["prompts"][i], PAIRS["chosen"][i], PAIRS["rejected"][i])
        batch = rollout_from_text(algo.tokenizer, [PAIRS["prompts"][i]] * 2, [PAIRS["chosen"][i], PAIRS["rejected"][i]],
                                  algo.device)
        fresh = sequence_logps(frozen(algo.ref_policy, batch), batch.completion_mask)
        torch.testing.assert_close(algo.reference[key], fresh, rtol=1e-5, atol=1e-5)


def test_new_pairs_get_their_own_reference_and_a_checkpoint_keeps_it(pizza):
    algo = build(pizza, pairs_per_step=2)
    algo.step([])
    algo.step([])
    state = algo.state_dict()
    assert len(state["reference"]) == 4
    resumed = build(pizza, pairs_per_step=2)
    resumed.load_state_dict(copy.deepcopy(state))
    assert resumed.reference.keys() == algo.reference.keys()
    resumed.frozen_logps = lambda *a: pytest.fail("a resumed run recomputed a reference it had kept")
    resumed.step([])
    # Other pairs at the same indices (a test that swaps them, a task's new pairs): their reference is theirs.
    algo.pairs = {**PAIRS, "chosen": ["", "", "", ""], "rejected": ["", "", "", ""]}
    algo.order = []
    metrics = algo.step([])
    assert metrics["skipped_update"] == 1.0 and metrics["loss"] == pytest.approx(0.6931472, abs=1e-6)  # margin 0


def test_a_dpo_run_resumed_after_a_crash_takes_the_steps_of_the_uninterrupted_one(tmp_path):
    """With its pairs, their order and the kept reference in the checkpoint, a DPO run killed after step 5 and
    resumed from its step-4 checkpoint logs what the uninterrupted run logs (that the reference itself is restored,
    not computed again, is the test above's)."""
    from benchmarks.harness import RunConfig, run
    from benchmarks.io import read_jsonl
    from tests.conftest import strip_timing

    config = ALGORITHMS["dpo"].Config(pairs=8, pairs_per_step=2)

    def settings(out):
        return RunConfig(task="pizza", algo="dpo", steps=6, seed=3, out=str(out), eval_every=3, checkpoint_every=2,
                         device="cpu")

    run(settings(tmp_path / "full"), config, {"eval_samples": 32}, progress=False)

    class Crash(Exception):
        pass

    def crash_at_5(row):
        if row["step"] == 5:
            raise Crash

    with pytest.raises(Crash):
        run(settings(tmp_path / "resumed"), config, {"eval_samples": 32}, on_step=crash_at_5, progress=False)
    resumed = settings(tmp_path / "resumed")
    resumed.resume = True
    run(resumed, config, {"eval_samples": 32}, progress=False)
    full, again = (strip_timing(read_jsonl(tmp_path / d / "metrics.jsonl")) for d in ("full", "resumed"))
    assert again == full and len(full) == 6
    assert len({r["loss"] for r in full}) > 1  # the run moved
