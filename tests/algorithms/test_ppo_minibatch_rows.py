"""PPO's ``minibatch_rows``: ``random`` (the default, TRL's and OpenRLHF's rows in a fresh random order each epoch)
draws exactly what PPO drew before the option existed; ``groups`` (verl's minibatches of whole prompts) puts each
prompt's completions in one minibatch, the prompts in a fresh random order each epoch, so each minibatch encodes
each of its prompts once with all its rows."""

from __future__ import annotations

import pytest
import torch

from algorithms import ALGORITHMS
from algorithms import rollout as rollout_lib
from benchmarks.harness.config import RunConfig
from benchmarks.harness.loop import build


def _ppo(**options):
    rc = RunConfig(task="addition", algo="ppo", steps=1, device="cpu", precision="fp32")
    _, _, ppo, _ = build(rc, ALGORITHMS["ppo"].Config(**{"prompts_per_step": 4, "samples_per_prompt": 3, **options}), {})
    return ppo


def _rollout(ppo):
    return ppo.generate(ppo.task.train_prompts()[:4], ppo.config.samples_per_prompt)


def test_random_rows_draw_what_ppo_drew_before_the_option():
    ppo = _ppo(minibatches=3)
    r = _rollout(ppo)
    state = ppo.generator.get_state()
    ours = ppo.minibatch_indices(r)
    generator = torch.Generator().set_state(state)
    before = [i.sort().values for i in torch.randperm(12, generator=generator).split(4)]  # the former train_step's draw
    assert [i.tolist() for i in ours] == [i.tolist() for i in before]
    assert sorted(sum((i.tolist() for i in ours), [])) == list(range(12))
    # And the rows do cross prompts: some draw puts one prompt's completions in two minibatches.
    assert any(len({int(i) // 3 for i in idx}) > 1 for _ in range(10) for idx in ppo.minibatch_indices(r))


def test_groups_hold_whole_prompts_in_a_fresh_random_order_each_epoch():
    ppo = _ppo(minibatches=2, minibatch_rows="groups")
    r = _rollout(ppo)
    partitions = set()
    for _ in range(30):
        minibatches = ppo.minibatch_indices(r)
        assert len(minibatches) == 2
        assert sorted(sum((i.tolist() for i in minibatches), [])) == list(range(12))  # every row once
        prompts = []
        for idx in minibatches:
            assert idx.tolist() == sorted(idx.tolist())  # each group's rows together, as select(grouped) needs
            groups = r.group_of_rows()[idx]
            assert torch.bincount(groups).tolist().count(3) == 2  # 2 prompts, each with all 3 of its rows
            prompts.append(tuple(sorted(set(groups.tolist()))))
        partitions.add(tuple(sorted(prompts)))
    assert len(partitions) == 3  # {01|23, 02|13, 03|12}: every split of 4 prompts in two pairs is drawn


def test_a_groups_step_runs_each_minibatch_as_its_whole_prompts(monkeypatch):
    ppo = _ppo(minibatches=2, minibatch_rows="groups")
    layouts = []
    original = rollout_lib._layout
    monkeypatch.setattr(rollout_lib, "_layout", lambda *a: layouts.append(original(*a)) or layouts[-1])
    metrics = ppo.step(ppo.task.train_prompts()[:4])
    c = ppo.config
    minibatch_layouts = layouts[3:3 + 2 * c.epochs * c.minibatches]  # after old, reference and value passes
    assert len(minibatch_layouts) == 2 * c.epochs * c.minibatches
    assert all(kind == "packed" and counts.tolist() == [3, 3] for kind, counts in minibatch_layouts)
    assert torch.isfinite(torch.tensor(metrics["loss"]))


@pytest.mark.parametrize("options, message", [
    ({"minibatch_rows": "prompts"}, "minibatch_rows must be one of random, groups"),
    ({"minibatch_rows": "groups", "prompts_per_step": 3, "minibatches": 2}, "divide prompts_per_step=3"),
])
def test_bad_minibatch_rows_settings_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        ALGORITHMS["ppo"].Config(**{"samples_per_prompt": 2, "learning_rate": 1e-5, **options}).validate()
