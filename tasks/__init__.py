"""Tasks: prompts, rewards, starting policies and evaluation. Never imports ``algorithms``."""

from tasks.base import GenerationDefaults, RewardError, Task, TaskError
from tasks.gsm8k import GSM8KTask
from tasks.pizza import PizzaTask

TASKS: dict[str, type[Task]] = {"gsm8k": GSM8KTask, "pizza": PizzaTask}


def make_task(name: str, **options) -> Task:
    if name not in TASKS:
        raise TaskError(f"unknown task {name!r}; choose from {', '.join(sorted(TASKS))}")
    return TASKS[name](**options)


__all__ = ["TASKS", "GenerationDefaults", "RewardError", "Task", "TaskError", "make_task"]
