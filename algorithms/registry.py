"""The name guard every registry uses: one name, one thing (the algorithms', losses', estimators', KL penalties' and
the matrix executors'; ``tasks`` keeps its own copy, since it imports nothing from here, and so does the study
registry, benchmarks/study.py, which the light commands' ``--help`` loads without torch).

A second, different object under a taken name is refused with the names of both; the same object again is a
no-op, so a module may be imported twice. An unknown name is a ValueError listing the choices.
"""

from __future__ import annotations

from typing import Any


def register_named(table: dict, kind: str, name: str, obj: Any) -> Any:
    """``table[name] = obj`` (a function or a class), refusing a second, different one under ``name``."""
    if not callable(obj):
        raise TypeError(f"{obj!r} is not callable: a {kind} is a function or a class")
    taken = table.get(name)
    if taken is not None and taken is not obj:
        raise ValueError(f"{kind} name {name!r} is taken by {taken.__module__}.{taken.__qualname__}; "
                         f"{obj.__module__}.{obj.__qualname__} needs another name")
    table[name] = obj
    return obj


def lookup_named(table: dict, kind: str, name: str):
    """``table[name]``, or ValueError listing the choices (as an unknown algorithm is reported)."""
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; choose from {', '.join(sorted(table))}") from None
