"""Where the reference frameworks' code comes from: pinned versions, fetched once into a cache, imported on demand.

verl 0.9.1 and OpenRLHF 0.11.2 pin engines this suite does not use (vLLM, flash-attn, DeepSpeed, older transformers),
TRL 1.12.0 (the last TRL with PPO) cannot sit beside the TRL 1.16 the suite depends on, ms-swift 4.6.0 pins its own
TRL and ModelScope stack, and SkyRL 0.4.0 declares Python >= 3.12. So none of them is installed into the environment:
each is fetched without its dependencies into a folder of its own,

    python -m pip install --no-deps --target CACHE/NAME-VERSION DIST==VERSION

SkyRL's wheel is fetched as a 3.12 wheel (``--python-version 3.12 --only-binary=:all:``) with the two small
libraries its loss module imports (jaxtyping and loguru, pinned) beside it in its folder; the modules the adapter
imports (advantage estimators, off-policy correction) use nothing newer than 3.11, so they run in this interpreter.

(``grpo-bench check references --install`` runs these), and the adapters import only the modules that hold loss and
advantage code from there. ``CACHE`` is ``$GRPO_BENCH_REFERENCES``, else ``$XDG_CACHE_HOME/grpo-bench/references``
(``~/.cache/...``). The few light libraries those modules import (omegaconf, tensordict, codetiming, ray, orjson) come with the
``references`` extra. The environment's own metadata never sees these packages, so ``pip check`` stays clean.

Where a module's package ``__init__`` (or a module-level import) pulls an engine in, ``import_module`` imports the
module with those names bound to stand-ins for the duration of the import only: a stand-in raises if it is ever
called, and nothing of it stays in ``sys.modules`` (so transformers never mistakes a stand-in for DeepSpeed).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from benchmarks.errors import UsageError


@dataclass(frozen=True)
class Pinned:
    name: str  # the framework's name in this suite (a folder, a table column)
    dist: str  # its PyPI distribution
    version: str
    sys_path: bool  # whether its folder goes on sys.path (False: its files are read, never imported by name)
    pip_options: tuple[str, ...] = ()  # further `pip install` options (a wheel for another Python)
    companions: tuple[str, ...] = ()  # pinned requirements fetched into the same folder (light imports of its modules)

    @property
    def requirement(self) -> str:
        return f"{self.dist}=={self.version}"

    @property
    def dist_info(self) -> str:
        """Its ``.dist-info`` folder's name (pip writes the distribution's name with underscores)."""
        return f"{self.dist.replace('-', '_')}-{self.version}.dist-info"

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"


PINNED = {p.name: p for p in (
    Pinned("verl", "verl", "0.9.1", sys_path=True),
    Pinned("openrlhf", "openrlhf", "0.11.2", sys_path=True),
    # Read from its files only: its `trl` package must never shadow the installed TRL.
    Pinned("trl-ppo", "trl", "1.12.0", sys_path=False),
    Pinned("skyrl", "skyrl", "0.4.0", sys_path=True, pip_options=("--python-version", "3.12", "--only-binary=:all:"),
           companions=("jaxtyping==0.3.11", "wadler-lindig==0.1.8", "loguru==0.8.0")),
    # Read from its files only: its trainer module imports ModelScope, vLLM and its own TRL stack.
    Pinned("ms-swift", "ms-swift", "4.6.0", sys_path=False),
)}
class MissingFramework(UsageError):
    """A reference framework (or a light library its modules import) is not there: one line naming what to install."""


def cache_root() -> Path:
    explicit = os.environ.get("GRPO_BENCH_REFERENCES")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "grpo-bench" / "references"


def folder(name: str) -> Path:
    pinned = PINNED[name]
    return cache_root() / f"{pinned.name}-{pinned.version}"


def install_command(name: str) -> list[str]:
    pinned = PINNED[name]
    return [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *pinned.pip_options, "--target",
            str(folder(name)), pinned.requirement, *pinned.companions]


def is_installed(name: str) -> bool:
    return (folder(name) / PINNED[name].dist_info).is_dir()


def install(names: Iterable[str] = tuple(PINNED), log=print) -> list[str]:
    """Fetch every missing pinned framework into its cache folder; returns the names fetched."""
    fetched = []
    for name in names:
        if is_installed(name):
            continue
        command = install_command(name)
        log(f"fetching {PINNED[name].label}: {' '.join(command[2:])}")
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0 or not is_installed(name):
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise MissingFramework(f"could not fetch {PINNED[name].requirement} into {folder(name)}: {tail}")
        fetched.append(name)
    return fetched


def missing_line(name: str) -> str:
    pinned = PINNED[name]
    return (f"{pinned.label} is not installed for the reference check: run `grpo-bench check references --install` "
            f"(it runs `{' '.join(install_command(name)[2:])}`)")


def require(name: str) -> Path:
    """The framework's folder, or MissingFramework with the one line that says how to get it."""
    if not is_installed(name):
        raise MissingFramework(missing_line(name))
    path = folder(name)
    if PINNED[name].sys_path and str(path) not in sys.path:
        sys.path.append(str(path))  # after site-packages: its stray top-level packages (tests/) never shadow ours
    return path


class _StandIn(types.ModuleType):
    """A module an engine import is answered with: any attribute is a callable that raises when called."""

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)

        def unavailable(*_, **__):
            raise RuntimeError(f"{self.__name__}.{attr} is an engine stand-in of the reference adapters; it cannot run")

        unavailable.__name__ = attr
        return unavailable


@contextlib.contextmanager
def _bound(stand_ins: Iterable[str], bare_packages: dict[str, Path]):
    """``stand_ins`` bound to stand-in modules while the body runs, then unbound (their previous entries, if any,
    restored); ``bare_packages`` registered as packages whose ``__init__`` is skipped (their submodules import from
    the real folder) and kept, since the modules imported through them are."""
    saved = {n: sys.modules.get(n) for n in stand_ins}
    for n in stand_ins:
        sys.modules[n] = _StandIn(n)
    for n, path in bare_packages.items():
        if n not in sys.modules:
            package = types.ModuleType(n)
            package.__path__ = [str(path)]
            sys.modules[n] = package
    try:
        yield
    finally:
        for n, module in saved.items():
            if module is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = module


def import_module(framework: str, module: str, *, stand_ins: Iterable[str] = (),
                  bare_packages: Iterable[str] = ()) -> types.ModuleType:
    """``importlib.import_module(module)`` from the framework's cache folder, with ``stand_ins`` (engine modules)
    and ``bare_packages`` (packages whose ``__init__`` imports an engine) bound only while it imports. A light
    library the module needs that is missing is a MissingFramework line naming the ``references`` extra."""
    root = require(framework)
    if module in sys.modules:
        return sys.modules[module]
    bare = {name: root.joinpath(*name.split(".")) for name in bare_packages}
    import transformers  # noqa: F401  imported before any stand-in is bound: it probes for DeepSpeed and friends
    try:
        with _bound(stand_ins, bare):
            return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "?").split(".")[0]
        raise MissingFramework(f"{PINNED[framework].label}'s {module} needs {missing}: "
                               f"pip install -e '.[references]' (or pip install {missing})") from exc


def source_file(framework: str, relative: str) -> Path:
    """A file of a framework that is read, not imported (TRL 1.12)."""
    path = require(framework) / relative
    if not path.is_file():
        raise MissingFramework(f"{PINNED[framework].label} has no {relative} in {path.parent}: reinstall it "
                               f"(remove {folder(framework)}, then `grpo-bench check references --install`)")
    return path


@functools.cache
def source_text(framework: str, relative: str) -> str:
    """The text of ``source_file(framework, relative)``, read once per process."""
    return source_file(framework, relative).read_text()
