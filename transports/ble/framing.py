"""Chunk framing for messages larger than one ATT packet.

A message travels as a *stream*: the message bytes followed by a 16-byte BLAKE2b digest of them. The stream is cut
into frames that each fit one ATT packet:

    frame 0:  seq (u16, big-endian) = 0 | message number (u8) | total message length (u32) | stream bytes...
    frame n:  seq (u16) = n             | stream bytes...

Messages on one stream (one characteristic, one direction, one link) are numbered 0, 1, 2... (mod 256), so that a
repeated single-frame message is caught like any repeated chunk.

Why this shape: the header of frame 0 is 7 bytes, so a 20-byte packet (the only size guaranteed before an MTU
exchange) still carries data. Sequence numbers catch a missing, duplicated or reordered chunk at the chunk where it
happens; the declared length is checked against the cap before anything is buffered; the trailing digest catches a
corrupted byte anywhere. The digest is for integrity of the transfer only: authenticity comes from the signature
inside the offer or result, which the node checks separately.
"""

from __future__ import annotations

import hashlib
import struct

from transports.ble.reasons import BleFault, BleReason

DIGEST_SIZE = 16
SEQ = struct.Struct(">H")
START = struct.Struct(">BI")  # message number, total length
FIRST_HEADER_SIZE = SEQ.size + START.size
MIN_FRAME_SIZE = FIRST_HEADER_SIZE + 1
MAX_FRAMES = 1 << 16
# The attribute value limit: no single ATT value may exceed 512 bytes, whatever the MTU.
MAX_ATTRIBUTE_SIZE = 512
# Before an MTU exchange the ATT_MTU is 23: 20 bytes of value in a notification or a write.
DEFAULT_ATT_MTU = 23


def message_digest(message: bytes) -> bytes:
    # Personalised so that this digest can never be confused with a digest of the same bytes made for another purpose.
    return hashlib.blake2b(message, digest_size=DIGEST_SIZE, person=b"edgecoder-ble").digest()


def notify_frame_size(att_mtu: int) -> int:
    """Largest frame a notification or a write request carries at this ATT_MTU (3 bytes of ATT header)."""
    return max(MIN_FRAME_SIZE, min(att_mtu - 3, MAX_ATTRIBUTE_SIZE))


def encode_frames(message: bytes, frame_size: int, number: int = 0) -> list[bytes]:
    """Cut `message`, the `number`th on its stream, into frames of at most `frame_size` bytes each."""
    if not MIN_FRAME_SIZE <= frame_size <= MAX_ATTRIBUTE_SIZE:
        raise ValueError(f"frame size {frame_size} outside [{MIN_FRAME_SIZE}, {MAX_ATTRIBUTE_SIZE}]")
    if len(message) >= 1 << 32:
        raise ValueError("message too long to frame")
    stream = message + message_digest(message)
    first_room = frame_size - FIRST_HEADER_SIZE
    room = frame_size - SEQ.size
    frames = [SEQ.pack(0) + START.pack(number % 256, len(message)) + stream[:first_room]]
    offset = first_room
    while offset < len(stream):
        if len(frames) >= MAX_FRAMES:
            raise ValueError("message needs more than 65536 frames at this frame size")
        frames.append(SEQ.pack(len(frames)) + stream[offset : offset + room])
        offset += room
    return frames


class Reassembler:
    """Rebuilds one message at a time from frames, in memory bounded by `max_message` plus one digest.

    `feed` returns the message when its last frame arrives and None before that; any inconsistency raises `BleFault`.
    After a message completes (or fails) the next frame must start a new message with seq 0.
    """

    def __init__(self, max_message: int) -> None:
        self.max_message = max_message
        self._buffer = bytearray()
        self._expected_seq = 0
        self._stream_len = 0
        self._next_number = 0

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    @property
    def in_progress(self) -> bool:
        return self._expected_seq != 0

    def reset(self) -> None:
        self._buffer = bytearray()
        self._expected_seq = 0
        self._stream_len = 0

    def feed(self, frame: bytes) -> bytes | None:
        try:
            return self._feed(frame)
        except BleFault:
            self.reset()
            raise

    def _feed(self, frame: bytes) -> bytes | None:
        if len(frame) < SEQ.size + 1:
            raise BleFault(BleReason.MALFORMED_FRAME, f"frame of {len(frame)} bytes")
        (seq,) = SEQ.unpack_from(frame)
        if seq != self._expected_seq:
            code = BleReason.DUPLICATE_CHUNK if seq < self._expected_seq else BleReason.OUT_OF_ORDER
            raise BleFault(code, f"expected chunk {self._expected_seq}, got {seq}")
        if seq == 0:
            if len(frame) < MIN_FRAME_SIZE:
                raise BleFault(BleReason.MALFORMED_FRAME, "first frame shorter than its header")
            number, total = START.unpack_from(frame, SEQ.size)
            if number != self._next_number:
                code = BleReason.DUPLICATE_CHUNK if number == (self._next_number - 1) % 256 else BleReason.OUT_OF_ORDER
                raise BleFault(code, f"expected message {self._next_number}, got {number}")
            if total > self.max_message:
                raise BleFault(BleReason.TOO_LARGE, f"declared {total} bytes, cap {self.max_message}")
            self._stream_len = total + DIGEST_SIZE
            data = frame[FIRST_HEADER_SIZE:]
        else:
            data = frame[SEQ.size :]
        if len(self._buffer) + len(data) > self._stream_len:
            raise BleFault(BleReason.OVERRUN, f"more than the declared {self._stream_len - DIGEST_SIZE} bytes")
        self._buffer += data
        if len(self._buffer) < self._stream_len:
            if seq + 1 == MAX_FRAMES:
                raise BleFault(BleReason.MALFORMED_FRAME, "sequence number space exhausted")
            self._expected_seq = seq + 1
            return None
        message, digest = bytes(self._buffer[:-DIGEST_SIZE]), bytes(self._buffer[-DIGEST_SIZE:])
        self.reset()
        self._next_number = (self._next_number + 1) % 256
        if message_digest(message) != digest:
            raise BleFault(BleReason.DIGEST_MISMATCH, f"{len(message)}-byte message")
        return message
