"""What the float64 reference checks share (verl, OpenRLHF, TRL 1.12's PPO, SkyRL, ms-swift): the batches -- one
random shape and the edge cases -- the helpers that turn our function and the framework's into a ``Comparison``,
the grid that expands a comparison over the chosen cases, and the case modules' common base.

A batch is random, or an edge case (all-masked rows, tied rewards, one-token completions, long completions, ratios
far outside the clip range). For a loss the check records the largest absolute difference of the value and of the
gradient with respect to the log-probs (the values, for a value loss); for an advantage estimator, of the
advantages on active tokens. A row agrees when both stay within ``TOL`` times max(1, the reference's largest
magnitude).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

import torch

from algorithms import kl, losses
from algorithms.grpo import GRPOConfig
from benchmarks.checks.engine import CaseModule, Comparison, Config, Fixture, Tolerance
from benchmarks.checks.cases.plants import PLANTS
from benchmarks.references import install
from benchmarks.references.features import sampler_corrections

TOL = 1e-5
TOLERANCE = Tolerance(TOL, scaled=True)
DTYPE = torch.float64
HUGE_C = 1e12  # a dual-clip floor that never binds: verl's "vanilla" loss is PPO's clip with it

# case -> (B, T, G, spread of the log-ratios)
CASES = {
    "random": (8, 12, 4, 0.3),
    "empty": (8, 12, 4, 0.3),  # rows 1 and 6 have no active token
    "tied": (8, 12, 4, 0.3),  # every group's rewards tie but the last one's
    "one_token": (8, 6, 4, 0.3),  # every completion is one token
    "long": (4, 384, 2, 0.3),
    "far": (8, 12, 4, 3.0),  # ratios far outside any clip range; KL clamps bind
}
SEEDS = {"random": (0, 1)}  # other cases: seed 0


@dataclass(frozen=True)
class Batch:
    case: str
    seed: int
    group_size: int
    mask: torch.Tensor  # (B, T) the mask convention, float64
    logps: torch.Tensor  # (B, T) current policy
    old_logps: torch.Tensor  # (B, T) sampling policy
    ref_logps: torch.Tensor  # (B, T) reference
    advantages: torch.Tensor  # (B,) random signs and sizes, 0 for a tied group
    rewards: torch.Tensor  # (B,) in {0, 0.5, 1}, group by group
    baseline_rewards: torch.Tensor  # (B,) a greedy completion's reward (ReMax)
    values: torch.Tensor  # (B, T) critic's current values
    old_values: torch.Tensor  # (B, T)
    returns: torch.Tensor  # (B, T)
    entropies: torch.Tensor  # (B, T)
    sum_pi_squared: torch.Tensor  # (B, T) >= pi_old(o_t)^2
    sampling_logps: torch.Tensor  # (B, T) the sampler's view of old_logps: a tenth of the case's spread off it

    @property
    def lengths(self) -> torch.Tensor:
        return self.mask.sum(-1).long()

    @property
    def width(self) -> int:
        return self.mask.size(1)


def _lengths(case: str, B: int, T: int, g: torch.Generator) -> torch.Tensor:
    """(B,) completion lengths: random, one filling the width (TRL then puts its score on the last token), and the
    case's edge."""
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    if case == "empty":
        lengths[[1, 6]] = 0
    if case == "one_token":
        lengths[:] = 1
    if case == "long":
        lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
        lengths[0] = T
    return lengths


def _tie_all_groups_but_the_last(rewards: torch.Tensor, advantages: torch.Tensor, G: int) -> None:
    grouped = rewards.view(-1, G)
    grouped[:-1] = torch.tensor([0.0, 1.0, 0.5])[torch.arange(grouped.size(0) - 1) % 3].to(DTYPE).unsqueeze(1)
    advantages.view(-1, G)[:-1] = 0.0


def make_batch(case: str, seed: int) -> Batch:
    B, T, G, spread = CASES[case]
    g = torch.Generator().manual_seed(1000 * seed + list(CASES).index(case))

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=DTYPE)

    def rand(*shape):
        return torch.rand(*shape, generator=g, dtype=DTYPE)

    mask = (torch.arange(T).unsqueeze(0) < _lengths(case, B, T, g).unsqueeze(1)).to(DTYPE)
    logps = -(rand(B, T) * 2 + 0.05)
    rewards = torch.randint(0, 3, (B,), generator=g).to(DTYPE) / 2
    rewards.view(-1, G)[:, 0], rewards.view(-1, G)[:, 1] = 0.0, 1.0  # every group varies ...
    advantages = randn(B)
    if case == "tied":  # ... but in "tied", where all groups tie except the last
        _tie_all_groups_but_the_last(rewards, advantages, G)
    p_old = torch.exp(logps)
    old_logps = logps + spread * randn(B, T)
    ref_logps = logps + spread * randn(B, T)
    return Batch(
        case=case, seed=seed, group_size=G, mask=mask, logps=logps, old_logps=old_logps,
        ref_logps=ref_logps, advantages=advantages, rewards=rewards,
        baseline_rewards=torch.randint(0, 3, (B,), generator=g).to(DTYPE) / 2, values=randn(B, T) * mask,
        old_values=(randn(B, T) * mask), returns=randn(B, T) * mask, entropies=rand(B, T) * 2,
        sum_pi_squared=p_old.square() + rand(B, T) * (1 - p_old).square(),
        sampling_logps=old_logps + spread / 10 * randn(B, T))  # drawn last: the fields above keep their values


# --------------------------------------------------------------------------------------------
# Two functions into a Comparison
# --------------------------------------------------------------------------------------------


def _leaf(x: torch.Tensor) -> torch.Tensor:
    return x.detach().clone().requires_grad_(True)


def loss_pair(ours: Callable, theirs: Callable, wrt: str = "logps") -> Callable[[Batch], Comparison]:
    """Each side gets the batch with ``wrt`` a fresh leaf and returns a scalar (or a per-token tensor, compared on
    active tokens, its gradient that of the masked sum); the gradients are taken with respect to ``wrt``."""

    def side(fn, batch):
        x = _leaf(getattr(batch, wrt))
        out = fn(dataclasses.replace(batch, **{wrt: x}))
        if out.dim() > 0:
            out = out * batch.mask
        (grad,) = torch.autograd.grad(out.sum(), x, allow_unused=True)
        return out.detach().to(DTYPE), torch.zeros_like(x) if grad is None else grad.to(DTYPE)

    def compare(batch: Batch) -> Comparison:
        o, go = side(ours, batch)
        t, gt = side(theirs, batch)
        return Comparison(o, t, go, gt)

    return compare


def value_pair(ours: Callable, theirs: Callable) -> Callable[[Batch], Comparison]:
    """Advantages (and the like): (B,) per completion or (B, T) per token, compared on active tokens."""

    def tokens(x: torch.Tensor, batch: Batch) -> torch.Tensor:
        x = x.detach().to(DTYPE)
        return (x.unsqueeze(-1) if x.dim() == 1 else x) * batch.mask

    def compare(batch: Batch) -> Comparison:
        with torch.no_grad():
            return Comparison(tokens(ours(batch), batch), tokens(theirs(batch), batch))

    return compare


def knobs(**values) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items()) or "-"


def ours_loss(loss_type: str, *, with_entropies: bool = False, with_sampling: bool = False,
              max_completion_length: Optional[int | str] = None, **settings) -> Callable[[Batch], torch.Tensor]:
    """Our GRPO loss (``GRPOConfig.loss()``) of ``loss_type`` on a batch; ``settings`` GRPO's (beta 0 unless given),
    ``group_size="G"`` the batch's; ``with_entropies`` and ``with_sampling`` pass the batch's entropies and its
    sampler's log-probs, ``max_completion_length="T"`` the batch's width."""

    def call(b: Batch) -> torch.Tensor:
        config = GRPOConfig(**{"beta": 0.0, **settings, "loss_type": loss_type,
                               **({"group_size": b.group_size} if settings.get("group_size") == "G" else {})})
        # built per row, as it runs: a crash (a setting no member takes) is that row's failure, not the grid's
        loss = config.loss(b.width if max_completion_length == "T" else max_completion_length)
        return loss(b.logps, b.old_logps, b.ref_logps if config.beta else None, b.advantages, b.mask,
                    entropies=b.entropies if with_entropies else None,
                    sampling_logps=b.sampling_logps if with_sampling else None)

    return call


def ours_correction(name: str, clip_min: Optional[float] = None, clip_max: Optional[float] = None,
                    **options) -> Callable[[Batch], torch.Tensor]:
    """Our registered correction ``name``'s weight, (B, T) or (B, 1), on a batch: pi_old its old_logps, the
    sampler its sampling_logps."""

    def call(b: Batch) -> torch.Tensor:
        correction = sampler_corrections()[name].with_options(options)
        return correction.weights(b.old_logps, b.sampling_logps, b.mask, clip_min, clip_max)

    return call


def token_rewards(b: Batch) -> torch.Tensor:
    """PPO's token rewards: -0.05 k1 on every active token, the reward on the last one (algorithms/ppo.py)."""
    return losses.kl_penalised_rewards(b.rewards, kl.kl_k1(b.old_logps, b.ref_logps), b.mask, 0.05)


def token_adv(b: Batch) -> torch.Tensor:
    """Per-token advantages for PPO's loss: the batch's advantages varied along the completion."""
    return (b.advantages.unsqueeze(-1) + 0.5 * torch.sin(torch.arange(b.width, dtype=DTYPE))) * b.mask


# --------------------------------------------------------------------------------------------
# The grid and the case modules' base
# --------------------------------------------------------------------------------------------


def case_seeds(cases: Iterable[str]) -> list[tuple[str, int]]:
    return [(case, seed) for case in cases for seed in SEEDS.get(case, (0,))]


class Grid:
    """One framework's configurations: ``add`` expands one comparison over every chosen case and its seeds."""

    def __init__(self, framework: str, cases: Iterable[str]):
        self.framework, self.cases, self.configs = framework, list(cases), []

    def add(self, group: str, function: str, theirs: str, knobs: str, compare: Callable[[Batch], Comparison],
            by_design: Optional[str | Callable[[str], Optional[str]]] = None, skip: Optional[str] = None) -> None:
        """``by_design``: the reason it differs, or a function of the case giving it (None where it must agree);
        ``skip``: the reason it is not compared (a member this suite does not have)."""
        for case, seed in case_seeds(self.cases):
            reason = by_design(case) if callable(by_design) else by_design
            self.configs.append(Config(self.framework, group, function, theirs, knobs, case, seed, compare,
                                       TOLERANCE, Fixture(make_batch, (case, seed)), by_design=reason, skip=skip))


def add_gae(grid: Grid, theirs_gae: Callable, settings: Iterable[tuple[float, float]]) -> None:
    """PPO's GAE on ``token_rewards`` against ``theirs_gae(rewards, values, mask, gamma, lam)`` (its
    ``compute_gae_advantage_return``) at each (gamma, lam): the advantages, whitened by ``masked_whiten``, and the
    returns."""
    for gamma, lam in settings:
        def ours(b, g=gamma, lam_=lam):
            return losses.gae(token_rewards(b), b.old_values, b.mask, g, lam_)

        def theirs(b, g=gamma, lam_=lam):
            return theirs_gae(token_rewards(b), b.old_values, b.mask, g, lam_)

        names = ("compute_gae_advantage_return", knobs(gamma=gamma, lam=lam))
        grid.add("gae", "gae + masked_whiten", *names,
                 value_pair(lambda b, o=ours: losses.masked_whiten(o(b)[0], b.mask), lambda b, t=theirs: t(b)[0]))
        grid.add("gae", "gae (returns)", *names, value_pair(lambda b, o=ours: o(b)[1], lambda b, t=theirs: t(b)[1]))


def missing(registry: dict, name: str, what: str) -> Optional[str]:
    """A configuration's skip reason where this suite has no ``name`` in ``registry`` (None where it has)."""
    return None if name in registry else f"this suite has no {what} {name!r}"



class TensorCases(CaseModule):
    """A framework compared on float64 batches by ``grpo-bench check references``, fetched by ``install``."""

    check = "references"
    plants = PLANTS

    def configs(self, cases: Sequence[str]) -> list[Config]:
        grid = Grid(self.name, cases)
        self.add_configs(grid)
        return grid.configs

    def add_configs(self, grid: Grid) -> None:
        raise NotImplementedError

    def prepare(self, fetch: bool, log=print) -> None:
        if fetch:
            install.install([self.name], log=log)
        install.require(self.name)
