"""Bounded capture of a program's output: keep at most `cap` bytes per stream, drain and count the rest."""

from __future__ import annotations

import struct
from collections.abc import Callable

from executor.bootstrap import TRAILER_SIZE, TRAILER_TAG, parse_trailer

# Docker's attach stream without a tty: frames of [stream, 0, 0, 0, size (uint32 big-endian)] + payload.
FRAME_HEADER = struct.Struct(">BxxxI")
STDOUT, STDERR = 1, 2


class BoundedBuffer:
    def __init__(self, cap: int, on_kept: Callable[[bytes], None] | None = None) -> None:
        self._cap = cap
        self._chunks: list[bytes] = []
        self._kept = 0
        self.truncated = False
        # Told of each piece kept, in order: a follower sees exactly what the result will hold, within the cap.
        self._on_kept = on_kept

    def append(self, data: bytes | memoryview) -> None:
        room = self._cap - self._kept
        if len(data) > room:
            self.truncated = True
            data = data[:room]
        if data:
            piece = bytes(data)
            self._chunks.append(piece)
            self._kept += len(data)
            if self._on_kept is not None:
                self._on_kept(piece)

    def text(self) -> str:
        # A cut may split a multi-byte character; the replacement character marks it rather than failing.
        return b"".join(self._chunks).decode("utf-8", errors="replace")


class _TrailedStream:
    """One output stream whose newest TRAILER_SIZE bytes are held back: they may be the supervisor's trailer."""

    def __init__(self, cap: int, nonce: str, on_kept: Callable[[bytes], None] | None = None) -> None:
        self.buffer = BoundedBuffer(cap, on_kept)
        self.status: int | None = None
        self._nonce = nonce
        self._held = b""
        # What the trailer starts with: held bytes that cannot begin it are output, released at once (a follower
        # sees a short line when it is printed, not when the next one comes).
        self._prefix = TRAILER_TAG + nonce.encode("ascii") + b":"

    def append(self, data: memoryview) -> None:
        if self.status is not None:
            return  # a leftover child writing after the program ended: not the program's output
        if len(data) >= TRAILER_SIZE:
            self.buffer.append(self._held)
            self.buffer.append(data[: len(data) - TRAILER_SIZE])
            self._held = bytes(data[len(data) - TRAILER_SIZE :])
        else:
            combined = self._held + bytes(data)
            self.buffer.append(combined[: max(0, len(combined) - TRAILER_SIZE)])
            self._held = combined[-TRAILER_SIZE:]
        status = parse_trailer(self._held, self._nonce)
        if status is not None:
            self.status = status
            self._held = b""
            return
        self._release_what_cannot_be_the_trailer()

    def _release_what_cannot_be_the_trailer(self) -> None:
        held, prefix = self._held, self._prefix
        start = next((i for i in range(len(held)) if held[i : i + len(prefix)] == prefix[: len(held) - i]), len(held))
        if start:
            self.buffer.append(held[:start])
            self._held = held[start:]

    def finish(self) -> None:
        self.buffer.append(self._held)
        self._held = b""


class AttachDemuxer:
    """Incremental parser of the multiplexed attach stream, in memory bounded by the two caps.

    Only a frame header (8 bytes) and the newest TRAILER_SIZE bytes of each stream are carried between feeds;
    payload beyond a cap is skipped without being stored. The supervisor (executor/bootstrap.py) ends BOTH
    streams with its trailer: Docker copies stdout and stderr independently, so only a trailer on each proves
    that each has delivered everything the program wrote. `exit_status` is set once both have arrived; the
    trailers never reach the captured output.
    """

    def __init__(
        self, stdout_cap: int, stderr_cap: int, *, nonce: str, on_output: Callable[[str, bytes], None] | None = None
    ) -> None:
        out = None if on_output is None else (lambda piece: on_output("stdout", piece))
        err = None if on_output is None else (lambda piece: on_output("stderr", piece))
        self._out = _TrailedStream(stdout_cap, nonce, out)
        self._err = _TrailedStream(stderr_cap, nonce, err)
        self.stdout = self._out.buffer
        self.stderr = self._err.buffer
        self._header = b""
        self._stream = 0
        self._remaining = 0  # payload bytes still to come in the current frame

    @property
    def exit_status(self) -> int | None:
        if self._out.status is None or self._err.status is None:
            return None
        return self._err.status

    def finish(self) -> None:
        """End of stream without both trailers: whatever was held back is ordinary output."""
        self._out.finish()
        self._err.finish()

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        while view and self.exit_status is None:
            if self._remaining:
                take = min(self._remaining, len(view))
                # Anything not stdout (stdin echo cannot occur without a tty) counts as stderr, never dropped.
                (self._out if self._stream == STDOUT else self._err).append(view[:take])
                self._remaining -= take
                view = view[take:]
                continue
            need = FRAME_HEADER.size - len(self._header)
            self._header += bytes(view[:need])
            view = view[need:]
            if len(self._header) == FRAME_HEADER.size:
                self._stream, self._remaining = FRAME_HEADER.unpack(self._header)
                self._header = b""
