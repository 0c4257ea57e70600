"""Installed packages add algorithms, tasks, advantage estimators, policy losses, matrix executors and studies
through entry points, as pytest and verl plug-ins do.

A distribution declares, in its ``pyproject.toml``::

    [project.entry-points."grpo_bench.algorithms"]
    my_algo = "my_package.algo:MyAlgorithm"      # a subclass of algorithms.Algorithm
    [project.entry-points."grpo_bench.tasks"]
    my_task = "my_package.task:MyTask"           # a subclass of tasks.Task
    [project.entry-points."grpo_bench.advantage_estimators"]
    my_estimator = "my_package.adv:MyEstimator"     # an algorithms.estimators.AdvantageEstimator, or a plain function
    [project.entry-points."grpo_bench.policy_losses"]
    my_loss = "my_package.loss:MyLoss"              # an algorithms.policy_losses.PolicyLoss, or a per-token function
    [project.entry-points."grpo_bench.executors"]
    my_executor = "my_package.executor:MyExecutor"  # a subclass of benchmarks.matrix.executors.RegisteredExecutor
    [project.entry-points."grpo_bench.studies"]
    my_study = "my_package.study:MyStudy"           # a subclass of benchmarks.study.Study

The entry point's name is the registered name. ``load_plugins`` registers the algorithms, tasks, estimators and
policy losses once per
process, before a command reads the registries: the command line, a matrix cell's process and the Python
API call it. The executors' group is read by ``benchmarks.matrix.executors`` itself when it is first imported,
after its built-in executors: a cell's process never needs an executor, and the executors, which start
cells, sit above it. The studies' group is read by ``benchmarks.study.load_study_plugins``, which the ``check``
and ``bench`` commands call after registering the built-in studies.
"""

from __future__ import annotations

from importlib import metadata

from algorithms import register_algorithm, register_advantage_estimator, register_policy_loss
from benchmarks.errors import UsageError
from tasks import register_task

GROUPS = {"grpo_bench.algorithms": register_algorithm, "grpo_bench.tasks": register_task,
          "grpo_bench.advantage_estimators": register_advantage_estimator, "grpo_bench.policy_losses": register_policy_loss}
_loaded = False


def load_plugins() -> list[str]:
    """Register every installed algorithm and task plug-in; returns 'group:name' of each. A broken plug-in is
    one UsageError line."""
    global _loaded
    if _loaded:
        return []
    names = [name for group, register in GROUPS.items() for name in register_entry_points(group, register)]
    _loaded = True
    return names


def register_entry_points(group: str, register) -> list[str]:
    """``register(cls, name=entry point's name)`` for every installed entry point of ``group``; returns
    'group:name' of each. A broken plug-in is one UsageError line."""
    names = []
    for entry in metadata.entry_points(group=group):
        try:
            register(entry.load(), name=entry.name)
        except Exception as exc:  # a plug-in's import may raise anything; name the plug-in, not our stack
            raise UsageError(f"plug-in {entry.name} = {entry.value} ({group}) cannot be registered: "
                             f"{type(exc).__name__}: {exc}") from None
        names.append(f"{group}:{entry.name}")
    return names
