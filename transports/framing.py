"""Length-prefixed frames on a libp2p stream: a 4-byte big-endian length, then that many bytes.

The length is checked against the caller's cap before a single payload byte is read, so an announced 4 GiB frame
costs us four bytes of reading, not an allocation. A fixed 4-byte prefix (not a varint) keeps that check trivial and
the prefix itself bounded.
"""

from __future__ import annotations

import enum
import struct
from typing import Any

import trio
from libp2p.io.exceptions import IOException

from transports.wire.codec import pack
from transports.wire.reasons import Reason

LENGTH = struct.Struct(">I")


class FrameFault(enum.StrEnum):
    TOO_LARGE = Reason.TOO_LARGE
    TIMEOUT = Reason.TIMEOUT
    CLOSED = Reason.CLOSED


class FrameError(Exception):
    def __init__(self, reason: FrameFault, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else str(reason))
        self.reason = reason
        self.detail = detail


async def _read_exactly(stream: Any, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = await stream.read(n - len(buf))
        except IOException as exc:  # StreamEOF, StreamReset, StreamError: the peer went away either way
            raise FrameError(
                FrameFault.CLOSED, f"stream ended after {len(buf)} of {n} bytes ({type(exc).__name__})"
            ) from None
        if not chunk:
            raise FrameError(FrameFault.CLOSED, f"stream ended after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


async def read_frame(stream: Any, *, max_len: int, timeout: float) -> bytes:
    """One whole frame within `timeout` seconds (the whole frame, so a trickling peer cannot hold us forever)."""
    try:
        with trio.fail_after(timeout):
            header = await _read_exactly(stream, LENGTH.size)
            (length,) = LENGTH.unpack(header)
            if length > max_len:
                raise FrameError(FrameFault.TOO_LARGE, f"announced {length} bytes > cap {max_len}")
            return await _read_exactly(stream, length)
    except trio.TooSlowError:
        raise FrameError(FrameFault.TIMEOUT, f"no whole frame within {timeout:g} s") from None


async def write_frame(stream: Any, data: bytes) -> None:
    if len(data) >= 1 << 32:
        raise ValueError("frame too long for a 4-byte length")
    await stream.write(LENGTH.pack(len(data)) + data)


async def write_message(stream: Any, message: dict[str, Any]) -> None:
    """A small control message: a canonical msgpack map in one frame."""
    await write_frame(stream, pack(message))
