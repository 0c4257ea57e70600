"""Tasks: prompts, rewards, starting policies and evaluation. Never imports ``algorithms``.

Each task registers itself by name with ``@register_task`` where it is defined and declares its own
options (its constructor's keyword arguments, with help in ``option_help``); importing this package
registers the built-in ones.
"""

from tasks.base import TASKS, GenerationDefaults, RewardError, Task, TaskError, TaskOption, make_task, register_task
from tasks.addition import AdditionTask
from tasks.bandit import BanditTask
from tasks.custom import PromptsTask
from tasks.gsm8k import GSM8KTask
from tasks.pizza import PizzaTask
from tasks.reasoning_gym import ReasoningGymTask

__all__ = [
    "TASKS", "AdditionTask", "BanditTask", "GSM8KTask", "GenerationDefaults", "PizzaTask", "RewardError", "Task", "TaskError",
    "TaskOption", "ReasoningGymTask", "PromptsTask", "make_task", "register_task",
]
