"""Experiment trackers: TensorBoard, Weights & Biases and Trackio, each through its own library.

``--report-to tensorboard,wandb`` sends every metrics.jsonl row (same names, same step) and the run's
resolved config to each tracker, next to the run's own files and offline by default:

    tensorboard  torch.utils.tensorboard.SummaryWriter, event files in OUT/tensorboard
    wandb        wandb.init(dir=OUT, mode=$WANDB_MODE or "offline"): OUT/wandb/offline-run-*, `wandb sync` uploads it
    trackio      trackio.init / log / finish; its SQLite project lives in $TRACKIO_DIR, set to OUT/trackio
                 when neither the user nor an earlier import in this process fixed it (trackio reads it at import)

A tracker that is not installed is one UsageError line naming the pip extra, raised by ``require``
before any work. ``run_name``, ``tracker_group`` and ``tracker_tags`` name, group and tag the run
(a matrix: one run per cell, grouped by the matrix's name, tagged with task, variant and seed).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path
from typing import Optional

from benchmarks.errors import UsageError

# tracker -> the module that must be importable (its pip extra has the same name).
TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}
PROJECT = "grpo-bench"


def parse_report_to(value: Optional[str]) -> list[str]:
    """'tensorboard,wandb' -> ['tensorboard', 'wandb']; 'none' or '' -> []; an unknown name is a UsageError."""
    names = [n.strip() for n in (value or "").split(",") if n.strip() and n.strip() != "none"]
    for name in names:
        if name not in TRACKERS:
            raise UsageError(f"--report-to: unknown tracker {name!r}; choose from {', '.join(TRACKERS)}, none "
                             "(a comma list allowed)")
    return list(dict.fromkeys(names))


def require(value: Optional[str]) -> list[str]:
    """The trackers asked for, each importable, or one UsageError line naming the missing one's pip extra."""
    names = parse_report_to(value)
    for name in names:
        if importlib.util.find_spec(TRACKERS[name]) is None:
            raise UsageError(f"--report-to {name}: {TRACKERS[name]} is not installed; "
                             f"pip install -e \".[{name}]\" (or pip install {TRACKERS[name]})")
    return names


def _scalars(row: dict) -> dict[str, float]:
    return {k: float(v) for k, v in row.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


class _TensorBoard:
    def __init__(self, out: Path, config: dict, name: str, group: Optional[str], tags: list[str]):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(out / "tensorboard"))
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=1, default=str) + "\n```")
        self.writer.add_text("run", json.dumps({"name": name, "group": group, "tags": tags}))
        self.where = str(out / "tensorboard")

    def log(self, row: dict, step: int) -> None:
        for key, value in _scalars(row).items():
            self.writer.add_scalar(key, value, global_step=step)

    def finish(self) -> None:
        self.writer.close()


class _Wandb:
    def __init__(self, out: Path, config: dict, name: str, group: Optional[str], tags: list[str]):
        import wandb

        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT), name=name, group=group, tags=tags or None,
                              config=config, dir=str(out), mode=os.environ.get("WANDB_MODE", "offline"), reinit="create_new")
        self.where = str(Path(self.run.dir).parent)

    def log(self, row: dict, step: int) -> None:
        self.run.log(_scalars(row), step=step)

    def finish(self) -> None:
        self.run.finish()


class _Trackio:
    def __init__(self, out: Path, config: dict, name: str, group: Optional[str], tags: list[str]):
        if "trackio" not in sys.modules and not os.environ.get("TRACKIO_DIR"):
            os.environ["TRACKIO_DIR"] = str((out / "trackio").resolve())  # read once, when trackio is imported
        import trackio
        from trackio.utils import TRACKIO_DIR

        self.trackio = trackio
        self.run = trackio.init(project=os.environ.get("TRACKIO_PROJECT", PROJECT), name=name, group=group,
                                config={**config, "tags": tags}, embed=False)
        self.where = str(TRACKIO_DIR)

    def log(self, row: dict, step: int) -> None:
        self.trackio.log(_scalars(row), step=step)

    def finish(self) -> None:
        self.trackio.finish()


_CLASSES = {"tensorboard": _TensorBoard, "wandb": _Wandb, "trackio": _Trackio}


class Trackers:
    """Every tracker of a run: ``log(row)`` per metrics.jsonl row, ``finish()`` at the end (also on failure)."""

    def __init__(self, names: list[str], out: Path, config: dict, *, name: str, group: Optional[str], tags: list[str]):
        self.active = []
        try:
            for tracker in names:
                self.active.append(_CLASSES[tracker](out, config, name, group, tags))
        except Exception:
            self.finish()
            raise

    def where(self) -> dict[str, str]:
        return {type(t).__name__.strip("_").lower(): t.where for t in self.active}

    def log(self, row: dict) -> None:
        for tracker in self.active:
            tracker.log(row, int(row["step"]))

    def finish(self) -> None:
        for tracker in self.active:
            tracker.finish()
        self.active = []


def start(rc, out: Path, resolved: dict) -> Trackers:
    """The trackers ``rc.report_to`` names, started with the run's resolved config."""
    names = require(rc.report_to)
    tags = [t.strip() for t in (rc.tracker_tags or "").split(",") if t.strip()]
    name = rc.run_name or f"{rc.task}-{rc.algo}-seed{rc.seed}"
    return Trackers(names, out, resolved, name=name, group=rc.tracker_group, tags=tags)
