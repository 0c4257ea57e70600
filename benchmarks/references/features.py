"""The feature table: this suite against every registered reference framework, row by row, generated from this
suite's registries (algorithms, advantage estimators, policy losses, loss aggregations, KL estimators) and the
registered adapters (``adapters.ADAPTERS``: one column per adapter column, their tables the cells).

A plug-in registered through ``register_policy_loss`` or ``register_advantage_estimator`` is a row like any other
(no framework has it); an adapter registered with ``register_adapter`` is a column. Where the reference check ran,
each framework's cell says how its rows came out. Importing this module imports no framework: the tables are data.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Optional

import algorithms  # noqa: F401  registers every algorithm
from algorithms import estimators, kl, policy_losses
from algorithms.base import ALGORITHMS, config_fields
from benchmarks.markdown import markdown_table
from benchmarks.references import install
from benchmarks.references.adapters import ADAPTERS, Adapter, columns, heading

# PPO's pieces: ours, and the reference check's group and function of each.
PPO_PIECES = {"gae": "`losses.gae`", "masked_whiten": "`losses.masked_whiten` (unbiased var)",
              "value_loss": "`losses.ppo_value_loss`", "policy_loss": "`losses.ppo_policy_loss`",
              "kl_in_reward": "`losses.kl_penalised_rewards` (k1 in PPO)"}
PPO_GROUPS = {"gae": "gae", "masked_whiten": "whitening", "value_loss": "value_loss", "policy_loss": "ppo_policy_loss",
              "kl_in_reward": "kl_in_reward"}
PPO_FUNCTIONS = {"value_loss": "ppo_value_loss", "policy_loss": "ppo_policy_loss", "kl_in_reward": None}


def sampler_corrections() -> dict:
    """This suite's registry of sampler/trainer corrections (GRPO's importance_sampling_mode), {} before it exists
    (the feature table then has no such section, the reference check skips those rows)."""
    try:
        from algorithms.sampler_corrections import SAMPLER_CORRECTIONS
    except ImportError:
        return {}
    return SAMPLER_CORRECTIONS


def _our_options() -> dict[str, list[str]]:
    """Config field -> the registered algorithms whose config has it."""
    options: dict[str, list[str]] = defaultdict(list)
    for name, cls in sorted(ALGORITHMS.items()):
        for option in config_fields(cls.Config):
            options[option].append(name)
    return options


def _checked(rows: list, where: list[tuple[str, tuple[str, ...]]], function: Optional[str]) -> str:
    """"N agree, M differ by design, K FAIL" over the check's rows of ``function`` (or of its variants) whose
    (framework, group) is in ``where``."""
    counts: dict[str, int] = defaultdict(int)
    for r in rows:
        if any(r.framework == fw and r.group in groups for fw, groups in where) and (
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


def _first(adapters: list[type[Adapter]], table: str, name: str) -> Optional[str]:
    """The column's cell text: the first of its adapters that names a counterpart."""
    return next((a.table(table)[name] for a in adapters if name in a.table(table)), None)


def _cell(rows: list, adapters: list[type[Adapter]], table: str, name: str, groups: tuple[str, ...],
          function: Optional[str]) -> str:
    text = _first(adapters, table, name)
    if text is None:
        return "-"
    where = [(a.name, a.check_groups.get(name, groups)) for a in adapters]
    return text + _checked(rows, where, function)


def _headings() -> list[str]:
    return [heading(adapters) for adapters in columns().values()]


def _section(title: str, table: str, ours: list[str], rows: list, groups: tuple[str, ...],
             ours_cell=lambda n: "yes") -> list[str]:
    grouped = list(columns().values())
    body = [[f"`{name}`", ours_cell(name)] + [_cell(rows, adapters, table, name, groups, name) for adapters in grouped]
            for name in ours]
    for column, adapters in enumerate(grouped):
        for name in dict.fromkeys(n for a in adapters for n in a.theirs_only.get(table, ())):
            cells = ["-"] * len(grouped)
            cells[column] = f"`{name}`"
            body.append([f"({name})", "-"] + cells)
    return [f"## {title}", "", markdown_table(["name", "this suite"] + _headings(), body), ""]


def _algorithms_table() -> str:
    grouped = list(columns().values())
    return markdown_table(
        ["algorithm", "this suite"] + _headings(),
        [[f"`{name}`", cls.__module__] + [_first(adapters, "algorithms", name) or "-" for adapters in grouped]
         for name, cls in sorted(ALGORITHMS.items())])


def _ppo_section(rows: list) -> list[str]:
    body = [[piece, ours] + [_cell(rows, adapters, "ppo", piece, (PPO_GROUPS[piece],), PPO_FUNCTIONS.get(piece, piece))
                             for adapters in columns().values()]
            for piece, ours in PPO_PIECES.items()]
    return ["## PPO's pieces", "", markdown_table(["piece", "this suite"] + _headings(), body), ""]


def _options_section() -> list[str]:
    adapters = [a for a in ADAPTERS.values() if a.options]
    options = _our_options()
    names = sorted({name for a in adapters for name in a.options})
    return ["## Options", "", "The algorithms' config fields that have a counterpart elsewhere (\"this suite\": the "
            "algorithms whose config has the field).", "", markdown_table(
                ["option", "this suite"] + [a.options_heading or a.heading for a in adapters],
                [[f"`{k}`", ", ".join(options.get(k, ())) or "-"] + [a.options.get(k, "-") for a in adapters]
                 for k in names]), ""]


def _sequence_level() -> str:
    spelled = [(column, next((a.sequence_level for a in adapters if a.sequence_level), None))
               for column, adapters in columns().items()]
    return ("Sequence-level importance ratio (`--level sequence`, GSPO): "
            + ", ".join(f"{column} {how}" for column, how in spelled if how) + ".")


def _frameworks_named() -> str:
    names = list(columns())
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


def feature_report(rows: Iterable = ()) -> str:
    """features.md: one table per registry; ``rows`` (the reference check's) add how each comparison came out."""
    rows = list(rows)
    notes = "".join(f" {a.note}" for a in ADAPTERS.values() if a.note)
    lines = [
        f"# Features: this suite, {_frameworks_named()}", "",
        "**Generated from this suite's registries (algorithms, advantage estimators, policy losses, loss aggregations, "
        "KL estimators, sampler corrections) and the reference adapters' mapping tables; a plug-in registered with "
        "`register_policy_loss` / `register_advantage_estimator` shows up as a row.**", "",
        "A framework's cell names its counterpart; \"checked\" counts the rows of `grpo-bench check references` "
        "(results/references/references.md) that compared the two. Rows in parentheses exist only in that framework."
        + notes, "",
        "## Algorithms", "", _algorithms_table(), "",
    ]
    lines += _section("Advantage estimators", "estimators", list(estimators.ADVANTAGE_ESTIMATORS) + ["gae"], rows,
                      ("estimator", "gae"), lambda n: "yes" if n != "gae" else "`losses.gae` (PPO)")
    lines += _section(
        "Policy losses (loss_type)", "policy_losses", list(policy_losses.POLICY_LOSSES), rows,
        ("policy_loss", "actor_loss"),
        lambda n: f"objective `{policy_losses.objective_family(n)}`, aggregation `{policy_losses.POLICY_LOSSES[n].aggregation}`")
    lines += [_sequence_level(), ""]
    lines += _section("Loss aggregations (loss_aggregation)", "aggregations", list(policy_losses.LOSS_AGGREGATIONS),
                      rows, ("aggregation",))
    lines += _section("KL estimators (kl_loss_type)", "kl", list(kl.KL_PENALTIES), rows, ("kl",))
    if sampler_corrections():
        lines += _section("Sampler corrections (importance_sampling_mode, with the sampler's log-probs)",
                          "corrections", list(sampler_corrections()), rows, ("sampler_correction",))
    lines += _ppo_section(rows) + _options_section()
    lines += ["Versions: " + ", ".join(p.label for p in install.PINNED.values()) + "."]
    return "\n".join(lines) + "\n"


def _registry_row(title: str, table: str, ours: list[str]) -> list[str]:
    """A registry's line of the summary: how many of ours each column has (and how many of its own)."""
    cells = []
    for adapters in columns().values():
        has = {name for a in adapters for name in a.has.get(table, {})}
        extra = {name for a in adapters for name in a.theirs_only.get(table, ())}
        cells.append(f"{sum(name in has for name in ours)}" + (f" (+{len(extra)} of its own)" if extra else ""))
    return [title, str(len(ours))] + cells


def _check_rows_line(rows: list) -> list[str]:
    cells = []
    for adapters in columns().values():
        counts: dict[str, int] = defaultdict(int)
        for r in rows:
            if r.framework in {a.name for a in adapters}:
                counts[r.status] += 1
        cells.append(", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "not run")
    return ["`grpo-bench check references` rows", "-"] + cells


def feature_summary(rows: Iterable = ()) -> str:
    """The README's feature table: per registry, how many entries this suite has, and for each framework how many
    of ours it has a counterpart for (and how many it has that we lack), with the check's agreement counts; the
    algorithms row by row. features.md holds every row."""
    rows = list(rows)
    body = [
        _registry_row("advantage estimators", "estimators", list(estimators.ADVANTAGE_ESTIMATORS) + ["gae"]),
        _registry_row("policy losses", "policy_losses", list(policy_losses.POLICY_LOSSES)),
        _registry_row("loss aggregations", "aggregations", list(policy_losses.LOSS_AGGREGATIONS)),
        _registry_row("KL estimators", "kl", list(kl.KL_PENALTIES)),
        *([_registry_row("sampler corrections", "corrections", list(sampler_corrections()))]
          if sampler_corrections() else []),
        _check_rows_line(rows),
    ]
    notes = "".join(f"; {a.summary_note}" for a in ADAPTERS.values() if a.summary_note)
    return "\n".join([
        "Counterparts of this suite's registered entries in each framework (generated from the registries and the "
        "adapters' mapping tables; every row of every table is in [references/features.md]"
        f"(references/features.md)){notes}.", "",
        markdown_table(["registry", "this suite"] + _headings(), body), "", _algorithms_table()])
