"""The toy bandit: hidden preferences, reward modes, exact evaluation, preference pairs."""

from types import SimpleNamespace

import pytest
import torch

from tasks import TaskError, make_task
from tasks.bandit import ACTIONS, CONTEXTS, bradley_terry_comparisons, true_preferences


@pytest.fixture(scope="module")
def task():
    return make_task("bandit", reward_mode="rm")


class FixedPolicy(torch.nn.Module):
    """A stand-in LM: after a context it puts probability 1 on ``choice[c]``, after an action on EOS."""

    def __init__(self, task, choice):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # so that next(parameters()) gives a device
        vocab = task.tokenizer.convert_tokens_to_ids
        self.ctx = {vocab(c): ACTIONS[a] for c, a in zip(CONTEXTS, choice)}
        self.vocab, self.eos, self.size = vocab, task.tokenizer.eos_token_id, len(task.tokenizer)

    def forward(self, input_ids, **_):
        logits = torch.full((*input_ids.shape, self.size), -1e4)
        for i, row in enumerate(input_ids.tolist()):
            logits[i, 0, self.vocab(self.ctx[row[0]])] = 0
            logits[i, 1, self.eos] = 0
        return SimpleNamespace(logits=logits)


def test_preferences_are_softmax_of_2z_seeded():
    prefs = true_preferences(0)
    z = torch.randn(5, 10, generator=torch.Generator().manual_seed(0))
    assert prefs.shape == (len(CONTEXTS), len(ACTIONS))
    assert torch.allclose(prefs, torch.softmax(2 * z, -1))
    assert not torch.allclose(prefs, true_preferences(1))


def test_optimal_policy_true_reward_is_the_max_preference(task):
    metrics = task.evaluate(FixedPolicy(task, task.best.tolist()))
    assert metrics["true_reward"] == pytest.approx(task.prefs.max(dim=1).values.mean().item(), abs=1e-6)
    assert metrics["accuracy"] == pytest.approx(1.0)
    assert metrics["valid"] == pytest.approx(1.0)
    worst = task.evaluate(FixedPolicy(task, task.prefs.argmin(dim=1).tolist()))
    assert worst["accuracy"] == pytest.approx(0.0)
    assert worst["true_reward"] == pytest.approx(task.prefs.min(dim=1).values.mean().item(), abs=1e-6)


def test_rewards_by_mode(task):
    verifiable = make_task("bandit", reward_mode="verifiable")
    best = [ACTIONS[int(a)] for a in task.best]
    other = [ACTIONS[(int(a) + 1) % 10] for a in task.best]
    prompts = list(CONTEXTS)
    assert verifiable.score(prompts, best) == [1.0] * 5
    assert verifiable.score(prompts, other) == [0.0] * 5
    assert verifiable.score(["a"], ["12"]) == [0.0]
    rm = task.score(prompts, best)
    assert rm == pytest.approx([task.rm[c, int(task.best[c])].item() for c in range(5)])
    assert task.score(["a", "a"], ["", "x"]) == [task.rm.min().item()] * 2
    with pytest.raises(TaskError):
        task.score(["z"], ["1"])


def test_reward_model_recovers_the_preference_order(task):
    # Bradley-Terry scores are log-preferences up to a shift: they correlate strongly with log p
    logp = task.prefs.log() - task.prefs.log().mean(dim=1, keepdim=True)
    corr = torch.corrcoef(torch.stack([logp.flatten(), task.rm.flatten()]))[0, 1]
    assert corr > 0.9


def test_bradley_terry_draws_follow_the_preferences():
    prefs = torch.tensor([[0.8, 0.2]])
    _, win, _ = bradley_terry_comparisons(prefs, 20000, torch.Generator().manual_seed(0))
    assert (win == 0).float().mean().item() == pytest.approx(0.8, abs=0.01)


def test_starting_policy_matches_the_preferences(task):
    policy = task.load_policy(torch.device("cpu"))
    probs = task.action_probs(policy)
    assert (probs - task.prefs).abs().max() < 0.1  # the SFT fit, not the optimum
    assert task.evaluate(policy)["accuracy"] < 0.7


def test_preference_pairs_are_labelled_and_seeded(task):
    policy = task.load_policy(torch.device("cpu"))
    pairs = task.preference_pairs(policy, 200, seed=1)
    assert len(pairs["chosen"]) == len(pairs["rejected"]) == len(pairs["prompts"]) == 200
    assert all(c != r for c, r in zip(pairs["chosen"], pairs["rejected"]))
    assert pairs["ties_dropped"] > 0 and "Bradley-Terry" in pairs["labelled_by"]
    assert pairs == task.preference_pairs(policy, 200, seed=1)
    # the chosen action is the truly preferred one more often than not
    c = [CONTEXTS.index(p) for p in pairs["prompts"]]
    better = [task.prefs[i, ACTIONS.index(w)] > task.prefs[i, ACTIONS.index(l)] for i, w, l in zip(c, pairs["chosen"], pairs["rejected"])]
    assert sum(better) / len(better) > 0.6
