"""A journal of fixed-size records: what the replay memory (mesh/replay.py) and the offerers' standing
(mesh/standing.py) keep across restarts.

Records are appended with a plain `write` (no fsync: a journal survives a crash of the process, not a power cut), a
torn last record (a crash mid-write) is dropped on reading, and `rewrite` replaces the file with the live records
atomically (a new file, then rename). When to rewrite is the owner's decision: it knows which records are live.
"""

from __future__ import annotations

import os
from pathlib import Path

import structlog

log = structlog.get_logger("edgecoder.journal")


class RecordJournal:
    def __init__(self, path: Path, record_size: int, what: str) -> None:
        self.path = path
        self.record_size = record_size
        self.what = what  # names the journal in its log lines: "replay", "standing"
        self.records = 0  # records in the file since it was last rewritten
        self._fd: int | None = None

    def read(self) -> bytes:
        """The file's whole records, one after another (nothing when there is no file yet)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return b""
        return data[: len(data) - len(data) % self.record_size]

    def rewrite(self, records: bytes) -> None:
        """Replace the file with `records`, atomically, and append to it from now on."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, records)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        self.close()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND, 0o600)
        self.records = len(records) // self.record_size

    def append(self, record: bytes) -> bool:
        """Append one record; False when the write failed (logged: a full disk must not stop the node, and the
        owner's copy in memory still holds)."""
        assert self._fd is not None, "rewrite() opens the journal before the first append"
        try:
            os.write(self._fd, record)
        except OSError as exc:
            log.warning(f"{self.what} journal write failed", error=str(exc))
            return False
        self.records += 1
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
