"""The README's set-up commands (the main job, the tests, the integration tests), read from its first ```bash block.

CI runs exactly these (the main job into a scratch directory instead of runs/demo, optionally on another
matrix file), and tests/test_readme.py checks the README still has them, so the two cannot drift apart.
Usage: python3 .ci/readme_commands.py main|tests|integrations [--out DIR] [--matrix FILE]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
DEFAULT_MATRIX = "benchmarks/matrices/default.toml"
DEFAULT_OUT = "runs/demo"


def commands(readme: Path = README) -> dict[str, str]:
    """{'main': ..., 'tests': ..., 'integrations': ...}: the command under the comment naming each, in the first
    bash block."""
    block = re.search(r"```bash\n(.*?)```", readme.read_text(), re.DOTALL)
    if not block:
        raise SystemExit(f"{readme}: no ```bash block with the set-up commands")
    found, label = {}, None
    for line in block.group(1).splitlines():
        if line.startswith("#"):
            label = ("main" if "main job" in line else "integrations" if "integration" in line
                     else "tests" if "tests" in line else None)
        elif line.strip() and label and label not in found:
            found[label] = line.strip()
    missing = {"main", "tests", "integrations"} - set(found)
    if missing:
        raise SystemExit(f"{readme}: no command under a '# the main job' / '# the tests' / '# the integration tests' "
                         f"comment: {sorted(missing)}")
    return found


def main(argv: list[str]) -> int:
    which = argv[0]
    command = commands()[which]
    if which == "main" and ("--out" in argv or "--matrix" in argv):
        if DEFAULT_MATRIX not in command or DEFAULT_OUT not in command:
            raise SystemExit(f"the main job no longer names {DEFAULT_MATRIX} and {DEFAULT_OUT}: {command}")
        if "--out" in argv:
            command = command.replace(DEFAULT_OUT, argv[argv.index("--out") + 1])
        if "--matrix" in argv:
            command = command.replace(DEFAULT_MATRIX, argv[argv.index("--matrix") + 1])
    print(command)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
