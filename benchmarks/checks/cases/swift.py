"""ms-swift 4.6.0's cases: its GRPO trainer's loss types ``real`` (REAL's group ranking loss) and ``fipo`` (the
clipped surrogate weighted by FIPO's future-KL influence), the trainer's own loss code run on our tensors
(benchmarks/references/swift.py), against ours (``grpo_loss`` with loss_type real / fipo)."""

from __future__ import annotations

from algorithms import policy_losses
from benchmarks.checks.cases.tensors import Grid, TensorCases, knobs, loss_pair, missing, ours_loss
from benchmarks.checks.engine import register_cases
from benchmarks.references import swift

EMPTY_ROWS_REAL = ("ms-swift reads a completion's sign from its advantage averaged over its tokens (0 for a completion "
                   "without a token: a negative), and averages the groups' losses; ours reads A_i itself and averages "
                   "the rows' (grpo aggregation), where a row without a token counts 0")
FIPO_SETTINGS = (
    {},  # ms-swift's defaults: decay 32, clip [1, 1.2], safety 4
    dict(fipo_decay_rate=4.0),
    dict(fipo_decay_rate=4.0, fipo_clip_high_only=False, fipo_clip_range=0.1),
    dict(fipo_decay_rate=8.0, fipo_safety_threshold=None, fipo_clip_range=None),
    dict(fipo_decay_rate=4.0, delta=3.0),
)


def _theirs(loss_type: str, **settings):
    return lambda b: swift.loss(loss_type, b.logps, b.old_logps, b.advantages, b.mask, group_size=b.group_size,
                                **settings)


def _real(grid: Grid) -> None:
    """REAL at two temperatures; where a completion has no token, the two read its sign differently (by design)."""
    skip = missing(policy_losses.POLICY_LOSSES, "real", "policy loss")
    for tau in (0.5, 1.0):
        ours = ours_loss("real", real_tau=tau, group_size="G")
        grid.add("policy_loss", "real", "loss_type=real", knobs(real_tau=tau),
                 loss_pair(ours, _theirs("real", real_tau=tau)),
                 lambda case: EMPTY_ROWS_REAL if case == "empty" else None, skip=skip)


def _fipo(grid: Grid) -> None:
    """FIPO under ms-swift's defaults and with each of its knobs moved (decay, clip range, safety, dual-clip's delta);
    the clip range (0.2, 0.28) of the surrogate."""
    skip = missing(policy_losses.POLICY_LOSSES, "fipo", "policy loss")
    for settings in FIPO_SETTINGS:
        for eps_high in (None, 0.28):
            ours = ours_loss("fipo", epsilon=0.2, epsilon_high=eps_high, **settings)
            theirs = _theirs("fipo", epsilon=0.2, epsilon_high=eps_high, **settings)
            grid.add("policy_loss", "fipo", "loss_type=fipo", knobs(epsilon_high=eps_high or 0.2, **settings),
                     loss_pair(ours, theirs), skip=skip)


@register_cases
class SwiftCases(TensorCases):
    name, adapter = swift.FRAMEWORK, swift.Swift

    def add_configs(self, grid: Grid) -> None:
        for part in (_real, _fipo):
            part(grid)
