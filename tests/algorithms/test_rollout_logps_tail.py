"""The log-prob tail (logits -> per-token log-probs, entropies, sum of pi^2, and the gradient back to the logits),
computed a chunk of rows at a time: the same numbers, bit for bit, as the whole-tensor expression it replaced."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from algorithms import rollout as rollout_lib


def whole_tensor(logits, row_of, tokens, temperature):
    """The expression per_token_logps used before chunking: the reference, autograd's gradient included."""
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    logps = x[row_of, tokens] - torch.logsumexp(x, dim=-1)[row_of]
    with torch.no_grad():
        log_probs = F.log_softmax(x, dim=-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)[row_of]
        sum_pi_squared = log_probs.mul(2).exp().sum(-1)[row_of]
    return logps, entropy, sum_pi_squared


def packed_case(dtype):
    """A packed group's layout: row 0 predicts token 0 of all 4 completions (two of them the same token), the
    other rows one token each; the weights make a loss whose gradient differs per token."""
    g = torch.Generator().manual_seed(0)
    R, V, B, T = 13, 300, 4, 4
    logits = (torch.randn(R, V, generator=g) * 3).to(dtype)
    row_of = torch.cat([torch.zeros(B, 1, dtype=torch.long), 1 + torch.arange(B * (T - 1)).view(B, T - 1)], dim=1)
    tokens = torch.randint(0, V, (B, T), generator=g)
    tokens[1, 0] = tokens[0, 0]  # one (row, token) pair picked twice
    weights = torch.randn(B, T, generator=g)
    return logits, row_of, tokens, weights


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_tail_equals_the_whole_tensor_expression_bit_for_bit(dtype, temperature, monkeypatch):
    monkeypatch.setattr(rollout_lib, "LOGPS_CHUNK_ELEMENTS", 4 * 300)  # 4 rows a chunk: 4 chunks, the last short
    logits, row_of, tokens, weights = packed_case(dtype)
    ours_in = logits.clone().requires_grad_()
    logps, entropy, sum_pi_squared = rollout_lib.logps_from_logits(
        ours_in, row_of, tokens, temperature=temperature, with_entropy=True, with_sum_pi_squared=True)
    (logps * weights).sum().backward()
    reference_in = logits.clone().requires_grad_()
    ref_logps, ref_entropy, ref_sum_pi_squared = whole_tensor(reference_in, row_of, tokens, temperature)
    (ref_logps * weights).sum().backward()
    assert torch.equal(logps, ref_logps)
    assert torch.equal(entropy, ref_entropy) and torch.equal(sum_pi_squared, ref_sum_pi_squared)
    assert ours_in.grad.dtype == dtype and torch.equal(ours_in.grad, reference_in.grad)
    # the pair picked twice got both gradients: a scatter that overwrote instead of summing would miss one
    row, token = row_of[0, 0], tokens[0, 0]
    assert ours_in.grad[row, token].float().item() != 0.0
    assert not entropy.requires_grad and not sum_pi_squared.requires_grad


def test_log_probs_are_a_normalised_distribution_and_need_no_grad():
    """Independent of the reference expression: exp of the log-probs of every token of a row sums to 1, the
    entropy is -sum p log p, and under inference mode the tail runs without a graph."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 50, generator=g, dtype=torch.float64).float()
    row_of = torch.arange(3)[:, None].expand(3, 50)
    tokens = torch.arange(50)[None].expand(3, 50)
    with torch.inference_mode():
        logps, entropy = rollout_lib.logps_from_logits(logits, row_of, tokens, temperature=0.5, with_entropy=True)
    p = torch.softmax(logits.double() / 0.5, dim=-1)
    assert torch.allclose(logps.double().exp().sum(-1), torch.ones(3, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(entropy[:, 0].double(), -(p * p.log()).sum(-1), atol=1e-5)


def test_an_entropy_bonus_keeps_the_entropy_in_the_graph():
    logits = torch.randn(2, 20, generator=torch.Generator().manual_seed(2), requires_grad=True)
    row_of, tokens = torch.arange(2)[:, None], torch.tensor([[3], [7]])
    logps, entropy = rollout_lib.logps_from_logits(logits, row_of, tokens, with_entropy=True, entropy_grad=True)
    entropy.sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
