"""ms-swift 4.6.0's cases: its GRPO trainer's loss types ``real`` (REAL's group ranking loss) and ``fipo`` (the
clipped surrogate weighted by FIPO's future-KL influence), and the loss types it shares with TRL (grpo, bnpo,
dr_grpo, dapo, cispo, sapo), the trainer's own loss code run on our tensors (benchmarks/references/swift.py),
against ours (GRPO's loss, ``GRPOConfig.loss()``, of the same loss_type)."""

from __future__ import annotations

from algorithms import policy_losses
from benchmarks.checks.cases.tensors import Grid, TensorCases, knobs, loss_pair, missing, ours_loss
from benchmarks.checks.engine import register_cases
from benchmarks.references import swift

EMPTY_ROWS_REAL = ("ms-swift reads a completion's sign from its advantage averaged over its tokens (0 for a completion "
                   "without a token: a negative), and averages the groups' losses; ours reads A_i itself and averages "
                   "the rows' (grpo aggregation), where a row without a token counts 0")
SAFETY_ZERO = ("fipo_safety_threshold 0: ms-swift caps the influence weight of every negative-advantage token to "
               "[0.8, 1] (every ratio exceeds 0); ours reads 0 as off, as None (fipo_safety_threshold=None agrees, "
               "the rows above)")
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


def _fipo_safety_zero(grid: Grid) -> None:
    """fipo_safety_threshold 0: ms-swift caps the weight of every negative-advantage token (its ratio always exceeds
    0); ours reads 0 as off, as None (a command line cannot say None)."""
    ours = ours_loss("fipo", fipo_decay_rate=4.0, fipo_safety_threshold=0.0)
    theirs = _theirs("fipo", fipo_decay_rate=4.0, fipo_safety_threshold=0.0)
    grid.add("policy_loss", "fipo", "loss_type=fipo", knobs(fipo_decay_rate=4.0, fipo_safety_threshold=0.0),
             loss_pair(ours, theirs), SAFETY_ZERO, skip=missing(policy_losses.POLICY_LOSSES, "fipo", "policy loss"))


# Its other loss types, ours of the same name (CISPO: ms-swift's epsilon_high is the cap itself, as ours).
OTHERS = (("grpo", {}), ("bnpo", {}), ("dr_grpo", dict(max_completion_length="T")), ("dapo", {}),
          ("cispo", dict(epsilon_high=5.0)), ("sapo", {}))


def _others(grid: Grid) -> None:
    """ms-swift's grpo, bnpo, dr_grpo, dapo, cispo and sapo loss types (the feature table's cells), and FIPO under
    our token-mean aggregation (its window normaliser is the batch's tokens here: one process, no accumulation)."""
    for loss_type, options in OTHERS:
        for eps_high in ((None, 0.28) if "epsilon_high" not in options else (options["epsilon_high"],)):
            ours_options = {**options, "epsilon_high": eps_high}
            theirs_options = {k: v for k, v in ours_options.items() if k != "max_completion_length"}
            grid.add("policy_loss", loss_type, f"loss_type={loss_type}", knobs(epsilon_high=eps_high or 0.2),
                     loss_pair(ours_loss(loss_type, **ours_options), _theirs(loss_type, **theirs_options)))
    grid.add("policy_loss", "fipo(loss_aggregation=token-mean)", "loss_type=fipo", knobs(fipo_decay_rate=4.0),
             loss_pair(ours_loss("fipo", fipo_decay_rate=4.0, loss_aggregation="token-mean"),
                       _theirs("fipo", fipo_decay_rate=4.0)),
             skip=missing(policy_losses.POLICY_LOSSES, "fipo", "policy loss"))


@register_cases
class SwiftCases(TensorCases):
    name, adapter = swift.FRAMEWORK, swift.Swift

    def add_configs(self, grid: Grid) -> None:
        for part in (_real, _fipo, _fipo_safety_zero, _others):
            part(grid)
