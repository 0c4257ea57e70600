"""grpo-bench bench grpo-vs-trl: same loss as TRL on the same batch, and the shared-prompt log-probs."""

import json

import pytest
import torch

from algorithms.rollout import generate, per_token_logps
from benchmarks.perf import WORKLOADS, Trl, same_batch_check
from tasks import make_task


@pytest.fixture(scope="module")
def pizza():
    return make_task("pizza")


@pytest.mark.parametrize("name", ["pizza-mu1", "pizza-mu2"])
def test_same_batch_loss_matches_trl(pizza, name):
    torch.manual_seed(0)
    trl = Trl(WORKLOADS[name], seed=0, device="cpu", task=pizza)
    check = same_batch_check(trl, pizza.train_prompts()[:1])
    # The check is only worth something if the loss is not trivially 0 (ratio 1, zero KL) after TRL's update.
    assert abs(check["loss_trl_updated"]) > 1e-4
    assert check["abs_diff_sampled"] <= 1e-6
    assert check["abs_diff_updated"] <= 1e-6
    assert check["max_abs_diff_advantages"] <= 1e-6
    assert check["max_abs_diff_ref_logps"] <= 1e-5


def test_shared_prompt_logps_equal_full_forward(pizza):
    """Encoding a group's prompt once gives the full forward's log-probs and gradient (fp rounding aside)."""
    model = pizza.load_policy(torch.device("cpu"))
    rollout = generate(model, pizza.tokenizer, pizza.train_prompts()[:1], 8, max_new_tokens=12, temperature=1.0,
                       generator=torch.Generator().manual_seed(0))
    model.train()
    results = []
    for group_size in (1, 8):
        model.zero_grad()
        logps = per_token_logps(model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
                                rollout.completion_mask, temperature=0.7, group_size=group_size)
        (logps * rollout.completion_mask).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        results.append((logps.detach(), grads))
    (full, g_full), (shared, g_shared) = results
    mask = rollout.completion_mask.bool()
    assert (full - shared)[mask].abs().max() < 1e-5
    assert ((g_full - g_shared).norm() / g_full.norm()) < 1e-5


def test_unknown_workload_is_one_line(run_cli):
    code, out, err = run_cli("bench", "grpo-vs-trl", "--workloads", "nope")
    assert code == 2
    assert "unknown workload 'nope'" in err and len(err.strip().splitlines()) == 1


def test_too_few_pairs_is_refused(run_cli):
    code, _, err = run_cli("bench", "grpo-vs-trl", "--workloads", "pizza-mu1", "--pairs", "2")
    assert code == 2 and "--pairs must be >= 5" in err
