"""REINFORCE, PPO and DPO losses against hand-computed values and TRL; PPO's critic isolation;
seeded runs of every algorithm on every task reproduce exactly."""

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from algorithms import ALGORITHMS
from algorithms.losses import dpo_loss, gae, masked_whiten, ppo_policy_loss, ppo_value_loss, reinforce_loss
from benchmarks.harness import RunConfig, build, run
from benchmarks.io import read_jsonl
from tasks.base import Task

MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
LOGPS = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.3, -7.0]])
OLD = torch.tensor([[-1.1, -1.6, -0.5], [-1.0, -0.3, -3.0]])
REF = torch.tensor([[-1.2, -2.0, -0.7], [-1.5, -0.1, -9.0]])


def test_reinforce_loss_by_hand():
    adv = torch.tensor([2.0, -1.0])
    # sequence log-probs: -3.5 and -1.8 (the padded -7.0 is masked out)
    expected = -(2.0 * -3.5 + -1.0 * -1.8) / 2
    assert reinforce_loss(LOGPS, adv, MASK).item() == pytest.approx(expected)
    k3 = lambda lp, ref: math.exp(ref - lp) - (ref - lp) - 1  # noqa: E731
    kl_seq = [sum(k3(LOGPS[i, t].item(), REF[i, t].item()) for t in range(3) if MASK[i, t]) for i in range(2)]
    got = reinforce_loss(LOGPS, adv, MASK, REF, kl_coef=0.5).item()
    assert got == pytest.approx(expected + 0.5 * sum(kl_seq) / 2, rel=1e-6)


def test_reinforce_gradient_is_advantage_times_score():
    logps = LOGPS.clone().requires_grad_(True)
    reinforce_loss(logps, torch.tensor([2.0, -1.0]), MASK).backward()
    assert torch.allclose(logps.grad, torch.tensor([[-1.0, -1.0, -1.0], [0.5, 0.5, 0.0]]))


def test_ppo_policy_loss_by_hand():
    adv = torch.tensor([[1.0, 1.0, -1.0], [-2.0, 0.5, 3.0]])
    terms = []
    for i in range(2):
        for t in range(3):
            if MASK[i, t]:
                r = math.exp(LOGPS[i, t].item() - OLD[i, t].item())
                a = adv[i, t].item()
                terms.append(max(-a * r, -a * min(max(r, 0.8), 1.2)))
    # ratios: e^0.1 (inside), e^-0.4=0.67 (clipped side irrelevant for A>0: min keeps 0.67), 1, e^-0.5=0.61 with A<0 -> 0.8, 1
    assert ppo_policy_loss(LOGPS, OLD, adv, MASK, 0.2).item() == pytest.approx(sum(terms) / 5)
    assert terms[3] == pytest.approx(-(-2.0) * 0.8)  # the clipped branch binds here
    # A data-parallel rank divides by the global token count over the world size: 12 tokens on 2 ranks
    assert ppo_policy_loss(LOGPS, OLD, adv, MASK, 0.2, num_tokens=torch.tensor(6.0)).item() == pytest.approx(sum(terms) / 6)


def test_ppo_value_loss_by_hand():
    values = torch.tensor([[0.5, 1.0, 0.0], [2.0, -1.0, 9.0]])
    old = torch.tensor([[0.4, 0.5, 0.0], [1.0, -1.1, 0.0]])
    returns = torch.tensor([[1.0, 1.0, 1.0], [0.0, -1.0, 0.0]])
    # token by token, max((v-R)^2, (clip(v, old-0.2, old+0.2)-R)^2):
    # (0.25, 0.25) (0, 0.09: the clipped one binds) (1, 1) (4, 1.44) (0, 0); padding ignored
    expected = 0.5 * (0.25 + 0.09 + 1.0 + 4.0 + 0.0) / 5
    assert ppo_value_loss(values, old, returns, MASK, 0.2).item() == pytest.approx(expected)
    assert ppo_value_loss(values, old, returns, MASK, 0.2, num_tokens=10.0).item() == pytest.approx(expected * 5 / 10)


def test_gae_known_answer():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 9.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [1.0, 1.0, 5.0]])  # 9.0 and 5.0 sit on padding: ignored
    adv, ret = gae(rewards, values, MASK, gamma=0.9, lam=0.5)
    # row 0: deltas 0.9*0.6-0.5=0.04, 0.9*0.7-0.6=0.03, 1-0.7=0.3; A_t = delta_t + 0.45 A_{t+1}
    # row 1: deltas 0.9*1-1=-0.1, 2-1=1 (V after the last token is 0)
    assert torch.allclose(adv, torch.tensor([[0.11425, 0.165, 0.3], [0.35, 1.0, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[0.61425, 0.765, 1.0], [1.35, 2.0, 0.0]]))
    # gamma = lam = 1: advantages are reward-to-go minus V
    adv1, _ = gae(rewards, values, MASK, gamma=1.0, lam=1.0)
    assert torch.allclose(adv1, torch.tensor([[0.5, 0.4, 0.3], [1.0, 1.0, 0.0]]))


def test_masked_whiten_ignores_padding():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 100.0]])
    w = masked_whiten(x, MASK)
    active = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    assert torch.allclose(w[MASK.bool()], (active - 3.0) / active.std(), atol=1e-6)
    assert w[1, 2] == 0


def test_dpo_loss_by_hand():
    got = dpo_loss(torch.tensor([-1.0, -3.0]), torch.tensor([-2.0, -1.0]), torch.tensor([-1.5, -2.0]),
                   torch.tensor([-1.5, -2.0]), beta=0.1)
    # margins: (0.5 - (-0.5)) = 1 and (-1 - 1) = -2; loss = mean(log(1 + exp(-beta * margin)))
    expected = (math.log1p(math.exp(-0.1)) + math.log1p(math.exp(0.2))) / 2
    assert got.item() == pytest.approx(expected)


def test_dpo_loss_equals_trl_sigmoid_loss():
    """TRL 1.16 computes the sigmoid loss inside DPOTrainer._compute_loss; run that very method on a
    stand-in trainer whose model returns the per-token log-probs, with precomputed reference log-probs."""
    from trl import DPOTrainer

    g = torch.Generator().manual_seed(0)
    B, L = 4, 5
    per_token = -torch.rand(2 * B, L, generator=g) * 3  # (2B, L): chosen rows then rejected rows
    completion_mask = torch.ones(2 * B, L + 1, dtype=torch.long)
    completion_mask[:, 0] = 0  # the prompt token
    ref_chosen, ref_rejected = -torch.rand(B, generator=g) * 10, -torch.rand(B, generator=g) * 10
    zeros = torch.zeros(2 * B, L)
    model = lambda **kw: SimpleNamespace(log_probs=per_token, entropy=zeros, mean_logits=zeros,  # noqa: E731
                                         is_top1=zeros.bool())
    identity = lambda x: x  # noqa: E731
    trainer = SimpleNamespace(
        model=SimpleNamespace(training=True), accelerator=SimpleNamespace(device="cpu", gather_for_metrics=identity, gather=identity),
        aux_loss_enabled=False, ld_alpha=None, precompute_ref_logps=True, f_divergence_type="reverse_kl",
        loss_types=["sigmoid"], loss_weights=[1.0], beta=0.3, use_weighting=False, label_smoothing=0.0,
        _metrics={"train": defaultdict(list)}, _total_train_tokens=0, _tp_size=1,
    )
    inputs = {"input_ids": torch.zeros(2 * B, L + 1, dtype=torch.long), "attention_mask": torch.ones(2 * B, L + 1),
              "completion_mask": completion_mask, "ref_chosen_logps": ref_chosen, "ref_rejected_logps": ref_rejected}
    trl_loss = DPOTrainer._compute_loss(trainer, model, inputs, return_outputs=False)
    seq = per_token.sum(1)
    ours = dpo_loss(seq[:B], seq[B:], ref_chosen, ref_rejected, beta=0.3)
    assert ours.item() == pytest.approx(trl_loss.item(), rel=1e-6)
    assert ours.item() != pytest.approx(dpo_loss(seq[B:], seq[:B], ref_chosen, ref_rejected, beta=0.3).item())


def _build(task, algo, **algo_options):
    rc = RunConfig(task=task, algo=algo, steps=1, device="cpu", precision="fp32")
    return build(rc, ALGORITHMS[algo].Config(**algo_options), {"reward_mode": "verifiable"} if task == "bandit" else {})


def test_ppo_critic_is_separate_and_learns_only_from_the_value_loss():
    _, policy, ppo, _ = _build("bandit", "ppo")
    critic = ppo.critic
    policy_ptrs = {p.data_ptr() for p in policy.parameters()}
    assert not policy_ptrs & {p.data_ptr() for p in critic.parameters()}
    assert critic in ppo.trainable_modules() and ppo.critic_optimizer in ppo.optimizers()
    # initialised from the policy's weights: same body, different storage
    body = dict(policy.model.named_parameters())
    assert all(torch.equal(p, body[n]) for n, p in critic.body.named_parameters())

    seen = []
    real_update = ppo.update

    def spy(loss, optimizer=None, params=None):
        for p in list(policy.parameters()) + list(critic.parameters()):
            p.grad = None
        norm = real_update(loss, optimizer, params)
        seen.append((optimizer is ppo.critic_optimizer,
                     any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.parameters()),
                     any(p.grad is not None and p.grad.abs().sum() > 0 for p in critic.parameters())))
        return norm

    ppo.update = spy
    before = [p.detach().clone() for p in critic.parameters()]
    ppo.step(ppo.task.train_prompts()[:4])
    c = ppo.config
    assert len(seen) == 2 * c.epochs * c.minibatches
    assert [s[0] for s in seen] == [False, True] * (c.epochs * c.minibatches)
    assert all(policy_grad and not critic_grad for is_critic, policy_grad, critic_grad in seen if not is_critic)
    assert all(critic_grad and not policy_grad for is_critic, policy_grad, critic_grad in seen if is_critic)
    assert any(not torch.equal(b, p) for b, p in zip(before, critic.parameters()))


@pytest.mark.parametrize("skip", [False, True])
def test_ppo_on_a_tied_batch_whitens_the_critics_error_unless_told_to_skip(skip):
    # Every reward ties: GAE's advantages are the critic's errors (and the KL term). TRL, verl and OpenRLHF
    # whiten them to unit variance and step the policy on that noise; skip_tied_batches steps the critic only.
    _, policy, ppo, _ = _build("bandit", "ppo", skip_tied_batches=skip)
    ppo.score = lambda rollout: torch.full((rollout.completion_ids.size(0),), 0.5)
    policy_before = [p.detach().clone() for p in policy.parameters()]
    critic_before = [p.detach().clone() for p in ppo.critic.parameters()]
    metrics = ppo.step(ppo.task.train_prompts()[:4])
    assert metrics["tied_batch"] == 1.0 and metrics["advantage/raw_std"] > 0
    policy_moved = any(not torch.equal(b, p) for b, p in zip(policy_before, policy.parameters()))
    assert any(not torch.equal(b, p) for b, p in zip(critic_before, ppo.critic.parameters()))  # the critic learns
    if skip:
        assert not policy_moved and metrics["skipped_update"] == 1.0 and metrics["advantage/std"] == 0.0
    else:
        assert policy_moved and metrics["skipped_update"] == 0.0
        assert metrics["advantage/std"] == pytest.approx(1.0, abs=1e-3)  # noise at unit variance


@pytest.mark.parametrize("task", ["pizza", "bandit"])
@pytest.mark.parametrize("algo", ["reinforce", "ppo", "dpo", "grpo"])
def test_seeded_runs_repeat_exactly(tmp_path, task, algo):
    options = {"eval_samples": 16} if task == "pizza" else {"reward_mode": "rm"}
    runs = []
    for name in ("a", "b"):
        rc = RunConfig(task=task, algo=algo, steps=2, seed=3, device="cpu", precision="fp32", out=str(tmp_path / name),
                       eval_every=1, checkpoint_every=0)
        config = ALGORITHMS[algo].Config(**({"pairs": 32} if algo == "dpo" else {}))
        summary = run(rc, config, dict(options), progress=False)
        rows = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in read_jsonl(tmp_path / name / "metrics.jsonl")]
        runs.append((rows, summary["accuracy_after"], summary["reward_after"]))
    assert runs[0] == runs[1]
    assert len(runs[0][0]) == 2 and "loss" in runs[0][0][0]


def test_pizza_preference_pairs_rank_by_reward():
    from tasks import make_task

    task = make_task("pizza")
    pairs = task.preference_pairs(task.load_policy(torch.device("cpu")), 8, seed=0)
    assert len(pairs["chosen"]) == 8 and pairs["ties_dropped"] > 0
    assert set(pairs["chosen"]) == {"pizza"} and "pizza" not in pairs["rejected"]


@pytest.mark.parametrize("argv, message", [
    (["--task", "pizza", "--algo", "ppo", "--reward-mode", "rm"], "no reward mode 'rm'"),
    (["--task", "bandit", "--algo", "grpo", "--epochs", "2"], "--epochs is an option of ppo, not of grpo"),
    (["--task", "bandit", "--algo", "reinforce", "--pairs", "8"], "--pairs is an option of dpo, not of reinforce"),
    (["--task", "pizza", "--algo", "dpo", "--bandit-seed", "1"], "--bandit-seed is an option of task bandit, not of pizza"),
])
def test_cli_refuses_options_of_other_algorithms_and_tasks(capsys, tmp_path, argv, message):
    from benchmarks.cli.main import main

    assert main(["run", *argv, "--steps", "1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_reinforce_moving_average_baseline():
    from algorithms.reinforce import REINFORCE, REINFORCEConfig

    state = SimpleNamespace(config=REINFORCEConfig(baseline_decay=0.9), baseline=None, data_parallel=None)
    assert REINFORCE._baseline(state, torch.tensor([0.0, 2.0])) == 1.0  # the first batch centres on itself
    assert REINFORCE._baseline(state, torch.tensor([3.0, 3.0])) == 1.0  # later ones see only the past
    assert state.baseline == pytest.approx(0.9 * 1.0 + 0.1 * 3.0)
    none = SimpleNamespace(config=REINFORCEConfig(baseline="none"), baseline=None)
    assert REINFORCE._baseline(none, torch.tensor([5.0])) == 0.0


def test_dpo_counts_the_pair_samples_against_the_budget_when_asked(tmp_path):
    """Building the pairs samples completions of the starting policy. Uncounted, DPO takes budget // (2 x pairs per
    step) steps and its pairs' samples come on top. With count_pair_samples they are its generated completions, like
    any other algorithm's: drawn up front from at most the budget (the cap reaches the task's pair builder), then
    the planned steps over the pairs, which sample nothing more. Before the cap, the pairs' samples (more than the
    budget) spent it at the first step and DPO trained one step."""
    summaries, calls = {}, []
    real = Task.preference_pairs
    spy = lambda self, policy, n_pairs, **kw: (calls.append(kw.get("max_samples")), real(self, policy, n_pairs, **kw))[1]
    for count in (False, True):
        rc = RunConfig(task="pizza", algo="dpo", steps=40, budget=320, seed=3, device="cpu", precision="fp32",
                       out=str(tmp_path / str(count)), eval_every=0, checkpoint_every=0)
        config = ALGORITHMS["dpo"].Config(pairs=256, pairs_per_step=4, count_pair_samples=count)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Task, "preference_pairs", spy)
            summaries[count] = run(rc, config, {"eval_samples": 16}, progress=False)
        rows = read_jsonl(tmp_path / str(count) / "metrics.jsonl")
        samples = rows[0]["pairs/samples"]
        if count:
            assert 64 <= samples <= 320 and rows[0]["completions"] == samples
            assert all(r["completions"] == 0 for r in rows[1:])
        else:
            assert samples > 320  # 256 pairs need more samples than the budget: uncounted, they come on top
            assert all(r["completions"] == 8 for r in rows)
    assert calls == [None, 320]  # the cap is the budget, asked only when the samples count
    assert summaries[False]["steps"] == 40 and summaries[False]["completions_generated"] == 320
    assert summaries[True]["steps"] == 40  # the planned steps, not one
    assert summaries[True]["completions_generated"] == read_jsonl(tmp_path / "True" / "metrics.jsonl")[0]["pairs/samples"] <= 320
