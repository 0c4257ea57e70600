"""Grouped minibatches (``Rollout.select(..., grouped=True)``): a random minibatch of rows drawn across groups, its
rows sorted so each prompt's come together, has its log-probs (and PPO's critic its values) computed with each prompt
encoded once, packed with its completions, the same numbers as every row run whole, within rounding."""

from __future__ import annotations

import pytest
import torch

from algorithms import fast_llama
from algorithms import rollout as rollout_lib
from algorithms.ppo import ValueModel
from algorithms.rollout import Rollout, _positions
from tests.algorithms.test_fast_llama import _gqa_llama, _padded_batch

G, T = 4, 5


def _rollout() -> Rollout:
    """3 left-padded prompts x 4 completions, some ended early."""
    ids, mask = _padded_batch(50)
    completion_ids = torch.randint(3, 50, (ids.size(0) * G, T), generator=torch.Generator().manual_seed(2))
    completion_mask = torch.ones_like(completion_ids)
    completion_mask[1, 3:] = 0
    completion_mask[5, 1:] = 0
    completion_mask[10, 2:] = 0
    return Rollout(prompts=[str(i) for i in range(ids.size(0)) for _ in range(G)], completions=[""] * ids.size(0) * G,
                   prompt_ids=ids.repeat_interleave(G, 0), prompt_mask=mask.repeat_interleave(G, 0),
                   completion_ids=completion_ids, completion_mask=completion_mask,
                   truncated=torch.zeros(ids.size(0) * G, dtype=torch.bool), group_size=G)


def _full_logits(model, r: Rollout) -> torch.Tensor:
    """(B, T, V) every row run whole through transformers' forward."""
    full_mask = torch.cat([r.prompt_mask, r.completion_mask], dim=1)
    return model(input_ids=torch.cat([r.prompt_ids, r.completion_ids], 1), attention_mask=full_mask,
                 position_ids=_positions(full_mask)).logits[:, r.prompt_ids.size(1) - 1: -1]


def test_select_grouped_records_the_runs_of_one_prompt_and_refuses_an_unsorted_index():
    r = _rollout()
    mb = r.select(torch.tensor([0, 2, 3, 6, 8, 9, 10]), grouped=True)
    assert mb.group_counts == (3, 1, 3)
    assert mb.group_of_rows().tolist() == [0, 0, 0, 1, 2, 2, 2]
    assert mb.select(torch.tensor([1, 2, 3]), grouped=True).group_counts == (2, 1)  # a grouped one's groups carry over
    assert r.select(torch.tensor([0, 2, 3])).group_counts is None
    with pytest.raises(ValueError, match="sort the index"):
        r.select(torch.tensor([4, 0, 5]), grouped=True)
    with pytest.raises(ValueError, match="whole groups"):
        rollout_lib.concat_rollouts([mb, r])


def test_a_grouped_minibatch_packs_each_prompt_once_with_the_full_forwards_log_probs_and_gradients(monkeypatch):
    model = _gqa_llama()
    r = _rollout()
    idx = torch.tensor([1, 2, 3, 5, 8, 10])  # groups of 3, 1 and 2 rows: unequal, the middle one alone
    mb = r.select(idx, grouped=True)
    shapes = []
    forward = fast_llama.forward
    monkeypatch.setattr(fast_llama, "forward", lambda m, input_ids, *a, **k: shapes.append(tuple(input_ids.shape))
                        or forward(m, input_ids, *a, **k))
    ours = rollout_lib.rollout_logps(model, mb)
    inputs = (mb.completion_mask.sum(1) - 1).tolist()  # each completion's real tokens but its last
    runs = [sum(inputs[0:3]), inputs[3], sum(inputs[4:6])]
    assert shapes == [(3, mb.prompt_ids.size(1) + max(runs))]  # one packed row per prompt, not 6 whole rows
    assert rollout_lib.positions_processed(model, mb) == 3 * (mb.prompt_ids.size(1) + max(runs))
    real = mb.completion_mask.bool()
    weights = torch.randn(mb.completion_ids.shape, generator=torch.Generator().manual_seed(3)) * real
    (ours * weights).sum().backward()
    packed_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    theirs = torch.log_softmax(_full_logits(model, mb).float(), -1).gather(-1, mb.completion_ids[..., None]).squeeze(-1)
    (theirs * weights).sum().backward()
    assert (ours.detach() - theirs.detach())[real].abs().max() < 1e-5
    for mine, full in zip(packed_grads, (p.grad for p in model.parameters())):
        assert torch.allclose(mine, full, atol=1e-5, rtol=1e-4)
    # The same rows without their grouping run whole, one row each: the numbers the packing must reproduce.
    shapes.clear()
    rollout_lib.rollout_logps(model, r.select(idx))
    assert shapes == [(6, mb.prompt_ids.size(1) + T)]


def test_whole_groups_named_as_runs_give_the_fixed_groups_numbers_bit_for_bit():
    model = _gqa_llama()
    r = _rollout()
    with torch.no_grad():
        fixed = rollout_lib.rollout_logps(model, r)
        runs = rollout_lib.rollout_logps(model, r.select(torch.arange(r.num_completions), grouped=True))
    assert torch.equal(fixed, runs)


def test_the_critic_reads_its_values_on_the_packed_route_as_a_head_on_the_full_forwards_hidden_states():
    policy = _gqa_llama()
    critic = ValueModel(policy)
    torch.nn.init.normal_(critic.head.weight, generator=torch.Generator().manual_seed(4))
    assert critic.head is critic.lm.lm_head and critic.head.out_features == 1
    assert fast_llama.llama_of(critic.lm) is critic.lm  # the fast route runs it
    assert critic.lm.model.embed_tokens.weight.data_ptr() != policy.model.embed_tokens.weight.data_ptr()
    assert policy.lm_head.out_features == 50  # the policy keeps its own output layer
    r = _rollout()
    for mb in (r, r.select(torch.tensor([0, 3, 4, 9, 11]), grouped=True)):
        values = critic(mb)
        full_mask = torch.cat([mb.prompt_mask, mb.completion_mask], dim=1)
        hidden = critic.body(input_ids=torch.cat([mb.prompt_ids, mb.completion_ids], 1), attention_mask=full_mask,
                             position_ids=_positions(full_mask)).last_hidden_state
        expected = critic.head(hidden[:, -T - 1:-1]).squeeze(-1)
        real = mb.completion_mask.bool()
        assert values.shape == mb.completion_ids.shape
        assert (values - expected)[real].abs().max() < 1e-5
        assert values[real].std() > 0


def test_every_forward_of_a_ppo_step_encodes_each_prompt_once(monkeypatch):
    """PPO's old and reference log-probs, its old values, and each minibatch's policy log-probs and values: all
    packed (a random minibatch of rows, sorted into runs of one prompt), none run row by row."""
    from algorithms import ALGORITHMS
    from benchmarks.harness.config import RunConfig
    from benchmarks.harness.loop import build

    rc = RunConfig(task="addition", algo="ppo", steps=1, device="cpu", precision="fp32")
    _, _, ppo, _ = build(rc, ALGORITHMS["ppo"].Config(prompts_per_step=2, samples_per_prompt=4, minibatches=2), {})
    layouts = []
    original = rollout_lib._layout
    monkeypatch.setattr(rollout_lib, "_layout", lambda *a: layouts.append(original(*a)) or layouts[-1])
    ppo.step(ppo.task.train_prompts()[:2])
    c = ppo.config
    assert len(layouts) == 3 + 2 * c.epochs * c.minibatches + 1  # and the tokens/processed metric's count
    assert all(kind == "packed" for kind, _ in layouts), [kind for kind, _ in layouts]
    assert any(counts.numel() == 2 and int(counts.sum()) == 4 for _, counts in layouts)  # minibatches of 4 rows, 2 prompts
