"""Regenerated sections of README files: text between ``<!-- grpo-bench:NAME -->`` and
``<!-- /grpo-bench:NAME -->`` belongs to the tool and is replaced whole; nothing else is touched.
"""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.io import atomic_write_text


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- grpo-bench:{name} -->", f"<!-- /grpo-bench:{name} -->"


def update_section(path: Path | str, name: str, body: str) -> None:
    """Replace section ``name`` of ``path`` with ``body`` (appending the section if it is new)."""
    path = Path(path)
    text = path.read_text() if path.exists() else ""
    start, end = _markers(name)
    block = f"{start}\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    text = pattern.sub(lambda _: block, text, count=1) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    atomic_write_text(path, text)


def read_section(path: Path | str, name: str) -> str | None:
    start, end = _markers(name)
    match = re.search(re.escape(start) + r"\n(.*?)\n" + re.escape(end), Path(path).read_text(), re.DOTALL)
    return match.group(1) if match else None
