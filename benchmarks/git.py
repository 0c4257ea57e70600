"""The project's git history, read in one place: a revision resolved to its commit, and git's own output or one
UsageError line. ``replay`` (benchmarks/matrix/), the matrix's record of the code it ran and the report's flags read
revisions; they stand side by side and none imports another, so the helper sits here, at the bottom."""

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


# What a cell runs: the code folders and the dependencies. The results and docs are data that a matrix (or its
# report) writes into the same checkout while it runs; a change to them must not read as other code.
CODE_PATHS = ("algorithms", "tasks", "benchmarks", "pyproject.toml")


def code_state(root) -> dict | None:
    """The code a checkout at ``root`` runs: ``commit`` (HEAD), ``dirty`` (tracked changes to ``CODE_PATHS`` or
    untracked files in them) and ``diff_hash``, the sha256 of ``git diff HEAD --binary`` over them followed by each
    untracked file's path and bytes ("" when clean). None when ``root`` is not a git checkout (an installed package):
    no commit to check out."""
    import hashlib
    import os

    if not os.path.exists(os.path.join(str(root), ".git")):
        return None
    try:
        commit = git(root, "rev-parse", "HEAD").decode().strip()
        diff = git(root, "diff", "HEAD", "--binary", "--", *CODE_PATHS)
        untracked = git(root, "ls-files", "--others", "--exclude-standard", "-z", "--", *CODE_PATHS).split(b"\0")
    except UsageError:
        return None
    untracked = sorted(path for path in untracked if path)
    if not diff and not untracked:
        return {"commit": commit, "dirty": False, "diff_hash": ""}
    digest = hashlib.sha256(diff)
    for path in untracked:
        digest.update(b"\0" + path + b"\0")
        try:
            with open(os.path.join(os.fsencode(str(root)), path), "rb") as f:
                digest.update(f.read())
        except OSError:  # gone since git listed it: its path still marks the tree dirty
            pass
    return {"commit": commit, "dirty": True, "diff_hash": digest.hexdigest()}
