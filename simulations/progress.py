"""A small progress bar on stderr (tqdm is not installed here, and one line of our own is all we need)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """`with Progress("storm", total=40) as bar: bar.advance()`. Redraws at most ten times a second."""

    def __init__(self, label: str, total: int, *, stream: TextIO | None = None, width: int = 30) -> None:
        self.label = label
        self.total = max(1, total)
        self.done = 0
        self.note = ""
        self._stream = stream or sys.stderr
        self._width = width
        self._started = time.monotonic()
        self._drawn_at = 0.0

    def __enter__(self) -> Progress:
        self._draw(force=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self._draw(force=True)
        self._stream.write("\n")
        self._stream.flush()

    def advance(self, steps: int = 1, note: str | None = None) -> None:
        self.done = min(self.total, self.done + steps)
        if note is not None:
            self.note = note
        self._draw()

    def set_note(self, note: str) -> None:
        self.note = note
        self._draw()

    def _draw(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._drawn_at < 0.1 and self.done < self.total:
            return
        self._drawn_at = now
        filled = int(self._width * self.done / self.total)
        bar = "#" * filled + "-" * (self._width - filled)
        line = f"\r{self.label:<12} [{bar}] {self.done}/{self.total} {now - self._started:5.1f}s {self.note[:40]:<40}"
        self._stream.write(line)
        self._stream.flush()
