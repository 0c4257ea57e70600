"""Studies: the checks (``grpo-bench check NAME``), benchmarks (``grpo-bench bench NAME``) and the top-level
studies (``grpo-bench NAME``: claims, brief, ...) whose numbers go into results/ and the README, each registered by name with ``@register_study`` as algorithms, tasks and
executors are.

A study is a subclass of ``Study``: a ``name``, a ``group`` (one of GROUPS; one name per group, so a ``check NAME``
and a ``bench NAME`` are two studies), a one-line ``help``, a ``Settings`` dataclass (a subclass of
``StudySettings``) whose fields, each with a one-line ``help`` in its metadata, are its flags, and ``run(settings,
command) -> exit status``. The built-in ones are in benchmarks/checks/commands.py, benchmarks/perf/commands.py and
benchmarks/commands.py; an installed package adds a check or a bench through the entry-point group
``grpo_bench.studies`` (``load_study_plugins``). The top-level commands are the project's own: ``grpo-bench --help``
lists them without importing anything.

What a field's metadata may say beyond ``help`` (the command line reads it, benchmarks/cli/options.py): ``choices``;
``metavar``; ``comma_separated`` (a list or tuple given as one comma-separated value, not as several);
``values: "seed"`` (each value is checked as a seed); ``hidden`` (a flag for tests, not in ``--help``); ``one_of``
(the fields that share it exclude each other); ``required`` (a field without a default that is a required flag, not
a positional argument); ``repeat`` (a list given one flag at a time: ``--pair A B --pair C D``); ``nargs`` (how many
values one flag takes, where it is not one or, for a list, one or more). A field without a default is a positional
argument; a field that ``__init__`` does not take (``init=False``) is no flag. The lifecycle reads two more:
``matrix`` (the label of a matrix folder the study reads) and ``writes`` ("file" or "folder": a path it writes).

The options several studies share (out, seed, device, threads, readme, section, resume, overwrite, rerender) are
declared with ``option(name)``: each has one help text, here, and one usual default that a study may replace.

A study that writes a report declares it on its class: ``report_file`` (its name in the ``--out`` folder; none
where ``--out`` names the report itself), ``title``, ``section`` (its README section, where the settings have no
``--section``) and ``source_file`` (the json in the folder that ``run`` writes and ``--rerender`` reads), and renders
it: ``render(result, settings, command) -> markdown`` (and ``render_section`` where the README's section is not the
report's body). ``run`` measures or computes the result and hands it to ``write``.

The lifecycle every study goes through is written once, here: ``Study.start`` checks the paths its settings name
before any work and, with ``--rerender``, writes the report again from its json without measuring (``rerender``);
``write`` writes the report and, with ``--readme``, its README section (through ``benchmarks.markdown.write_report``,
the one writer of both); ``earlier_report`` is ``--resume`` and ``--overwrite`` (an existing report is never
replaced unless asked, where the study has ``--overwrite``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Optional

from benchmarks.errors import UsageError

TOP = "top"  # the group of the studies that are top-level commands: ``grpo-bench NAME``
GROUPS = ("check", "bench", TOP)
PLUGIN_GROUPS = ("check", "bench")  # the groups an installed package may add a study to

# name: (help, usual default). Help says what the option does in every study that has it; a study's own default
# is shown after it, or what its None stands for (``shown``).
SHARED_OPTIONS = {
    "out": ("folder for the report and its data", "results"),
    "seed": ("seed of every random draw (weights, sampling, prompts)", 0),
    "device": ("auto, cpu or cuda", "auto"),
    "threads": ("torch threads", 0),
    "readme": ("README (or results page) whose section of this study is regenerated ('': none)", None),
    "section": ("name of the README section to regenerate", None),
    "resume": ("keep what OUT's report measured with the same settings and measure only what it lacks", False),
    "overwrite": ("replace OUT's report (else an existing one is refused)", False),
    "rerender": ("measure nothing: write OUT's report (and the README section) again from its json", False),
}
# The paths the shared options name, which ``check_paths`` checks before any work.
WRITES = {"out": "folder", "readme": "file"}


def option(name: str, default=MISSING, *, shown: Optional[str] = None, required: bool = False,
           file: Optional[str] = None, **metadata) -> dataclasses.Field:
    """The field of the shared option ``name`` with its help and its usual default, or ``default``; ``shown`` says
    what the default is where the value alone does not (None: "results/perf, or results/gpu on CUDA"); ``required``:
    no default, a flag that must be given. ``file``: an ``out`` that names one file, not a folder, with the study's
    own words for it. Keyword-only in ``__init__``, so a study's own positional fields may follow it."""
    help_text, usual = SHARED_OPTIONS[name]
    help_text = file or help_text
    if shown is not None:
        help_text += f" (default: {shown})"
    metadata = {"help": help_text, "shared": name, **metadata}
    if name in WRITES:
        metadata["writes"] = "file" if file else WRITES[name]
    if required:
        return dataclasses.field(kw_only=True, metadata={**metadata, "required": True})
    return dataclasses.field(default=usual if default is MISSING else default, kw_only=True, metadata=metadata)


@dataclass
class StudySettings:
    """The base of every study's settings. It has no field of its own: each study declares its flags, the shared
    ones with ``option``."""


class Study:
    """What ``register_study`` takes; ``cls().start(settings, command)`` runs it."""

    name: str
    group: str  # one of GROUPS
    help: str  # its line in ``grpo-bench --help`` or its group's ``--help``
    Settings: type = StudySettings
    # The report, for a study that writes one (``write``); see the module docstring.
    report_file: str = ""  # its name in the --out folder ("": --out names the report itself)
    title: str = ""  # its "# TITLE" line ("": none)
    section: str = ""  # its README section, where the settings have no --section
    source_file: str = ""  # the json in the --out folder that ``run`` writes and --rerender renders the report from

    def run(self, settings, command: str) -> int:
        """Run with ``settings`` (an instance of ``Settings``); ``command`` is the command line that reproduces the
        run, which a report quotes. Returns the exit status: 0 when every check passed."""
        raise NotImplementedError

    def check(self, settings) -> None:
        """What ``settings``' values must be beyond their types, checked first: one UsageError line, before any path
        is checked or anything is measured. Nothing, unless a study says."""

    def render(self, result, settings, command: str) -> str:
        """The report's markdown below its title, from ``result``: what ``run`` measured or computed, or with
        --rerender the ``source_file`` it wrote."""
        raise NotImplementedError(f"{type(self).__qualname__} writes a report but has no render method")

    def render_section(self, result, settings, command: str, body: str) -> str:
        """The README section's markdown: the report's ``body`` (without its title) unless a study says."""
        return body

    def folder(self, settings) -> Path:
        """The folder of the report and its ``source_file``: --out, unless a study says."""
        return Path(settings.out)

    def readme_section(self, settings) -> tuple[Optional[str], str]:
        """The page the README section goes to (--readme; None or '' for none) and the section's name (--section,
        else the study's ``section``)."""
        return getattr(settings, "readme", None), getattr(settings, "section", self.section)

    def report_path(self, settings) -> Path:
        """The report's file: ``report_file`` in the folder, or --out itself."""
        return self.folder(settings) / self.report_file if self.report_file else Path(settings.out)

    def write(self, result, settings, command: str, *, readme: bool = True) -> str:
        """The report rendered from ``result`` and, with --readme, its README section (``readme=False``: the report
        alone, one still being measured, whose section is written at the end). Returns the report's body."""
        from benchmarks.markdown import write_report  # start-up: hashlib, random (benchmarks/commands.py's docstring)

        body = self.render(result, settings, command)
        page, section = self.readme_section(settings) if readme else (None, "")
        write_report(self.report_path(settings), body, title=self.title, readme=page, section=section,
                     section_body=self.render_section(result, settings, command, body) if page else None)
        return body

    def stored(self, path: Path):
        """The result ``run`` stored at ``path``, its ``source_file``, as --rerender reads it: one UsageError line
        when there is none."""
        return rerender_source(path)

    def status(self, result) -> int:
        """The exit status of a report written again from ``result`` (--rerender): 0 unless a study says."""
        return 0

    def rerender(self, settings, command: str) -> int:
        """--rerender: the report and its README section written again from ``source_file``, as the current code
        renders them; nothing is measured (for a change of a report's wording, where measuring again costs hours)."""
        path = self.folder(settings) / self.source_file
        result = self.stored(path)
        try:
            self.write(result, settings, command)
        except (KeyError, TypeError) as e:  # a json without a part the report shows: a stopped or an older run's
            raise UsageError(f"--rerender needs a finished report in {path}: {e!r}") from None
        print(f"rewrote {self.report_path(settings)} from {path.name}")
        return self.status(result)

    def start(self, settings, command: str) -> int:
        """The lifecycle of every study, which the command line calls: its values (``check``), then the paths
        ``settings`` names (``check_paths``) are checked before any work; with ``--rerender`` the report is written
        again from its json and nothing is measured (``rerender``, never ``run``); else ``run``."""
        self.check(settings)
        check_paths(settings)
        if getattr(settings, "rerender", False):
            return self.rerender(settings, command)
        return self.run(settings, command)


# Filled by ``register_study`` at each study's definition and, for installed plug-ins, from the entry-point group
# ``grpo_bench.studies`` (``load_study_plugins``); keyed "group:name".
STUDIES: dict[str, type[Study]] = {}


def register_study(cls=None, *, name: Optional[str] = None):
    """Class decorator: ``STUDIES["group:name"] = cls`` (``name`` or ``cls.name``). A second, different class under a
    taken name of the same group is refused (re-registering the same class is a no-op). The guard is
    algorithms.registry's, written here again: that package imports torch, and ``grpo-bench claims --help`` must
    not."""

    def register(cls):
        settings = getattr(cls, "Settings", None)
        if not (isinstance(cls, type) and issubclass(cls, Study) and dataclasses.is_dataclass(settings)
                and issubclass(settings, StudySettings)):
            raise TypeError(f"{cls!r} is not a subclass of benchmarks.study.Study with a Settings dataclass "
                            "derived from StudySettings")
        if (any(f.name == "rerender" for f in dataclasses.fields(settings)) and not cls.source_file
                and cls.rerender is Study.rerender):
            raise TypeError(f"study {cls.__qualname__} has --rerender but no source_file to render its report from")
        if getattr(cls, "group", None) not in GROUPS:
            raise ValueError(f"study {cls.__qualname__}: group {getattr(cls, 'group', None)!r} is none of "
                             f"{', '.join(GROUPS)}")
        key = f"{cls.group}:{name or cls.name}"
        taken = STUDIES.setdefault(key, cls)
        if taken is not cls:
            raise ValueError(f"study name {key!r} is taken by {taken.__module__}.{taken.__qualname__}; "
                             f"{cls.__module__}.{cls.__qualname__} needs another name")
        return cls

    return register if cls is None else register(cls)


def studies(group: str) -> dict[str, type[Study]]:
    """The studies of ``group`` by name, in the order they were registered."""
    return {key.partition(":")[2]: cls for key, cls in STUDIES.items() if key.partition(":")[0] == group}


def study_class(group: str, name: str) -> type[Study]:
    """The study ``name`` of ``group``, or ValueError listing the registered ones."""
    key = f"{group}:{name}"
    if key not in STUDIES:
        raise ValueError(f"unknown study {key!r}; choose from {', '.join(sorted(STUDIES))}")
    return STUDIES[key]


def _register_plugin(cls, name: str):
    if getattr(cls, "group", None) not in PLUGIN_GROUPS:
        raise ValueError(f"a plug-in study is one of {', '.join(PLUGIN_GROUPS)}, not of group "
                         f"{getattr(cls, 'group', None)!r}")
    return register_study(cls, name=name)


_plugins_loaded = False


def load_study_plugins() -> list[str]:
    """Register the checks and benches installed packages declare (entry-point group ``grpo_bench.studies``), once
    per process; returns 'group:name' of each entry point. Call it after the built-in checks and benches are
    registered: a plug-in then cannot take their names. A broken plug-in is one UsageError line."""
    from benchmarks.plugins import register_entry_points  # heavy: algorithms, tasks (torch)

    global _plugins_loaded
    if _plugins_loaded:
        return []
    names = register_entry_points("grpo_bench.studies", _register_plugin)
    _plugins_loaded = True
    return names


# ------------------------------------------------------------------------------------------------
# The lifecycle: paths checked before any work, --resume and --overwrite, --rerender
# ------------------------------------------------------------------------------------------------


def writable(path, flag_name: str, *, folder: bool = False) -> Path:
    """``path`` as a file (``folder``: a folder) this command can create or replace, or one UsageError line
    naming ``flag_name``: a folder where a file is wanted, a file where a folder is wanted (the path itself or
    one of the folders above it) or a folder it cannot write in."""
    path = Path(path)
    if path.is_dir() and not folder:
        raise UsageError(f"{flag_name} {path}: a folder, not a file; give the path of the file to write")
    if path.exists() and not path.is_dir() and folder:
        raise UsageError(f"{flag_name} {path}: a file, not a folder; give a folder (it is created if missing)")
    # Where the new files go: the folder itself when it exists, else the nearest folder above that exists
    # (the missing ones are created).
    where = path if folder and path.is_dir() else path.parent
    while not where.exists() and where != where.parent:
        where = where.parent
    if not where.is_dir():
        raise UsageError(f"{flag_name} {path}: {where} is a file, not a folder")
    if not os.access(where, os.W_OK | os.X_OK):
        raise UsageError(f"{flag_name} {path}: cannot write in {where} (permission denied)")
    return path


def matrix_directory(directory, what: str = "") -> Path:
    """``directory`` when it holds a matrix (its matrix.json), else one UsageError line saying which is missing."""
    directory = Path(directory)
    label = f"{what} {directory}" if what else str(directory)
    if not directory.exists():
        raise UsageError(f"{label}: no such folder")
    if not directory.is_dir():
        raise UsageError(f"{label}: a file, not a matrix folder")
    if not (directory / "matrix.json").is_file():
        raise UsageError(f"{label}: not a matrix directory (no matrix.json)")
    return directory


def check_paths(settings) -> None:
    """The paths ``settings`` names, each checked before any work (one UsageError line, not a traceback at the end
    of a long computation): first the matrix folders it reads (fields whose metadata has ``matrix``, the folder's
    label; one ending in the field's ``or_file`` suffix is a file instead), then the files and folders it writes (``writes``); a path left empty or None is not checked."""
    fields = [f for f in dataclasses.fields(settings) if f.init]
    for f in fields:
        if "matrix" in f.metadata:
            value = getattr(settings, f.name)
            for directory in ([] if value is None else [value] if isinstance(value, str) else value):
                if f.metadata.get("or_file") and str(directory).endswith(f.metadata["or_file"]):
                    if not Path(directory).is_file():  # a file the study reads in a matrix folder's place
                        raise UsageError(f"{directory}: no such file")
                    continue
                matrix_directory(directory, f.metadata["matrix"])
    for f in fields:
        path = getattr(settings, f.name)
        if f.metadata.get("writes") and path:
            writable(path, "--" + f.name.replace("_", "-"), folder=f.metadata["writes"] == "folder")


def earlier_report(settings, path: Path, parts: str) -> Optional[dict]:
    """The report at ``path`` that ``--resume`` continues, or None: there is none, ``--overwrite`` replaces it, or
    (a study without ``--overwrite``) it is measured again. A study with ``--overwrite`` never replaces a report
    without being asked: without ``--resume`` that is one UsageError line. ``parts``: what a resume measures
    ("the workloads")."""
    if not path.exists() or getattr(settings, "overwrite", False):
        return None
    if not getattr(settings, "resume", False):
        if hasattr(settings, "overwrite"):
            raise UsageError(f"{path} holds a measured report; --resume to measure {parts} it lacks, or --overwrite "
                             "to replace it")
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"--resume: {path} cannot be read: {e!r}") from None


def rerender_source(path: Path, what: str = "report") -> dict:
    """The json ``--rerender`` writes a report again from, or one UsageError line."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"--rerender needs a finished {what} in {path}: {e!r}") from None
