"""Bounded capture of a program's output: keep at most `cap` bytes per stream, drain and count the rest."""

from __future__ import annotations

import struct

# Docker's attach stream without a tty: frames of [stream, 0, 0, 0, size (uint32 big-endian)] + payload.
FRAME_HEADER = struct.Struct(">BxxxI")
STDOUT, STDERR = 1, 2


class BoundedBuffer:
    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._chunks: list[bytes] = []
        self._kept = 0
        self.truncated = False

    def append(self, data: bytes | memoryview) -> None:
        room = self._cap - self._kept
        if len(data) > room:
            self.truncated = True
            data = data[:room]
        if data:
            self._chunks.append(bytes(data))
            self._kept += len(data)

    def text(self) -> str:
        # A cut may split a multi-byte character; the replacement character marks it rather than failing.
        return b"".join(self._chunks).decode("utf-8", errors="replace")


class AttachDemuxer:
    """Incremental parser of the multiplexed attach stream, in memory bounded by the two caps.

    Only a frame header (8 bytes) is ever carried over between feeds; payload bytes beyond a cap are skipped
    without being stored.
    """

    def __init__(self, stdout_cap: int, stderr_cap: int) -> None:
        self.stdout = BoundedBuffer(stdout_cap)
        self.stderr = BoundedBuffer(stderr_cap)
        self._header = b""
        self._stream = 0
        self._remaining = 0  # payload bytes still to come in the current frame

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._remaining:
                take = min(self._remaining, len(view))
                self._target().append(view[:take])
                self._remaining -= take
                view = view[take:]
                continue
            need = FRAME_HEADER.size - len(self._header)
            self._header += bytes(view[:need])
            view = view[need:]
            if len(self._header) == FRAME_HEADER.size:
                self._stream, self._remaining = FRAME_HEADER.unpack(self._header)
                self._header = b""

    def _target(self) -> BoundedBuffer:
        # stdin echo (0) cannot occur without a tty; anything unknown is counted as stderr, never dropped.
        return self.stdout if self._stream == STDOUT else self.stderr
