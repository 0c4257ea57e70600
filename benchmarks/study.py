"""Studies: the checks (``grpo-bench check NAME``) and benchmarks (``grpo-bench bench NAME``) whose numbers go into
results/ and the README, each registered by name with ``@register_study`` as algorithms, tasks and executors are.

A study is a subclass of ``Study``: a ``name``, a ``group`` ("check" or "bench"; one name per group, so
``check precision`` and ``bench precision`` are two studies), a one-line ``help``, a ``Settings`` dataclass (a
subclass of ``StudySettings``) whose fields, each with a one-line ``help`` in its metadata, are its flags, and
``run(settings, command) -> exit status``. The built-in ones are in benchmarks/checks/studies.py and
benchmarks/perf/studies.py; an installed package adds one through the entry-point group ``grpo_bench.studies``
(``load_study_plugins``).

What a field's metadata may say beyond ``help`` (the command line reads it, benchmarks/cli/options.py): ``choices``;
``metavar``; ``comma_separated`` (a list or tuple given as one comma-separated value, not as several);
``values: "seed"`` (each value is checked as a seed); ``hidden`` (a flag for tests, not in ``--help``); ``one_of``
(the fields that share it exclude each other). A field without a default is a positional argument; a field that
``__init__`` does not take (``init=False``) is no flag.

The options several studies share (out, seed, device, threads, readme, resume, overwrite, rerender) are declared
with ``option(name)``: each has one help text, here, and one usual default that a study may replace.
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, dataclass
from typing import Optional

from algorithms.registry import lookup_named, register_named
from benchmarks.plugins import register_entry_points

GROUPS = ("check", "bench")

# name: (help, usual default). Help says what the option does in every study that has it; a study's own default
# is shown after it, or what its None stands for (``shown``).
SHARED_OPTIONS = {
    "out": ("folder for the report and its data", "results"),
    "seed": ("seed of every random draw (weights, sampling, prompts)", 0),
    "device": ("cpu, cuda or auto", "cpu"),
    "threads": ("torch threads", 0),
    "readme": ("README (or results page) whose section of this study is regenerated ('': none)", None),
    "resume": ("keep what OUT's report measured with the same settings and measure only what it lacks", False),
    "overwrite": ("replace OUT's report (else an existing one is refused)", False),
    "rerender": ("measure nothing: write OUT's report (and the README section) again from its json", False),
}


def option(name: str, default=MISSING, *, shown: Optional[str] = None, **metadata) -> dataclasses.Field:
    """The field of the shared option ``name`` with its help and its usual default, or ``default``; ``shown`` says
    what the default is where the value alone does not (None: "results/perf, or results/gpu on CUDA"). Keyword-only
    in ``__init__``, so a study's own positional fields may follow it."""
    help_text, usual = SHARED_OPTIONS[name]
    if shown is not None:
        help_text += f" (default: {shown})"
    return dataclasses.field(default=usual if default is MISSING else default, kw_only=True,
                             metadata={"help": help_text, **metadata})


@dataclass
class StudySettings:
    """The base of every study's settings: the folder it writes (a study names its own with ``option("out", ...)``)."""

    out: str = option("out")


class Study:
    """What ``register_study`` takes; ``cls().run(settings, command)`` runs it."""

    name: str
    group: str  # one of GROUPS
    help: str  # its line in ``grpo-bench check --help`` / ``bench --help``
    Settings: type = StudySettings

    def run(self, settings, command: str) -> int:
        """Run with ``settings`` (an instance of ``Settings``); ``command`` is the command line that reproduces the
        run, which a report quotes. Returns the exit status: 0 when every check passed."""
        raise NotImplementedError


# Filled by ``register_study`` at each study's definition and, for installed plug-ins, from the entry-point group
# ``grpo_bench.studies`` (``load_study_plugins``); keyed "group:name".
STUDIES: dict[str, type[Study]] = {}


def register_study(cls=None, *, name: Optional[str] = None):
    """Class decorator: ``STUDIES["group:name"] = cls`` (``name`` or ``cls.name``). A second, different class under a
    taken name of the same group is refused (re-registering the same class is a no-op)."""

    def register(cls):
        settings = getattr(cls, "Settings", None)
        if not (isinstance(cls, type) and issubclass(cls, Study) and dataclasses.is_dataclass(settings)
                and issubclass(settings, StudySettings)):
            raise TypeError(f"{cls!r} is not a subclass of benchmarks.study.Study with a Settings dataclass "
                            "derived from StudySettings")
        if getattr(cls, "group", None) not in GROUPS:
            raise ValueError(f"study {cls.__qualname__}: group {getattr(cls, 'group', None)!r} is none of "
                             f"{', '.join(GROUPS)}")
        return register_named(STUDIES, "study", f"{cls.group}:{name or cls.name}", cls)

    return register if cls is None else register(cls)


def studies(group: str) -> dict[str, type[Study]]:
    """The studies of ``group`` by name, in the order they were registered."""
    return {key.partition(":")[2]: cls for key, cls in STUDIES.items() if key.partition(":")[0] == group}


def study_class(group: str, name: str) -> type[Study]:
    """The study ``name`` of ``group``, or ValueError listing the registered ones."""
    return lookup_named(STUDIES, "study", f"{group}:{name}")


_plugins_loaded = False


def load_study_plugins() -> list[str]:
    """Register the studies installed packages declare (entry-point group ``grpo_bench.studies``), once per process;
    returns 'group:name' of each entry point. Call it after the built-in studies are registered: a plug-in then
    cannot take their names. A broken plug-in is one UsageError line."""
    global _plugins_loaded
    if _plugins_loaded:
        return []
    names = register_entry_points("grpo_bench.studies", register_study)
    _plugins_loaded = True
    return names
