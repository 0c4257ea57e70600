"""The project's git history, read in one place: a revision resolved to its commit, and git's own output or one
UsageError line. ``bench revisions`` (benchmarks/perf/) and ``check shape`` (benchmarks/checks/) both read revisions;
they stand side by side and neither imports the other, so the helper sits here, at the bottom."""

from __future__ import annotations

import subprocess

from benchmarks.errors import UsageError


def git(repo: str, *args: str) -> bytes:
    """The output of ``git -C repo ARGS``; a failure is one UsageError line with git's last line of complaint."""
    result = subprocess.run(["git", "-C", str(repo), *args], capture_output=True)
    if result.returncode:
        said = result.stderr.decode(errors="replace").strip().splitlines()
        raise UsageError(f"git {' '.join(args)}: {said[-1] if said else 'failed'}")
    return result.stdout


def resolve(repo: str, revision: str) -> dict:
    """A revision's full commit id and subject line; an unknown one (or a ``repo`` that is no git checkout) is one
    UsageError line."""
    found = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"],
                           capture_output=True, text=True)
    if found.returncode:
        raise UsageError(f"unknown revision {revision!r} in {repo} (a commit, tag or branch of its git history)")
    commit = found.stdout.strip()
    subject = git(repo, "log", "-1", "--format=%s", commit).decode().strip()
    return {"revision": revision, "commit": commit, "subject": subject}
