"""The feature table: this suite against TRL, verl and OpenRLHF, row by row, generated from this suite's registries
(algorithms, advantage estimators, policy losses, loss aggregations, KL estimators) and the adapters' mapping tables
(``ESTIMATORS``, ``POLICY_LOSSES``, ``AGGREGATIONS``, ``KL`` of benchmarks/references/{verl,openrlhf,trl_ppo}.py).

A plug-in registered through ``register_policy_loss`` or ``register_advantage_estimator`` is a row like any other
(no framework has it). Where the reference check ran, each framework's cell says how its rows came out. Importing
this module imports no framework: the mapping tables are plain data.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Optional

import algorithms  # noqa: F401  registers every algorithm
from algorithms import estimators, kl, policy_losses
from algorithms.base import ALGORITHMS, config_fields
from benchmarks.markdown import markdown_table
from benchmarks.references import install, openrlhf, trl, trl_ppo, verl

COLUMNS = ("TRL 1.16 (+ 1.12 PPO)", f"verl {verl.VERSION}", f"OpenRLHF {openrlhf.VERSION}")

# Where each of our algorithms lives elsewhere (our ALGORITHMS names; a plug-in algorithm has no row here: "-").
ALGORITHMS_ELSEWHERE = {
    "grpo": ("GRPOTrainer", "algorithm.adv_estimator=grpo", "advantage_estimator=group_norm"),
    "ppo": (f"PPOTrainer (TRL {trl_ppo.VERSION}; removed after)", "algorithm.adv_estimator=gae + critic",
            "advantage_estimator=gae + critic"),
    "rloo": ("RLOOTrainer", "algorithm.adv_estimator=rloo", "advantage_estimator=rloo"),
    "reinforce_pp": (None, "algorithm.adv_estimator=reinforce_plus_plus(_baseline)",
                     "advantage_estimator=reinforce / reinforce_baseline"),
    "reinforce": (None, None, None),
    "dpo": ("DPOTrainer", None, "DPOTrainer"),
}
# TRL 1.16's names for ours, from our own record of them (policy_losses.GRPO_LOSS_TYPES: the loss types TRL has).
TRL_ESTIMATORS = {"grpo": "GRPOTrainer (scale_rewards)", "rloo": "RLOOTrainer", "gae": f"PPOTrainer ({trl_ppo.VERSION})"}
TRL_KL = {"k3": f"GRPOTrainer beta (k3); PPOTrainer {trl_ppo.VERSION} kl_estimator=k3", "k1": f"RLOOTrainer, PPOTrainer {trl_ppo.VERSION} kl_estimator=k1"}


def _trl_losses() -> dict[str, str]:
    return {name: f"loss_type={name}" for name in policy_losses.GRPO_LOSS_TYPES}


def _trl_aggregations() -> dict[str, str]:
    return {name: f"loss_type={name}" for name in policy_losses.GRPO_LOSS_TYPES if name in policy_losses.LOSS_AGGREGATIONS}


def _our_options() -> dict[str, list[str]]:
    """Config field -> the registered algorithms whose config has it."""
    options: dict[str, list[str]] = defaultdict(list)
    for name, cls in sorted(ALGORITHMS.items()):
        for option in config_fields(cls.Config):
            options[option].append(name)
    return options


def _checked(rows: Iterable, framework: str, groups: tuple[str, ...], function: str) -> str:
    """"N agree, M differ by design, K FAIL" over the check's rows of ``function`` (or of its variants)."""
    counts: dict[str, int] = defaultdict(int)
    for r in rows:
        if r.framework == framework and r.group in groups and (
                function is None or r.function == function or r.function.startswith((function + " ", function + "("))):
            counts[r.status] += 1
    if not counts:
        return ""
    parts = [f"{counts['agrees'] + counts['by design, agrees here']} agree"]
    if counts["differs by design"]:
        parts.append(f"{counts['differs by design']} differ by design")
    if counts["FAILS"]:
        parts.append(f"{counts['FAILS']} FAIL")
    return " (checked: " + ", ".join(parts) + ")"


def _cell(name: Optional[str], rows, framework: Optional[str], groups, function) -> str:
    if name is None:
        return "-"
    return name + (_checked(rows, framework, groups, function) if framework else "")


def _section(title: str, ours: list[str], tables: tuple[dict, dict, dict], theirs_only: tuple[Iterable, Iterable, Iterable],
             rows, groups: tuple[str, ...], ours_cell=lambda n: "yes") -> list[str]:
    frameworks = ("trl-ppo", "verl", "openrlhf")
    body = []
    for name in ours:
        body.append([f"`{name}`", ours_cell(name)] + [
            _cell(table.get(name), rows, fw, groups, name)
            for table, fw in zip(tables, frameworks)])
    for column, extra in enumerate(theirs_only):
        for name in extra:
            cells = ["-", "-", "-"]
            cells[column] = f"`{name}`"
            body.append([f"({name})", "-"] + cells)
    return [f"## {title}", "", markdown_table(["name", "this suite"] + list(COLUMNS), body), ""]


def feature_report(rows: Iterable = ()) -> str:
    """features.md: one table per registry; ``rows`` (the reference check's) add how each comparison came out."""
    rows = list(rows)
    registered_estimators = list(estimators.ADVANTAGE_ESTIMATORS) + ["gae"]
    lines = [
        "# Features: this suite, TRL, verl and OpenRLHF", "",
        "**Generated from this suite's registries (algorithms, advantage estimators, policy losses, loss aggregations, "
        "KL estimators) and the reference adapters' mapping tables; a plug-in registered with "
        "`register_policy_loss` / `register_advantage_estimator` shows up as a row.**", "",
        "A framework's cell names its counterpart; \"checked\" counts the rows of `grpo-bench check references` "
        "(results/references/references.md) that compared the two. Rows in parentheses exist only in that framework. "
        f"The TRL column is TRL 1.16 (GRPO, RLOO, DPO; checked by `grpo-bench check trl`) and, for PPO, TRL "
        f"{trl_ppo.VERSION}, the last TRL with a PPOTrainer.", "",
    ]
    lines += ["## Algorithms", "", markdown_table(
        ["algorithm", "this suite"] + list(COLUMNS),
        [[f"`{name}`", cls.__module__] + [cell or "-" for cell in ALGORITHMS_ELSEWHERE.get(name, (None, None, None))]
         for name, cls in sorted(ALGORITHMS.items())]), ""]
    lines += _section(
        "Advantage estimators", registered_estimators,
        (TRL_ESTIMATORS, verl.ESTIMATORS, {k: v for k, v in openrlhf.ESTIMATORS.items() if "(" not in k}),
        ((), verl.ESTIMATORS_THEIRS_ONLY, openrlhf.ESTIMATORS_THEIRS_ONLY), rows, ("estimator", "gae"),
        lambda n: "yes" if n != "gae" else "`losses.gae` (PPO)")
    lines += _section(
        "Policy losses (loss_type)", list(policy_losses.POLICY_LOSSES),
        (_trl_losses(), {k: f"{mode} + {agg or 'its own mean'}" for k, (mode, agg) in verl.POLICY_LOSSES.items()},
         {k: f"PolicyLoss({mode}, {agg}-level)" for k, (mode, agg) in openrlhf.POLICY_LOSSES.items()}),
        ((), verl.POLICY_LOSSES_THEIRS_ONLY, ()), rows, ("policy_loss", "actor_loss"),
        lambda n: f"objective `{policy_losses.objective_family(n)}`, aggregation `{policy_losses.POLICY_LOSSES[n].aggregation}`")
    lines += ["Sequence-level importance ratio (`--level sequence`, GSPO): TRL importance_sampling_level=sequence, "
              f"verl loss_mode={verl.SEQUENCE_LEVEL_LOSS}, OpenRLHF policy_loss_type={openrlhf.SEQUENCE_LEVEL_LOSS}.", ""]
    lines += _section(
        "Loss aggregations (loss_aggregation)", list(policy_losses.LOSS_AGGREGATIONS),
        (_trl_aggregations(), verl.AGGREGATIONS, openrlhf.AGGREGATIONS),
        ((), verl.AGGREGATIONS_THEIRS_ONLY, ()), rows, ("aggregation",))
    lines += _section(
        "KL estimators (kl_loss_type)", list(kl.KL_PENALTIES),
        (TRL_KL, verl.KL, openrlhf.KL), ((), (), ()), rows, ("kl",))
    ppo_pieces = ["gae", "masked_whiten", "value_loss", "policy_loss", "kl_in_reward"]
    ours_ppo = {"gae": "`losses.gae`", "masked_whiten": "`losses.masked_whiten` (unbiased var)",
                "value_loss": "`losses.ppo_value_loss`", "policy_loss": "`losses.ppo_policy_loss`",
                "kl_in_reward": "`losses.kl_penalised_rewards` (k1 in PPO)"}
    trl_ppo_pieces = {"gae": "train() step 6", "masked_whiten": "masked_whiten", "value_loss": "train() vf_loss",
                      "policy_loss": "train() pg_loss", "kl_in_reward": "train() step 4 (k1 / k3)"}
    openrlhf_pieces = {"gae": "get_advantages_and_returns", "masked_whiten": "batch whitening (biased var)",
                       "value_loss": "ValueLoss", "policy_loss": "PolicyLoss(ppo)", "kl_in_reward": "compute_reward"}
    group_of = {"gae": "gae", "masked_whiten": "whitening", "value_loss": "value_loss", "policy_loss": "ppo_policy_loss",
                "kl_in_reward": "kl_in_reward"}
    body = []
    for piece in ppo_pieces:
        function = {"value_loss": "ppo_value_loss", "policy_loss": "ppo_policy_loss",
                    "kl_in_reward": None}.get(piece, piece)
        body.append([piece, ours_ppo[piece]] + [
            _cell(table.get(piece), rows, fw, ("kl",) if (fw, piece) == ("trl-ppo", "kl_in_reward") else
                  (group_of[piece],), function) for table, fw in
            ((trl_ppo_pieces, "trl-ppo"), (verl.PPO, "verl"), (openrlhf_pieces, "openrlhf"))])
    lines += ["## PPO's pieces", "", markdown_table(["piece", "this suite"] + list(COLUMNS), body), ""]
    options = _our_options()
    lines += ["## Options", "", "The algorithms' config fields that have a counterpart elsewhere (\"this suite\": the "
              "algorithms whose config has the field).", "", markdown_table(
        ["option", "this suite", f"TRL {trl_ppo.VERSION} (PPO)", f"verl {verl.VERSION}", f"OpenRLHF {openrlhf.VERSION}"],
        [[f"`{k}`", ", ".join(options.get(k, ())) or "-", trl_ppo.KNOBS.get(k, "-"), verl.KNOBS.get(k, "-"),
          openrlhf.KNOBS.get(k, "-")]
         for k in sorted(set(verl.KNOBS) | set(openrlhf.KNOBS) | set(trl_ppo.KNOBS))]), ""]
    lines += ["Versions: " + ", ".join(p.label for p in install.PINNED.values()) + "."]
    return "\n".join(lines) + "\n"


def feature_summary(rows: Iterable = ()) -> str:
    """The README's feature table: per registry, how many entries this suite has, and for each framework how many
    of ours it has a counterpart for (and how many it has that we lack), with the check's agreement counts; the
    algorithms row by row. features.md holds every row."""
    rows = list(rows)
    checked = defaultdict(lambda: defaultdict(int))
    for r in rows:
        checked[r.framework][r.status] += 1
    registries = (
        ("advantage estimators", list(estimators.ADVANTAGE_ESTIMATORS) + ["gae"],
         ({**trl.ESTIMATORS, **trl_ppo.ESTIMATORS}, verl.ESTIMATORS, openrlhf.ESTIMATORS),
         ((), verl.ESTIMATORS_THEIRS_ONLY, openrlhf.ESTIMATORS_THEIRS_ONLY)),
        ("policy losses", list(policy_losses.POLICY_LOSSES), ({**trl.POLICY_LOSSES, **trl_ppo.POLICY_LOSSES}, verl.POLICY_LOSSES,
                                                    openrlhf.POLICY_LOSSES), ((), verl.POLICY_LOSSES_THEIRS_ONLY, ())),
        ("loss aggregations", list(policy_losses.LOSS_AGGREGATIONS), ({**trl.AGGREGATIONS, **trl_ppo.AGGREGATIONS},
                                                              verl.AGGREGATIONS, openrlhf.AGGREGATIONS),
         ((), verl.AGGREGATIONS_THEIRS_ONLY, ())),
        ("KL estimators", list(kl.KL_PENALTIES), ({**trl.KL, **trl_ppo.KL}, verl.KL, openrlhf.KL), ((), (), ())),
    )
    body = []
    for title, ours, tables, theirs_only in registries:
        body.append([title, str(len(ours))] + [
            f"{sum(name in table for name in ours)}" + (f" (+{len(extra)} of its own)" if extra else "")
            for table, extra in zip(tables, theirs_only)])
    counts = [", ".join(f"{n} {status}" for status, n in sorted(checked[fw].items())) or "not run"
              for fw in ("trl-ppo", "verl", "openrlhf")]
    body.append(["`grpo-bench check references` rows", "-"] + counts)
    algorithm_table = markdown_table(
        ["algorithm", "this suite"] + list(COLUMNS),
        [[f"`{name}`", cls.__module__] + [cell or "-" for cell in ALGORITHMS_ELSEWHERE.get(name, (None, None, None))]
         for name, cls in sorted(ALGORITHMS.items())])
    return "\n".join([
        "Counterparts of this suite's registered entries in each framework (generated from the registries and the "
        "adapters' mapping tables; every row of every table is in [references/features.md]"
        "(references/features.md)); the TRL column counts TRL 1.16 and, for PPO, TRL 1.12.", "",
        markdown_table(["registry", "this suite"] + list(COLUMNS), body), "", algorithm_table])
