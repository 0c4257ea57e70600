"""The registry of reference frameworks: each adapter module (trl, trl_ppo, verl, openrlhf) registers one ``Adapter``
with ``@register_adapter``, and the feature table (``features``) has one column per registered ``column``, in the
order the adapters registered. A second, different adapter under a taken name is refused.

An adapter's tables map our names (the algorithms, estimators, policy losses, aggregations, KL estimators, sampler
corrections and PPO pieces of this suite) to the framework's: ``has`` is what it implements, per registry (the README's summary counts
it); ``cells`` is the feature table's text per table, where that differs from ``has``. Adapters that share a column
(TRL 1.16 and TRL 1.12's PPO) fill it together: the heading joins theirs, a cell is the first one's that has the
name, and the "checked" counts are over the rows of all of them.

Nothing here imports a framework: the tables are plain data.
"""

from __future__ import annotations

from typing import Mapping, Optional

from algorithms.registry import register_named

# The feature table's tables, in its order; "algorithms" and "ppo" have cells only; "corrections" are the sampler
# corrections (GRPO's importance_sampling_mode).
TABLES = ("algorithms", "estimators", "policy_losses", "aggregations", "kl", "corrections", "ppo")


class Adapter:
    """One reference framework as the feature table and the checks name it (class attributes, no instances)."""

    name: str  # the checks' name for it (a row's framework; install.PINNED's key where it is fetched)
    column: str  # the feature table's column it fills (a framework: "TRL", "verl", "OpenRLHF")
    heading: str  # its part of that column's heading: "verl 0.9.1"; a second adapter's goes in "(+ ...)"
    has: Mapping[str, Mapping] = {}  # table -> our name -> its counterpart: what it implements
    theirs_only: Mapping[str, tuple] = {}  # table -> its entries that have no counterpart here
    cells: Mapping[str, Mapping[str, str]] = {}  # table -> our name -> the feature table's text (else from ``has``)
    check_groups: Mapping[str, tuple] = {}  # a PPO piece -> the check's groups whose rows count for it, if not its own
    options: Mapping[str, str] = {}  # our option -> its config field (the feature table's options)
    options_heading: Optional[str] = None  # the options table's heading for it (default: ``heading``)
    sequence_level: Optional[str] = None  # how it asks for GSPO's sequence-level ratio
    note: str = ""  # a sentence on its column (features.md)
    summary_note: str = ""  # a clause on its column (the README's summary)

    @classmethod
    def table(cls, name: str) -> Mapping[str, str]:
        """The feature table's cells of table ``name``: ``cells[name]``, else ``has[name]``."""
        if name in cls.cells:
            return cls.cells[name]
        return {ours: str(theirs) for ours, theirs in cls.has.get(name, {}).items()}


# Filled by ``register_adapter`` as the adapter modules are imported (benchmarks/references/__init__.py imports them
# in the columns' order); keyed by ``Adapter.name``.
ADAPTERS: dict[str, type[Adapter]] = {}


def register_adapter(cls: type[Adapter]) -> type[Adapter]:
    """Class decorator: ``ADAPTERS[cls.name] = cls``; a second, different class under a taken name is refused."""
    if not (isinstance(cls, type) and issubclass(cls, Adapter)):
        raise TypeError(f"{cls!r} is not a subclass of benchmarks.references.adapters.Adapter")
    return register_named(ADAPTERS, "reference adapter", cls.name, cls)


def columns() -> dict[str, list[type[Adapter]]]:
    """The feature table's columns: column -> its adapters, in the order they registered."""
    grouped: dict[str, list[type[Adapter]]] = {}
    for adapter in ADAPTERS.values():
        grouped.setdefault(adapter.column, []).append(adapter)
    return grouped


def heading(adapters: list[type[Adapter]]) -> str:
    """A column's heading: the first adapter's, then each other's in parentheses ("TRL 1.16 (+ 1.12 PPO)")."""
    first, *others = adapters
    return first.heading + "".join(f" (+ {a.heading})" for a in others)
