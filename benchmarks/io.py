"""Run files: written atomically (a temporary file beside the target, fsync, rename), read forgivingly."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

from benchmarks.errors import UsageError


def atomic_write(path: Path | str, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp_path)`` then rename onto ``path``: readers see the old file or the new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _new_file_beside(path)
    try:
        write(tmp)
        # The file being replaced keeps its mode (a shared README stays readable by its readers).
        try:
            os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
        except FileNotFoundError:
            pass
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _new_file_beside(path: Path) -> Path:
    """A new empty temporary file in ``path``'s folder, created as open() creates files (0666 less the umask,
    or the folder's default ACL), not with mkstemp's 0600 that would hide a new result from its readers."""
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue


# A plot written by the tool is stored in a palette of at most this many colours: its lines, markers and text
# anti-aliased to the nearest of them (a channel off by at most about 30 of 255 on a few edge pixels), at about a
# third of the bytes of a full-colour PNG. Every regeneration of a report's plots is history the repository keeps,
# and the repository travels whole to a GPU machine in calls of limited size.
PNG_COLOURS = 256


def save_figure(figure, path: Path | str, *, dpi: int = 90, **savefig: Any) -> None:
    """Write a matplotlib ``figure`` to ``path`` as a PNG, atomically, in ``PNG_COLOURS`` colours on white."""
    from io import BytesIO

    def write(tmp: Path) -> None:
        buffer = BytesIO()
        figure.savefig(buffer, dpi=dpi, format="png", **savefig)
        buffer.seek(0)
        _palette_png(buffer, tmp)

    atomic_write(path, write)


def _palette_png(source, target: Path) -> None:
    from PIL import Image

    with Image.open(source) as image:
        rgba = image.convert("RGBA")
    flat = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    palette = flat.quantize(colors=PNG_COLOURS, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    palette.save(target, format="PNG", optimize=True)


def atomic_write_text(path: Path | str, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def atomic_write_json(path: Path | str, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: Path | str) -> Optional[dict]:
    """The parsed file, or None when it is missing, unreadable or not JSON (a half-written or corrupt file)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def append_jsonl(path: Path | str, row: dict) -> None:
    """Append one row and flush it to disk; a crash can only cut the last line short (see read_jsonl)."""
    with open(path, "a") as f:
        f.write(json.dumps(row, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: Path | str) -> list[dict]:
    """Rows of a jsonl file, ignoring a last line cut short by a crash."""
    rows = []
    path = Path(path)
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


def rewrite_jsonl(path: Path | str, rows: Iterable[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, default=str) + "\n" for r in rows))


# An evaluation's per-question record, as a metrics row and a summary keep it: per question (in the evaluation
# set's order, the same for every evaluation of a run and every run of a task's settings), how many of its
# ``samples`` were correct. What the variance components of a primary metric are estimated from
# (``grpo-bench variance``): split the questions in halves and the covariance of the halves across seeds is
# the policy's part.
QUESTIONS_CORRECT, QUESTIONS_SAMPLES = "questions/correct", "questions/samples"

# The phases of a training step that the algorithms time (``algorithms.base.PhaseTimer``), in the order tables show
# them, as run files name them: ``time/<phase>`` in a metrics row, ``phase_seconds`` in a summary.
PHASES = ("generate", "score", "logprobs", "update")
# A step's CPU seconds (the process's, every thread's), which the harness's loop records beside the phases' wall
# clocks: a metrics row's key; a summary's ``training_cpu_s`` is their sum.
CPU_TIME = "time/cpu"


def encode_correct(correct: Sequence[Sequence[bool]]) -> Optional[dict]:
    """``{QUESTIONS_CORRECT: counts, QUESTIONS_SAMPLES: k}``: the counts one digit a question when k <= 9, else
    comma-separated; None when the questions were not all asked the same number of times (nothing to average)."""
    sizes = {len(row) for row in correct}
    if len(sizes) != 1 or not correct:
        return None
    k = sizes.pop()
    counts = [sum(bool(c) for c in row) for row in correct]
    text = "".join(map(str, counts)) if k <= 9 else ",".join(map(str, counts))
    return {QUESTIONS_CORRECT: text, QUESTIONS_SAMPLES: k}


def decode_correct(text: str, samples: int) -> list[float]:
    """The fraction of its samples each question got right, from ``encode_correct``'s counts."""
    counts = [int(c) for c in (text.split(",") if samples > 9 else text)]
    if any(c < 0 or c > samples for c in counts):
        raise ValueError(f"a per-question count outside 0..{samples}")
    return [c / samples for c in counts]


@contextmanager
def locked_directory(directory: Path | str, lock_name: str, *, what: str, busy: str):
    """Create ``directory`` and hold an exclusive lock file in it for the block. A path that cannot be
    created or written, or a lock another process holds, is one UsageError line (``what`` names the
    directory's role, ``busy`` the holder), before any work."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock = open(directory / lock_name, "w")
    except OSError as exc:
        raise UsageError(f"--out {directory}: cannot create or write the {what} ({exc.strerror or exc})") from None
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"{busy} {directory}") from None
        yield
    finally:
        lock.close()


# The first line of every README.md the tool writes into a results folder: what tells its own from a person's.
README_HEADING = "# grpo-bench results"


def own_readme(path: Path | str) -> bool:
    """Whether ``path`` is absent or a README the tool wrote (its first line ``README_HEADING``)."""
    try:
        with open(path, errors="replace") as f:
            return f.readline().rstrip("\n") == README_HEADING
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False


def check_output_dir(out: Path | str, *, records: Sequence[str], ours: Sequence[str] = (), flag: str = "--out",
                     checkout: Optional[Path | str] = None) -> Path:
    """``out`` as a folder the tool may write its results into, or one UsageError line: an empty name (the current
    folder by accident), the project's ``checkout`` or any folder holding a project (a pyproject.toml or .git), a
    folder with files but none of the tool's ``records`` (the files that say the tool wrote it, as matrix.json), or
    a README.md the tool did not write (it would be replaced by the report). ``ours``: further names the tool may
    leave in a new folder (a lock file). Shared by every command that writes a results folder."""
    if not str(out).strip():
        raise UsageError(f"{flag} is empty: name a folder for the results (the current folder is never assumed)")
    path = Path(out)
    try:
        resolved = path.resolve()
        if checkout is not None and resolved == Path(checkout).resolve():
            raise UsageError(f"{flag} {out} is the project's checkout: name a folder for the results, as "
                             f"results/NAME or runs/NAME")
        for marker in ("pyproject.toml", ".git"):
            if (path / marker).exists():
                raise UsageError(f"{flag} {out} holds a project ({marker}): name a folder of its own for the results")
        names = sorted(p.name for p in path.iterdir()) if path.is_dir() else []
    except OSError as exc:
        raise UsageError(f"{flag} {out}: cannot read the folder ({exc.strerror or exc})") from None
    if names and not set(records) & set(names):
        foreign = [n for n in names if n not in ours]
        if foreign:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise UsageError(f"{flag} {out} holds files grpo-bench did not write ({shown}): name a new or empty folder")
    if not own_readme(path / "README.md"):
        raise UsageError(f"{flag} {out} holds a README.md grpo-bench did not write (its report would replace it): "
                         f"move it or name another folder")
    return path


# The errors of a write that no retry in the same place mends: a full disk or quota, a file too large, a file system
# gone read-only or failing.
WRITE_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO)


@contextmanager
def write_errors(where: Path | str, kept: Callable[[], str]):
    """Turn a write error (``WRITE_ERRORS``) in the block into one UsageError line: what failed where, and
    ``kept()``, what was kept (called after the failure)."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in WRITE_ERRORS:
            raise
        what = exc.strerror or os.strerror(exc.errno)
        raise UsageError(f"cannot write in {where}: {what}" + (f" ({exc.filename})" if exc.filename else "")
                         + f"; {kept()}") from None
