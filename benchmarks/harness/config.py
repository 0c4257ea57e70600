"""What a run is: its settings, resolved from one flat mapping of names to values.

The command line, a config file, a matrix cell's ``cell.json`` and the Python API all describe a
run the same way, as ``{name: value}`` with the names of the run's, the algorithm's and the task's
settings (the flag names without ``--``); ``resolve`` splits that mapping, refuses a name that
belongs to another algorithm or task, fills the task's learning rate and validates everything,
without changing any object it was given.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from algorithms import ALGORITHMS
from algorithms.base import config_field_types, config_fields
from benchmarks.errors import UsageError
from benchmarks.harness.tracking import parse_report_to
from benchmarks.passk import parse_ks
from tasks import TASKS


REPLICATE_STRIDE = 1_000_003  # a replicate's training seed: seed + REPLICATE_STRIDE * replicate (no seed a matrix uses)


def training_seed(rc: "RunConfig") -> int:
    """The seed of a run's training randomness (``replicate`` moves it, the evaluation's seed stays ``rc.seed``)."""
    return rc.seed + REPLICATE_STRIDE * rc.replicate


@dataclass
class RunConfig:
    task: str = field(default="pizza", metadata={"help": "task name"})
    algo: str = field(default="grpo", metadata={"help": "algorithm name"})
    steps: int = field(default=200, metadata={"help": "training steps (with --budget: at most this many)"})
    budget: Optional[int] = field(default=None, metadata={"help": "stop once this many completions were generated, discarded ones included (the matrix's unit); DAPO's dynamic-sampling refills stop at it"})
    seed: int = field(default=0, metadata={"help": "seed for sampling, prompts and evaluation"})
    replicate: int = field(default=0, metadata={"help": "an independent replicate of the same run: its training randomness (initialisation, sampling, prompt order) is drawn from seed + REPLICATE_STRIDE x replicate while its evaluation keeps --seed, the block it shares with other variants of a matrix (an A/A twin)"})
    device: str = field(default="auto", metadata={"help": "auto, cpu or cuda"})
    precision: str = field(default="auto", metadata={"help": "fp32, bf16 (autocast), or auto (bf16 on CUDA)"})
    logits_precision: str = field(default="same", metadata={"help": "the output layer's product under bf16: same (bf16, as autocast casts it) or fp32 (ScaleRL's fp32 LM head: the logits from fp32 hidden states and weights; a Llama policy)", "choices": ("same", "fp32")})
    out: str = field(default="runs/latest", metadata={"help": "run directory (grpo-bench run: runs/TASK-ALGO-seedSEED)"})
    eval_every: int = field(default=50, metadata={"help": "evaluate every N steps (0: only before and after)"})
    eval_every_completions: int = field(default=0, metadata={"help": "evaluate each time the completions generated cross a multiple of N, instead of every --eval-every steps (0: off); the matrix sets it for variants that re-sample (DAPO's dynamic sampling), so they are evaluated at their rivals' completion counts"})
    checkpoint_every: int = field(default=50, metadata={"help": "checkpoint every N steps (0: never)"})
    max_new_tokens: Optional[int] = field(default=None, metadata={"help": "completion length cap (default: the task's)"})
    temperature: Optional[float] = field(default=None, metadata={"help": "sampling temperature (default: the task's)"})
    pass_at_k: Optional[str] = field(default=None, metadata={
        "help": "also evaluate pass@k before and after training for these k, comma-separated, e.g. 1,4,16 (off)"})
    pass_samples: Optional[int] = field(default=None, metadata={
        "help": "samples a held-out question for --pass-at-k, at the task's temperature (>= the largest k; default: it)"})
    resume: bool = field(default=False, metadata={"help": "continue from the newest checkpoint in --out"})
    overwrite: bool = field(default=False, metadata={"help": "replace a finished run in --out (without it, a finished run is never overwritten)"})
    nproc: int = field(default=1, metadata={"help": "data-parallel processes for this run (gloo on CPU, NCCL on CUDA; or start under torchrun)"})
    save_model: bool = field(default=False, metadata={"help": "save the final policy to OUT/final (save_pretrained; with LoRA: the adapter)"})
    # Trackers (benchmarks/harness/tracking.py): each logs metrics.jsonl's rows and the resolved config, offline by default.
    report_to: str = field(default="none", metadata={"help": "experiment trackers: tensorboard, wandb, trackio or none; a comma list allowed"})
    run_name: Optional[str] = field(default=None, metadata={"help": "the trackers' run name (default: TASK-ALGO-seedSEED)"})
    tracker_group: Optional[str] = field(default=None, metadata={"help": "the trackers' group (a matrix: its name)"})
    tracker_tags: Optional[str] = field(default=None, metadata={"help": "the trackers' tags, comma-separated (a matrix: task, variant, seed)"})
    # LoRA through PEFT (benchmarks/harness/lora.py). Defaults are TRL's ModelConfig (lora_r 16, lora_alpha 32,
    # lora_dropout 0.05) and the "all-linear" target of TRL's example scripts (trl/scripts/*.py docstrings).
    lora_r: int = field(default=0, metadata={"help": "LoRA rank through PEFT; 0 trains every weight (TRL ModelConfig's lora_r: 16)"})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha (TRL ModelConfig's default)"})
    lora_dropout: float = field(default=0.05, metadata={"help": "LoRA dropout (TRL ModelConfig's default)"})
    lora_target_modules: str = field(default="all-linear", metadata={"help": "LoRA target modules: all-linear (PEFT: every linear layer but the output head, as TRL's examples) or a comma list, e.g. q_proj,v_proj"})
    # Not a flag: `grpo-bench run` fills it with its own command line, so that config.json says how to run it again.
    command: Optional[str] = field(default=None, metadata={"help": "the command line that started the run (None from Python)"})

    def validate(self, spell: Optional[Callable[[str], str]] = None) -> None:
        """Refuse impossible settings, one UsageError line each; ``spell`` writes a setting's name as its user wrote it
        (the command line: as a flag; Python: as the keyword; default: as a flag)."""
        name = spell or (lambda n: f"--{n.replace('_', '-')}")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise UsageError(f"{name(f.name)} must be a finite number, got {value}")
        if not self.out.strip():  # an empty path is the working directory: a run's files would land among the user's
            raise UsageError(f"{name('out')} must name a folder for the run, got {self.out!r}")
        if self.steps < 1:
            raise UsageError(f"{name('steps')} must be >= 1, got {self.steps}")
        if self.budget is not None and self.budget < 1:
            raise UsageError(f"{name('budget')} must be >= 1, got {self.budget}")
        if self.eval_every < 0 or self.eval_every_completions < 0 or self.checkpoint_every < 0:
            raise UsageError(f"{name('eval_every')}, {name('eval_every_completions')} and {name('checkpoint_every')} "
                             "must be >= 0")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise UsageError(f"{name('max_new_tokens')} must be >= 1, got {self.max_new_tokens}")
        if self.temperature is not None and self.temperature < 0:
            raise UsageError(f"{name('temperature')} must be >= 0, got {self.temperature}")
        if self.nproc < 1:
            raise UsageError(f"{name('nproc')} must be >= 1, got {self.nproc}")
        if not 0 <= self.seed < 2**32:
            raise UsageError(f"{name('seed')} must be an integer from 0 to 2**32 - 1, got {self.seed}")
        if self.logits_precision not in ("same", "fp32"):
            raise UsageError(f"{name('logits_precision')} must be same or fp32, got {self.logits_precision!r}")
        if self.replicate < 0:
            raise UsageError(f"{name('replicate')} must be >= 0, got {self.replicate}")
        if self.lora_r < 0 or self.lora_alpha < 1 or not 0 <= self.lora_dropout < 1:
            raise UsageError(f"{name('lora_r')} must be >= 0, {name('lora_alpha')} >= 1 and {name('lora_dropout')} in "
                             f"[0, 1), got {self.lora_r}, {self.lora_alpha}, {self.lora_dropout}")
        parse_report_to(self.report_to)
        parse_ks(self.pass_at_k, self.pass_samples, flag=name("pass_at_k"), samples_flag=name("pass_samples"))
        if self.resume and self.overwrite:
            raise UsageError(f"{name('resume')} continues a run and {name('overwrite')} replaces it: give one of them")
        if self.algo not in ALGORITHMS:
            raise UsageError(f"unknown algorithm {self.algo!r}; choose from {', '.join(sorted(ALGORITHMS))}")
        if self.task not in TASKS:
            raise UsageError(f"unknown task {self.task!r}; choose from {', '.join(sorted(TASKS))}")


# RunConfig fields that record how a run was asked for, not what it computes: config.json keeps them under
# "run" but not among the "settings", so a resume typed differently changes no setting and a matrix cell's
# spec never holds them.
RECORD_ONLY = ("command",)
# Run settings that a resumed run may change: the rest must equal the run's config.json.
RESUMABLE = ("steps", "resume", "overwrite", "out", "eval_every", "eval_every_completions", "checkpoint_every", "save_model", "device",
             "report_to", "run_name", "tracker_group", "tracker_tags")


def field_type(cls, name: str) -> Any:
    """The type of setting ``name`` of the dataclass ``cls`` (an option group's too), with Optional[...] unwrapped
    (bool, int, float, str)."""
    return config_field_types(cls).get(name, str)


def _owners(name: str) -> tuple[list[str], list[str]]:
    algos = sorted(a for a, cls in ALGORITHMS.items() if name in config_fields(cls.Config))
    tasks = sorted(t for t, cls in TASKS.items() if name in cls.options())
    return algos, tasks


def resolve(options: dict[str, Any], *, spell: Callable[[str], str] = repr):
    """``{name: value}`` -> (RunConfig, algorithm config, task options), validated.

    ``task`` and ``algo`` name the run; every other name is a field of RunConfig, of the algorithm's
    Config, or an option of the task. A name that belongs to another algorithm or task, or to none,
    is one UsageError line (``spell`` writes names as the caller's user wrote them, e.g. as flags).
    An unset learning rate becomes the task's recommended one.
    """
    options = {k: v for k, v in options.items() if v is not None}
    for name, value in options.items():  # a task's numbers too: nan/inf is bad input before any work
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"{spell(name)} must be a finite number, got {value}")
    task, algo = options.get("task"), options.get("algo")
    if task not in TASKS:
        raise UsageError(f"unknown task {task!r}; choose from {', '.join(sorted(TASKS))}")
    if algo not in ALGORITHMS:
        raise UsageError(f"unknown algorithm {algo!r}; choose from {', '.join(sorted(ALGORITHMS))}")
    config_cls, task_cls = ALGORITHMS[algo].Config, TASKS[task]
    run_names = {f.name for f in dataclasses.fields(RunConfig)}
    algo_names = set(config_fields(config_cls))
    task_names = set(task_cls.options())
    run_kwargs, algo_kwargs, task_kwargs = {}, {}, {}
    for name, value in options.items():
        if name in run_names:
            run_kwargs[name] = value
        elif name in algo_names:
            algo_kwargs[name] = value
        elif name in task_names or name == "reward_fn":
            task_kwargs[name] = value
        else:
            algos, tasks = _owners(name)
            if algos:
                raise UsageError(f"{spell(name)} is an option of {', '.join(algos)}, not of {algo}")
            if tasks:
                raise UsageError(f"{spell(name)} is an option of task {', '.join(tasks)}, not of {task}")
            raise UsageError(f"unknown option {spell(name)}; see grpo-bench run --help")
    rc = RunConfig(**run_kwargs)
    rc.validate(spell)
    try:
        algo_config = with_task_defaults(config_cls(**algo_kwargs), task_cls)
        algo_config.validate()
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{algo}: {exc}") from None
    return rc, algo_config, task_kwargs


def with_task_defaults(algo_config, task_cls):
    """``algo_config`` with what it leaves to the task filled from the task (the one place that does): an unset
    learning rate becomes the task's recommended one, in a copy."""
    if algo_config.learning_rate is not None:
        return algo_config
    return dataclasses.replace(algo_config, learning_rate=task_cls.recommended_learning_rate)


class DuplicateKey(ValueError):
    """A key a config file's table gives twice (``args[0]``)."""


def _unique_keys(pairs: list[tuple[Any, Any]]) -> dict:
    """``json.loads``' object_pairs_hook: the table, or DuplicateKey for a key given twice."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


def _load_yaml_unique(text: str):
    """``yaml.safe_load``, but a mapping that gives a key twice raises DuplicateKey (PyYAML keeps the last)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            self.flatten_mapping(node)
            keys = [self.construct_object(key, deep=True) for key, _ in node.value]
            for i, key in enumerate(keys):
                if key in keys[:i]:
                    raise DuplicateKey(key)
            return super().construct_mapping(node, deep)

    return yaml.load(text, Loader=UniqueKeyLoader)


def load_config_file(path) -> dict[str, Any]:
    """A run's settings from a .toml, .yaml/.yml or .json file: one flat table of the ``run`` flags' names
    (dashes or underscores), as TRL's CLI takes ``--config``. Returns ``{name: value}`` with underscores;
    an unreadable file, a nested table or a value of the wrong type is one UsageError line (unknown names
    are refused by ``resolve``, which knows the algorithm and task)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"--config {path}: cannot read it ({exc.strerror or exc})") from None
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            data = _load_yaml_unique(text) or {}
        elif path.suffix == ".json":
            data = json.loads(text, object_pairs_hook=_unique_keys)
        else:
            raise UsageError(f"--config {path}: use a .toml, .yaml, .yml or .json file")
    except UsageError:
        raise
    except DuplicateKey as exc:  # TOML refuses a key given twice; JSON and YAML would keep the last silently
        raise UsageError(f"--config {path}: the key {exc.args[0]!r} is given more than once") from None
    except Exception as exc:  # tomllib, yaml and json each raise their own parse errors
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"--config {path}: not valid {path.suffix[1:]}: {first}") from None
    if not isinstance(data, dict):
        raise UsageError(f"--config {path}: expected a table of settings, got {type(data).__name__}")
    options = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if isinstance(value, (dict, list)):
            raise UsageError(f"--config {path}: {key!r} must be a single value, got a {type(value).__name__}")
        options[name] = value
    return options


def check_types(options: dict[str, Any], *, spell: Callable[[str], str] = repr) -> dict[str, Any]:
    """``options`` with each value checked against its field's type (int where a float is expected is
    accepted as that float); a mismatch is one UsageError line. Names no field owns pass through."""
    kinds: dict[str, type] = {f.name: field_type(RunConfig, f.name) for f in dataclasses.fields(RunConfig)}
    for cls in ALGORITHMS.values():
        kinds.update(config_field_types(cls.Config))
    for cls in TASKS.values():
        kinds.update({name: option.kind for name, option in cls.options().items()})
    out = {}
    for name, value in options.items():
        kind = kinds.get(name)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if kind is float and isinstance(value, str):  # PyYAML (YAML 1.1) reads 1e-3, without a dot, as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if value is not None and kind in (bool, int, float, str) and not (
                isinstance(value, kind) and (kind is bool or not isinstance(value, bool))):
            raise UsageError(f"{spell(name)} must be a {kind.__name__}, got {value!r}")
        out[name] = value
    return out


def flat_settings(rc: RunConfig, algo_config, task_options: dict) -> dict[str, Any]:
    """The inverse of ``resolve``: one flat mapping (what ``cell.json`` and config files hold), RECORD_ONLY fields left out."""
    run = {k: v for k, v in dataclasses.asdict(rc).items() if k not in RECORD_ONLY}
    return {**run, **algo_config.settings(),
            **{k: v for k, v in task_options.items() if k != "reward_fn"}}
