"""``grpo-bench check mu1``: why a GRPO loss reads 0 at mu = 1 while the policy still learns.

At mu = 1 the sampling policy is the current one, so pi_theta_old = pi_theta.detach() and every ratio
r = exp(logp - logp.detach()) is 1 in value. With beta = 0 and the paper's aggregation ("grpo"),

    loss = -1/G sum_i 1/|o_i| sum_t r_{i,t} A_i = -1/G sum_i A_i = 0       (group-centred advantages)

while its gradient is d r / d theta = grad log pi, i.e. exactly the REINFORCE gradient with
group-standardised advantages and per-token averaging. The checks below measure this on a real model
and real rollouts of a task (the task is a parameter), and the cases where the value is *not* 0:
beta > 0 (the KL term), token-weighted aggregations (bnpo, dapo, dr_grpo weigh A_i by |o_i|), and
iterations 2..mu of a multi-update step (ratios move away from 1 and get clipped).
"""

from __future__ import annotations

import dataclasses
import random
from collections import defaultdict
from dataclasses import field
from pathlib import Path
from typing import Callable, Optional

import torch

from algorithms.kl import k3_kl
from algorithms.grpo import GRPOConfig
from algorithms.losses import group_advantages, masked_mean_per_sequence
from algorithms.rollout import Rollout, rollout_logps
from benchmarks.errors import UsageError
from benchmarks.harness import build, resolve, train_steps
from benchmarks.io import atomic_write_json, save_figure
from benchmarks.study import StudySettings, option

ZERO_TOL = 1e-6
GRAD_TOL = 1e-5
BETA = 0.04
TOKEN_WEIGHTED = ("bnpo", "dapo", "dr_grpo")


# --------------------------------------------------------------------------------------------
# The checks: each takes a policy and a real rollout and returns plain numbers
# --------------------------------------------------------------------------------------------


def varied_rollout(algo, prompts: list[str], group_size: int, tries: int = 20,
                   lengths_vary: bool = False) -> tuple[Rollout, torch.Tensor]:
    """A rollout in which some group's rewards differ (otherwise every advantage is 0 and nothing is tested).

    With ``lengths_vary`` such a group must also hold completions of different lengths: when they all
    hit the length cap, token-weighted losses (check 4) equal the grpo one and there is nothing to show."""
    for _ in range(tries):
        rollout = algo.generate(prompts, group_size)
        rewards = algo.score(rollout)
        varied = rewards.view(-1, group_size).std(dim=1) > 0
        if lengths_vary:
            varied &= rollout.completion_mask.sum(dim=1).view(-1, group_size).float().std(dim=1) > 0
        if varied.any():
            return rollout, rewards
    wanted = "rewards and completion lengths both vary" if lengths_vary else "rewards vary"
    raise UsageError(f"{tries} rollouts had no group whose {wanted}: the checks need one")


def _flat_grad(loss: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)])


def reinforce_equivalence(policy, rollout: Rollout, advantages: torch.Tensor, temperature: float) -> dict:
    """(1)+(2): the mu = 1 GRPO loss value and its gradient vs the REINFORCE surrogate
    -1/G sum_i A_i * (1/|o_i|) sum_t log pi(o_{i,t}) with the same group-standardised advantages."""
    params = [p for p in policy.parameters() if p.requires_grad]
    mask = rollout.completion_mask.float()
    logps = rollout_logps(policy, rollout, temperature=temperature)
    loss = GRPOConfig(loss_type="grpo", beta=0.0).loss()(logps, None, None, advantages, mask)
    g_grpo = _flat_grad(loss, params)
    logps = rollout_logps(policy, rollout, temperature=temperature)
    reinforce = -(advantages * masked_mean_per_sequence(logps, mask)).mean()
    g_reinforce = _flat_grad(reinforce, params)
    return {
        "loss": loss.item(),
        "reinforce_surrogate": reinforce.item(),
        "grad_norm": g_grpo.norm().item(),
        "grad_rel_err": ((g_grpo - g_reinforce).abs().max() / g_reinforce.abs().max().clamp(min=1e-30)).item(),
    }


@torch.no_grad()
def kl_term(policy, ref, rollout: Rollout, advantages: torch.Tensor, temperature: float, beta: float = BETA) -> dict:
    """(3): at mu = 1 with beta > 0 the policy term is 0, so the loss is beta x the mean k3 KL."""
    mask = rollout.completion_mask.float()
    logps = rollout_logps(policy, rollout, temperature=temperature)
    ref_logps = rollout_logps(ref, rollout, temperature=temperature)
    loss = GRPOConfig(loss_type="grpo", beta=beta).loss()(logps, None, ref_logps, advantages, mask)
    kl = masked_mean_per_sequence(k3_kl(logps, ref_logps), mask).mean()
    return {"loss": loss.item(), "mean_kl": kl.item(), "beta_kl": beta * kl.item(), "diff": abs(loss.item() - beta * kl.item())}


@torch.no_grad()
def length_decomposition(policy, rollout: Rollout, advantages: torch.Tensor, temperature: float, max_len: int) -> dict:
    """(4): at mu = 1, beta = 0 every active token contributes -A_i, so

        grpo:    loss = -1/B   sum_i A_i                 (= 0: advantages are centred per group)
        bnpo:    loss = -1/N   sum_i A_i |o_i|           (N = active tokens in the batch; = dapo here)
        dr_grpo: loss = -1/(B L) sum_i A_i |o_i|         (L = max_completion_length)

    Grouping completions by length gives each length's share of that sum."""
    mask = rollout.completion_mask.float()
    logps = rollout_logps(policy, rollout, temperature=temperature)
    lengths = mask.sum(1)
    B, N = mask.size(0), mask.sum().item()
    losses = {lt: GRPOConfig(loss_type=lt, beta=0.0).loss(max_len)(logps, None, None, advantages, mask).item()
              for lt in ("grpo",) + TOKEN_WEIGHTED}
    by_length = defaultdict(lambda: {"completions": 0, "sum_advantage": 0.0})
    for n, a in zip(lengths.tolist(), advantages.tolist()):
        by_length[int(n)]["completions"] += 1
        by_length[int(n)]["sum_advantage"] += a
    rows = []
    for n, r in sorted(by_length.items()):
        rows.append({"length": n, **r, "bnpo_share": -r["sum_advantage"] * n / N, "dr_grpo_share": -r["sum_advantage"] * n / (B * max_len)})
    return {
        "losses": losses,
        "rows": rows,
        "bnpo_from_rows": sum(r["bnpo_share"] for r in rows),
        "dr_grpo_from_rows": sum(r["dr_grpo_share"] for r in rows),
        "sum_advantage": advantages.sum().item(),
        "tokens": N,
        "completions": B,
        "max_len": max_len,
    }


# --------------------------------------------------------------------------------------------
# Training runs (the GRPO class through the harness's build, so settings resolve as in `grpo-bench run`)
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Setup:
    """What the check trains on: a task with its options, and settings every GRPO build shares.

    The defaults are the task's and GRPO's own; a real model (GSM8K) needs smaller groups, shorter
    completions and a smaller evaluation to fit a CPU."""

    task: str = "pizza"
    task_options: dict = dataclasses.field(default_factory=dict)
    max_new_tokens: Optional[int] = None
    shared: dict = dataclasses.field(default_factory=dict)  # GRPOConfig fields: group_size, learning_rate, ...
    metric: str = "accuracy"  # the evaluation metric that must rise (GSM8K: "reward", accuracy is ~0 at 135M)


@dataclasses.dataclass
class Mu1Settings(StudySettings):
    """What ``grpo-bench check mu1`` asks for. An option left at None takes the task's or GRPO's own value,
    and only the options given are recorded with the result."""

    task: str = field(default="pizza", metadata={"help": "task to train and roll out on"})
    steps: int = field(default=30, metadata={"help": "training steps of the mu = 1, beta = 0 run"})
    seed: int = option("seed")
    # report.md, results.json, mu1.png
    out: Optional[str] = option("out", None, shown="results/mu1, or results/mu1-TASK for another task")
    # None: results/checks.md with the default ``out``, none with another: a check written elsewhere does not
    # rewrite the README of the folder it ran in
    readme: Optional[str] = option("readme", shown="results/checks.md, none with --out")
    group_size: Optional[int] = field(default=None, metadata={"help": "G (default: GRPO's)"})
    prompts_per_step: Optional[int] = field(default=None, metadata={"help": "prompts per step (default: GRPO's)"})
    learning_rate: Optional[float] = field(default=None, metadata={"help": "(default: the task's)"})
    max_new_tokens: Optional[int] = field(default=None, metadata={"help": "completion length cap (default: the task's)"})
    eval_questions: Optional[int] = field(default=None, metadata={
        "help": "gsm8k: evaluation questions (default: the task's)"})
    eval_k: Optional[int] = field(default=None, metadata={
        "help": "gsm8k: samples per evaluation question (default: the task's)"})
    eval_every: Optional[int] = field(default=None, metadata={"help": "evaluate every N steps (default: steps // 6)"})
    mu_steps: Optional[int] = field(default=None, metadata={"help": "steps of the mu = 4 run (default: 5)"})
    metric: Optional[str] = field(default=None, metadata={
        "help": "evaluation metric that must rise (default: accuracy; GSM8K at 135M: reward)",
        "choices": ("accuracy", "reward")})


def build_grpo(setup: Setup, seed: int, steps: int, **grpo_options):
    rc, config, task_options = resolve({"task": setup.task, "algo": "grpo", "steps": steps, "seed": seed, "device": "cpu",
                                        "precision": "fp32", "out": "unused", "max_new_tokens": setup.max_new_tokens,
                                        **setup.shared, **grpo_options, **setup.task_options})
    return build(rc, config, task_options)


def train(setup: Setup, steps: int, seed: int, eval_every: int = 0, evaluate: bool = True,
          **grpo_options) -> tuple[list[dict], list[dict], tuple]:
    """Run ``steps`` GRPO steps; returns (per-step metrics, [evaluations], (task, policy, algo)).

    With ``evaluate`` the policy is evaluated before, every ``eval_every`` steps and after."""
    task, policy, algo, _ = build_grpo(setup, seed, steps, **grpo_options)
    rows, evals = [], [{"step": 0, **task.evaluate(policy, seed=seed)}] if evaluate else []
    for step, metrics, _ in train_steps(algo, task, random.Random(seed), range(1, steps + 1)):  # the harness's loop
        rows.append({"step": step, **metrics})
        if evaluate and (step == steps or (eval_every and step % eval_every == 0)):
            evals.append({"step": step, **task.evaluate(policy, seed=seed)})
    return rows, evals, (task, policy, algo)


def run_all(setup: Setup, steps: int, seed: int, mu: int = 4, mu_steps: int = 5, eval_every: Optional[int] = None,
            progress=print) -> dict:
    progress(f"[1/4] mu = 1, beta = 0, loss_type grpo: {steps} training steps on {setup.task}")
    eval_every = max(1, steps // 6) if eval_every is None else eval_every
    rows, evals, (task, policy, algo) = train(setup, steps, seed, eval_every=eval_every, mu=1, beta=0.0, loss_type="grpo")
    with_signal = [r for r in rows if r["advantage/std"] > 0]
    training = {
        "steps": steps,
        "max_abs_loss": max(abs(r["loss/iter1"]) for r in rows),
        "steps_with_reward_variance": len(with_signal),
        "min_grad_norm_with_variance": min((r["grad_norm/iter1"] for r in with_signal), default=0.0),
        "metric": setup.metric,
        "accuracy_before": evals[0]["accuracy"],
        "accuracy_after": evals[-1]["accuracy"],
        "metric_before": evals[0][setup.metric],
        "metric_after": evals[-1][setup.metric],
        "curve": [{k: r[k] for k in ("step", "loss/iter1", "grad_norm/iter1", "reward/mean", "advantage/std")} for r in rows],
        "evals": [{"step": e["step"], "accuracy": e["accuracy"], "reward": e["reward"]} for e in evals],
    }

    progress("[2/4] REINFORCE gradient, KL term and length decomposition on fresh rollouts")
    temperature = algo.sampling.temperature
    prompts = random.Random(seed + 1).choices(task.train_prompts(), k=algo.config.prompts_per_step)
    # The initial policy (= reference) and the trained one, each on a rollout of its own.
    _, initial, initial_algo, _ = build_grpo(setup, seed, steps, mu=1, beta=0.0)
    initial_rollout, initial_rewards = varied_rollout(initial_algo, prompts, algo.config.group_size, lengths_vary=True)
    initial_adv = group_advantages(initial_rewards, algo.config.group_size)
    trained_rollout, trained_rewards = varied_rollout(algo, prompts, algo.config.group_size)
    trained_adv = group_advantages(trained_rewards, algo.config.group_size)
    reinforce = reinforce_equivalence(initial, initial_rollout, initial_adv, temperature)
    kl_step0 = kl_term(initial, initial, initial_rollout, initial_adv, temperature)
    kl_trained = kl_term(policy, initial, trained_rollout, trained_adv, temperature)
    lengths = length_decomposition(initial, initial_rollout, initial_adv, temperature, algo.sampling.max_new_tokens)

    progress(f"[3/4] mu = {mu}: {mu_steps} steps, loss and clip fraction per iteration")
    mu_rows, _, _ = train(setup, mu_steps, seed, evaluate=False, mu=mu, beta=0.0, loss_type="grpo")
    multi = {
        "mu": mu,
        "steps": mu_steps,
        "learning_rate": algo.config.learning_rate,
        "per_iteration": [
            {"iteration": k,
             "mean_abs_loss": sum(abs(r[f"loss/iter{k}"]) for r in mu_rows) / len(mu_rows),
             "mean_clipfrac": sum(r[f"clipfrac/iter{k}"] for r in mu_rows) / len(mu_rows),
             "max_clipfrac": max(r[f"clipfrac/iter{k}"] for r in mu_rows)}
            for k in range(1, mu + 1)
        ],
    }
    settings = {"task_options": setup.task_options, "max_new_tokens": algo.sampling.max_new_tokens,
                "group_size": algo.config.group_size, "prompts_per_step": algo.config.prompts_per_step,
                "learning_rate": algo.config.learning_rate, "eval_every": eval_every, "mu_steps": mu_steps}
    return {"task": setup.task, "seed": seed, "group_size": algo.config.group_size, "settings": settings, "training": training,
            "reinforce": reinforce, "kl_step0": kl_step0, "kl_trained": kl_trained, "lengths": lengths, "multi": multi}


# --------------------------------------------------------------------------------------------
# Verdicts, report, plot
# --------------------------------------------------------------------------------------------


def _metric(t: dict) -> str:
    return t.get("metric", "accuracy")


def _metric_before(t: dict) -> float:
    return t.get("metric_before", t["accuracy_before"])


def _metric_after(t: dict) -> float:
    return t.get("metric_after", t["accuracy_after"])


def verdicts(r: dict) -> list[tuple[str, str, bool]]:
    t, m = r["training"], r["multi"]
    later = m["per_iteration"][1:]
    return [
        ("1. mu=1, beta=0, grpo: |loss| <= 1e-6 at every step", f"max |loss| = {t['max_abs_loss']:.2e} over {t['steps']} steps",
         t["max_abs_loss"] <= ZERO_TOL),
        ("1. ... while the gradient is not 0", f"min grad norm = {t['min_grad_norm_with_variance']:.3g} over the "
         f"{t['steps_with_reward_variance']} steps with reward variance", t["min_grad_norm_with_variance"] > 0),
        (f"1. ... and {_metric(t)} rises", f"{_metric_before(t):.3f} -> {_metric_after(t):.3f}",
         _metric_after(t) > _metric_before(t)),
        ("2. mu=1 gradient = REINFORCE gradient", f"max rel err {r['reinforce']['grad_rel_err']:.2e} (grad norm "
         f"{r['reinforce']['grad_norm']:.3g})", r["reinforce"]["grad_rel_err"] <= GRAD_TOL),
        ("3. beta>0: loss = 0 at step 0 (policy = reference)", f"loss {r['kl_step0']['loss']:.2e}, KL {r['kl_step0']['mean_kl']:.2e}",
         abs(r["kl_step0"]["loss"]) <= ZERO_TOL),
        ("3. beta>0 after training: loss = beta x mean KL", f"loss {r['kl_trained']['loss']:.6f}, beta x KL "
         f"{r['kl_trained']['beta_kl']:.6f}", r["kl_trained"]["diff"] <= ZERO_TOL and r["kl_trained"]["mean_kl"] > 0),
        ("4. bnpo/dapo/dr_grpo at mu=1 are not 0", ", ".join(f"{k} {v:.2e}" for k, v in r["lengths"]["losses"].items()),
         all(abs(r["lengths"]["losses"][k]) > ZERO_TOL for k in TOKEN_WEIGHTED)),
        (f"5. mu={m['mu']}: iterations 2..mu have non-zero loss", ", ".join(f"iter{p['iteration']} {p['mean_abs_loss']:.2e}" for p in m["per_iteration"]),
         all(p["mean_abs_loss"] > ZERO_TOL for p in later)),
        (f"5. mu={m['mu']}: some ratios are clipped", ", ".join(f"iter{p['iteration']} {p['mean_clipfrac']:.3f}" for p in m["per_iteration"]),
         any(p["max_clipfrac"] > 0 for p in later)),
    ]


def length_table(lengths: dict) -> str:
    # Table cells cannot hold "|", so the length |o_i| is written len_i.
    lines = ["| completion length len_i | completions | sum of A_i | bnpo/dapo share -sum(A_i len_i)/N | dr_grpo share -sum(A_i len_i)/(B L) |",
             "|---|---|---|---|---|"]
    for row in lengths["rows"]:
        lines.append(f"| {row['length']} | {row['completions']} | {row['sum_advantage']:+.4f} | {row['bnpo_share']:+.4f} | {row['dr_grpo_share']:+.4f} |")
    lines.append(f"| **total** | {lengths['completions']} | {lengths['sum_advantage']:+.2e} | {lengths['bnpo_from_rows']:+.4f} | "
                 f"{lengths['dr_grpo_from_rows']:+.4f} |")
    return "\n".join(lines)


def explanation(r: dict, out: Path | str = "results/mu1") -> str:
    """The plain-words README section, with the numbers this run measured and ``out``, the folder they are in."""
    t, rf, k0, kt, ln, m = r["training"], r["reinforce"], r["kl_step0"], r["kl_trained"], r["lengths"], r["multi"]
    later = m["per_iteration"][1:]
    return f"""### Why the GRPO loss reads 0 at mu = 1 (and the model still learns)

*Measured by `{r['command']}`; details in `{Path(out).as_posix()}/`.*

With mu = 1 (one update per batch of samples, the common setting) the policy that sampled the completions *is*
the policy being updated, so every importance ratio pi_theta / pi_theta_old equals 1. With beta = 0 and the
paper's averaging, the loss is then minus the average advantage, and group-standardised advantages average to 0
in every group. The *value* is 0; the *gradient* is not: the ratio's gradient is the gradient of log pi, which
makes the update exactly the REINFORCE policy gradient with group-standardised advantages.

- Over {t['steps']} GRPO steps on {r['task']} (mu = 1, beta = 0, loss_type grpo) the largest |loss| was
  {t['max_abs_loss']:.1e}, the gradient norm was at least {t['min_grad_norm_with_variance']:.3g} on every step
  whose rewards varied ({t['steps_with_reward_variance']} of {t['steps']}), and {_metric(t)} went
  {_metric_before(t):.3f} -> {_metric_after(t):.3f}.
- The gradient of that zero loss equals the REINFORCE gradient to a relative error of {rf['grad_rel_err']:.1e}.
- With beta = {BETA} the loss is beta x the mean KL to the reference: 0 at step 0, when policy and reference are
  the same weights (loss {k0['loss']:.1e}), and {kt['loss']:.6f} = {BETA} x {kt['mean_kl']:.6f} after training.
- Aggregations that average over *tokens* (bnpo, dapo, dr_grpo) are not 0 at mu = 1: each completion's advantage
  is weighted by its length, and long and short completions' advantages do not cancel. On one rollout the
  losses were {', '.join(f'{k} {v:.4f}' for k, v in ln['losses'].items() if k != 'grpo')}, against grpo
  {ln['losses']['grpo']:.1e} (sum of advantages {ln['sum_advantage']:.1e}). Per completion length (N = {ln['tokens']}
  active tokens, B = {ln['completions']} completions, L = {ln['max_len']}), each row's share of the loss:

{length_table(ln)}

- With mu = {m['mu']} updates per batch, iteration 1 reads ~0 again but iterations 2..{m['mu']} do not (mean |loss|
  {', '.join(f"{p['mean_abs_loss']:.1e}" for p in later)}), and ratios leave [1 - eps, 1 + eps]: clip fraction
  {', '.join(f"{p['mean_clipfrac']:.3f}" for p in m['per_iteration'])} for iterations 1..{m['mu']}
  (learning rate {m['learning_rate']:g}, {m['steps']} steps).

A loss curve flat at 0 is therefore not a sign that GRPO is broken; watch reward, accuracy and the gradient norm.
"""


def verdict_table(rows: list[tuple[str, str, bool]]) -> list[str]:
    def cell(text: str) -> str:
        return text.replace("|", "\\|")  # "|loss|" would end a markdown cell

    return ["| check | measured | pass |", "|---|---|---|"] + [
        f"| {cell(c)} | {cell(v)} | {'yes' if ok else '**NO**'} |" for c, v, ok in rows]


def report(r: dict, out: Path | str = "results/mu1") -> str:
    rows = verdicts(r)
    table = verdict_table(rows)
    return "\n".join([
        f"# mu = 1 zero-loss check on {r['task']}",
        "",
        f"Generated by `{r['command']}` (fp32, CPU, G = {r['group_size']}). Plot: `mu1.png`.",
        "",
        f"**{sum(ok for *_, ok in rows)}/{len(rows)} checks pass.**",
        "",
        *table,
        "",
        explanation(r, out),
    ])


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t, ln, m = r["training"], r["lengths"], r["multi"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    ax = axes[0]
    steps = [c["step"] for c in t["curve"]]
    ax.plot(steps, [c["loss/iter1"] for c in t["curve"]], "o-", label="loss (mu=1, beta=0)")
    ax.plot(steps, [c["grad_norm/iter1"] for c in t["curve"]], "s-", label="grad norm")
    ax.set_xlabel("step")
    ax.set_title("mu = 1: loss 0, gradient not")
    acc = ax.twinx()
    metric = _metric(t)
    acc.plot([e["step"] for e in t["evals"]], [e[metric] for e in t["evals"]], "g^--", label=f"{metric} (evaluation)")
    acc.set_ylabel(metric)
    acc.set_ylim(0, max(1.0 if metric == "accuracy" else 0.0, *(1.1 * e[metric] for e in t["evals"])))
    ax.legend(handles=ax.get_lines() + acc.get_lines(), loc="center right")

    ax = axes[1]
    labels = [str(row["length"]) for row in ln["rows"]]
    x = range(len(labels))
    ax.bar([i - 0.2 for i in x], [row["bnpo_share"] for row in ln["rows"]], 0.4, label="bnpo/dapo share")
    ax.bar([i + 0.2 for i in x], [row["dr_grpo_share"] for row in ln["rows"]], 0.4, label="dr_grpo share")
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xticks(list(x), labels)
    ax.set_xlabel("completion length |o_i| (tokens)")
    ax.set_title(f"mu = 1 loss by length: bnpo {ln['losses']['bnpo']:.3f}, grpo {ln['losses']['grpo']:.1e}")
    ax.legend()

    ax = axes[2]
    its = [p["iteration"] for p in m["per_iteration"]]
    ax.bar([i - 0.2 for i in its], [p["mean_abs_loss"] for p in m["per_iteration"]], 0.4, label="mean |loss|")
    ax.set_xlabel("iteration within a step")
    ax.set_title(f"mu = {m['mu']}: loss and clip fraction per iteration")
    clip = ax.twinx()
    clip.bar([i + 0.2 for i in its], [p["mean_clipfrac"] for p in m["per_iteration"]], 0.4, color="C3", label="clip fraction")
    clip.set_ylabel("clip fraction")
    ax.legend(handles=[*ax.containers, *clip.containers], labels=["mean |loss|", "clip fraction"])
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def setup_of(settings: Mu1Settings) -> tuple[Setup, dict]:
    """The Setup ``settings`` ask for, and the options given (recorded with the result)."""
    given = {k: getattr(settings, k) for k in ("group_size", "prompts_per_step", "learning_rate", "max_new_tokens",
                                               "eval_questions", "eval_k", "eval_every", "mu_steps", "metric")
             if getattr(settings, k) is not None}
    for name in ("group_size", "prompts_per_step", "max_new_tokens", "eval_questions", "eval_k", "mu_steps"):
        if name in given and given[name] < (2 if name == "group_size" else 1):
            raise UsageError(f"--{name.replace('_', '-')} must be >= {2 if name == 'group_size' else 1}, got {given[name]}")
    if "learning_rate" in given and not given["learning_rate"] > 0:
        raise UsageError(f"--learning-rate must be > 0, got {given['learning_rate']}")
    task_options = {k: given[k] for k in ("eval_questions", "eval_k") if k in given}
    if task_options and settings.task != "gsm8k":
        raise UsageError("--eval-questions and --eval-k are options of task gsm8k")
    shared = {k: given[k] for k in ("group_size", "prompts_per_step", "learning_rate") if k in given}
    setup = Setup(task=settings.task, task_options=task_options, max_new_tokens=given.get("max_new_tokens"),
                  shared=shared, metric=given.get("metric", "accuracy"))
    return setup, given


def out_folder(settings: Mu1Settings) -> Path:
    """--out, else results/mu1 on pizza and results/mu1-TASK on another task."""
    task = settings.task
    return Path(settings.out if settings.out else ("results/mu1" if task == "pizza" else f"results/mu1-{task}"))


def readme_section(settings: Mu1Settings) -> tuple[str, str]:
    """The README page (--readme, else results/checks.md with the default --out and none with another) and the
    section: the plain-words section "mu1" is the pizza run's; another task adds its verdict table as a section of
    its own, "mu1-TASK"."""
    readme = settings.readme if settings.readme is not None else ("" if settings.out else "results/checks.md")
    return readme, "mu1" if settings.task == "pizza" else f"mu1-{settings.task}"


def run_mu1_check(settings: Mu1Settings, command: str, write: Callable[[dict], None]) -> int:
    """The checks, then OUT/results.json, the report (``write``: report.md quoting ``command``, the command line that
    reproduces them, and the README section), mu1.png; 1 when a check fails."""
    if settings.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {settings.steps}")
    setup, given = setup_of(settings)
    torch.manual_seed(settings.seed)
    result = run_all(setup, settings.steps, settings.seed, mu_steps=given.get("mu_steps", 5),
                     eval_every=given.get("eval_every"))
    result["settings"]["given"] = {k: v for k, v in given.items()}
    result["command"] = command
    out = out_folder(settings)
    readme, section = readme_section(settings)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "results.json", result)
    write(result)
    plot(result, out / "mu1.png")
    rows = verdicts(result)
    for check, measured, ok in rows:
        print(f"{'ok  ' if ok else 'FAIL'} {check}: {measured}")
    failed = sum(not ok for *_, ok in rows)
    print(f"{len(rows) - failed}/{len(rows)} checks pass -> {out}"
          + (f", README section {section!r} in {readme}" if readme else ""))
    return 1 if failed else 0


def task_section(r: dict, out: Path) -> str:
    rows = verdicts(r)
    table = verdict_table(rows)
    return "\n".join([
        f"#### The same checks on {r['task']}",
        "",
        f"Generated by `{r['command']}` (fp32, CPU, G = {r['group_size']}; details and plot in `{out}/`). "
        f"**{sum(ok for *_, ok in rows)}/{len(rows)} checks pass.**",
        "",
        *table,
        "",
        f"![mu1 checks on {r['task']}]({out.as_posix()}/mu1.png)",
    ])
