"""Progress for long work: a tqdm bar on a terminal; in a file (a cell's log.txt, ``nohup ... > log``) a plain
line every so often and at the end, because a bar's carriage-return frames fill a log with thousands of
redraws that nobody reads (they were most of a committed matrix's log.txt bytes)."""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

from tqdm.auto import tqdm


class LineProgress:
    """tqdm's ``update`` / ``set_postfix`` / ``close`` as plain lines: at most one every ``every_s`` seconds."""

    def __init__(self, total: int, *, desc: str, initial: int = 0, unit: str = "it", every_s: float = 30.0,
                 file: Optional[TextIO] = None):
        self.total, self.n, self.desc, self.unit, self.every_s = total, initial, desc, unit, every_s
        self.file = file or sys.stderr
        self.postfix: dict = {}
        self.started = self.last = time.perf_counter()
        self.initial = initial
        self.closed = False

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.perf_counter() - self.last >= self.every_s:
            self._line()

    def set_postfix(self, values: dict) -> None:
        self.postfix = dict(values)

    def close(self) -> None:
        if not self.closed and self.n > self.initial:
            self._line()
        self.closed = True

    def _line(self) -> None:
        now = time.perf_counter()
        self.last = now
        rate = (self.n - self.initial) / max(now - self.started, 1e-9)
        extra = "".join(f", {k} {v}" for k, v in self.postfix.items())
        print(f"{self.desc}: {self.n}/{self.total} {self.unit}s, {now - self.started:.0f} s, {rate:.2f} {self.unit}/s{extra}",
              file=self.file, flush=True)


def progress(total: int, *, desc: str, initial: int = 0, unit: str = "it", enabled: bool = True,
             file: Optional[TextIO] = None, every_s: float = 30.0):
    """A bar on a terminal, plain lines elsewhere, nothing when ``enabled`` is False."""
    file = file or sys.stderr
    if enabled and getattr(file, "isatty", lambda: False)():
        return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=file, dynamic_ncols=True)
    return LineProgress(total, desc=desc, initial=initial, unit=unit, every_s=every_s if enabled else float("inf"),
                        file=file) if enabled else tqdm(total=total, disable=True)
