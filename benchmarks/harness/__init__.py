"""The harness: a run's settings (``config``), the one training loop (``loop``), measurement of device,
memory and versions (``measure``) and evaluation without training (``evaluate``)."""

from benchmarks.errors import TrainingFailed, UsageError
from benchmarks.harness.config import RunConfig, resolve
from benchmarks.harness.loop import build, make_evaluated_task, run, train_steps

__all__ = ["RunConfig", "TrainingFailed", "UsageError", "build", "make_evaluated_task", "resolve", "run", "train_steps"]
