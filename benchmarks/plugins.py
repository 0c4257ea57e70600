"""Installed packages add algorithms and tasks through entry points, as pytest and verl plug-ins do.

A distribution declares, in its ``pyproject.toml``::

    [project.entry-points."grpo_bench.algorithms"]
    my_algo = "my_package.algo:MyAlgorithm"      # a subclass of algorithms.Algorithm
    [project.entry-points."grpo_bench.tasks"]
    my_task = "my_package.task:MyTask"           # a subclass of tasks.Task

The entry point's name is the registered name. ``load_plugins`` runs once per process, before a
command reads the registries: the command line, a matrix cell's process and the Python API call it.
"""

from __future__ import annotations

from importlib import metadata

from algorithms import register_algorithm
from benchmarks.errors import UsageError
from tasks import register_task

GROUPS = {"grpo_bench.algorithms": register_algorithm, "grpo_bench.tasks": register_task}
_loaded = False


def load_plugins() -> list[str]:
    """Register every installed plug-in; returns 'group:name' of each. A broken plug-in is one UsageError line."""
    global _loaded
    if _loaded:
        return []
    names = []
    for group, register in GROUPS.items():
        for entry in metadata.entry_points(group=group):
            try:
                register(entry.load(), name=entry.name)
            except Exception as exc:  # a plug-in's import may raise anything; name the plug-in, not our stack
                raise UsageError(f"plug-in {entry.name} = {entry.value} ({group}) cannot be registered: "
                                 f"{type(exc).__name__}: {exc}") from None
            names.append(f"{group}:{entry.name}")
    _loaded = True
    return names
