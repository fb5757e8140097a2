"""Bounded capture of a program's output: keep at most `cap` bytes per stream, drain and count the rest."""

from __future__ import annotations

import struct

from executor.bootstrap import TRAILER_SIZE, parse_trailer

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

    Only a frame header (8 bytes) and the last TRAILER_SIZE bytes of stderr are carried between feeds; payload
    beyond a cap is skipped without being stored. Those last stderr bytes are held back because they may be the
    supervisor's trailer (see executor/bootstrap.py): once they are, `exit_status` is set and the trailer never
    reaches the captured stderr.
    """

    def __init__(self, stdout_cap: int, stderr_cap: int, *, nonce: str) -> None:
        self.stdout = BoundedBuffer(stdout_cap)
        self.stderr = BoundedBuffer(stderr_cap)
        self.exit_status: int | None = None
        self._nonce = nonce
        self._held = b""  # newest stderr bytes, not yet known not to be the trailer
        self._header = b""
        self._stream = 0
        self._remaining = 0  # payload bytes still to come in the current frame

    def finish(self) -> None:
        """End of stream without a trailer: what was held back is ordinary stderr."""
        self.stderr.append(self._held)
        self._held = b""

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        while view and self.exit_status is None:
            if self._remaining:
                take = min(self._remaining, len(view))
                if self._stream == STDOUT:
                    self.stdout.append(view[:take])
                else:
                    self._hold_stderr(view[:take])
                self._remaining -= take
                view = view[take:]
                continue
            need = FRAME_HEADER.size - len(self._header)
            self._header += bytes(view[:need])
            view = view[need:]
            if len(self._header) == FRAME_HEADER.size:
                self._stream, self._remaining = FRAME_HEADER.unpack(self._header)
                self._header = b""

    def _hold_stderr(self, data: memoryview) -> None:
        # Anything not stdout (stdin echo cannot occur without a tty) counts as stderr, never dropped.
        if len(data) >= TRAILER_SIZE:
            self.stderr.append(self._held)
            self.stderr.append(data[: len(data) - TRAILER_SIZE])
            self._held = bytes(data[len(data) - TRAILER_SIZE :])
        else:
            combined = self._held + bytes(data)
            self.stderr.append(combined[: max(0, len(combined) - TRAILER_SIZE)])
            self._held = combined[-TRAILER_SIZE:]
        status = parse_trailer(self._held, self._nonce)
        if status is not None:
            self.exit_status = status
            self._held = b""
