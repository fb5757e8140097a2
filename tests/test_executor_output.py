"""Bounded capture: the attach-stream demuxer and the supervisor's trailer, fed in arbitrary pieces."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from executor.bootstrap import TRAILER_SIZE, parse_trailer
from executor.output import FRAME_HEADER, AttachDemuxer, BoundedBuffer

NONCE = "0123456789abcdef0123456789abcdef"
TRAILER = f"EC2END:{NONCE}:042\n".encode()


def frame(stream: int, payload: bytes) -> bytes:
    return FRAME_HEADER.pack(stream, len(payload)) + payload


def feed_in_pieces(demux: AttachDemuxer, data: bytes, cuts: list[int]) -> None:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    for start, end in itertools.pairwise(points):
        demux.feed(data[start:end])


frames_strategy = st.lists(st.tuples(st.sampled_from([1, 2]), st.binary(max_size=300)), max_size=20)


@given(frames=frames_strategy, cuts=st.lists(st.integers(min_value=0), max_size=30), cap=st.integers(0, 400))
def test_demux_keeps_exactly_the_first_cap_bytes_of_each_stream(
    frames: list[tuple[int, bytes]], cuts: list[int], cap: int
) -> None:
    demux = AttachDemuxer(cap, cap, nonce=NONCE)
    feed_in_pieces(demux, b"".join(frame(s, p) for s, p in frames), cuts)
    demux.finish()
    out = b"".join(p for s, p in frames if s == 1)
    err = b"".join(p for s, p in frames if s == 2)
    assert demux.stdout.text() == out[:cap].decode("utf-8", errors="replace")
    assert demux.stderr.text() == err[:cap].decode("utf-8", errors="replace")
    assert demux.stdout.truncated == (len(out) > cap)
    assert demux.stderr.truncated == (len(err) > cap)
    assert demux.exit_status is None


@given(frames=frames_strategy, cuts=st.lists(st.integers(min_value=0), max_size=30))
def test_trailer_gives_the_status_and_never_reaches_stderr(frames: list[tuple[int, bytes]], cuts: list[int]) -> None:
    demux = AttachDemuxer(10_000, 10_000, nonce=NONCE)
    stream = b"".join(frame(s, p) for s, p in frames) + frame(2, TRAILER) + frame(1, TRAILER)
    feed_in_pieces(demux, stream + frame(1, b"after the end") + frame(2, b"after"), cuts)
    assert demux.exit_status == 42
    assert demux.stdout.text() == b"".join(p for s, p in frames if s == 1).decode("utf-8", errors="replace")
    assert demux.stderr.text() == b"".join(p for s, p in frames if s == 2).decode("utf-8", errors="replace")


def test_trailer_in_the_same_frame_as_the_last_output_bytes() -> None:
    demux = AttachDemuxer(100, 100, nonce=NONCE)
    demux.feed(frame(2, b"Traceback...\n" + TRAILER))
    assert demux.exit_status is None  # stdout may still be in flight
    demux.feed(frame(1, b"partial" + TRAILER))
    assert (demux.exit_status, demux.stderr.text(), demux.stdout.text()) == (42, "Traceback...\n", "partial")


def test_a_trailer_with_another_nonce_is_ordinary_output() -> None:
    forged = f"EC2END:{'f' * 32}:000\n".encode()
    demux = AttachDemuxer(100, 100, nonce=NONCE)
    demux.feed(frame(2, forged))
    demux.finish()
    assert demux.exit_status is None
    assert demux.stderr.text() == forged.decode()


def test_trailer_is_found_even_when_stderr_is_far_over_its_cap() -> None:
    demux = AttachDemuxer(10, 10, nonce=NONCE)
    demux.feed(frame(2, b"x" * 100_000))
    demux.feed(frame(1, TRAILER) + frame(2, TRAILER))
    assert demux.exit_status == 42
    assert (demux.stderr.text(), demux.stderr.truncated) == ("x" * 10, True)


def test_parse_trailer() -> None:
    assert len(TRAILER) == TRAILER_SIZE
    assert parse_trailer(TRAILER, NONCE) == 42
    assert parse_trailer(TRAILER[:-1] + b"x", NONCE) is None
    assert parse_trailer(TRAILER.replace(b"042", b"0x2"), NONCE) is None


def test_bounded_buffer_decodes_a_cut_character_as_replacement() -> None:
    buffer = BoundedBuffer(4)
    buffer.append("aaa\u00e9".encode())  # 5 bytes: the cut falls inside the two-byte é
    assert buffer.truncated
    assert buffer.text() == "aaa\ufffd"


@given(frames=frames_strategy, cuts=st.lists(st.integers(min_value=0), max_size=30))
def test_a_follower_sees_what_is_captured_in_order_and_a_short_line_at_once(
    frames: list[tuple[int, bytes]], cuts: list[int]
) -> None:
    """What `on_output` hands a follower is exactly what the result keeps, in order; and output that cannot be the
    start of the trailer is not held back waiting for more (a short line is seen when it is printed)."""
    seen: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
    demux = AttachDemuxer(10_000, 10_000, nonce=NONCE, on_output=lambda s, d: seen[s].append(d))
    stream = b"".join(frame(s, p) for s, p in frames) + frame(2, TRAILER) + frame(1, TRAILER)
    feed_in_pieces(demux, stream, cuts)
    assert demux.exit_status == 42
    assert b"".join(seen["stdout"]).decode("utf-8", errors="replace") == demux.stdout.text()
    assert b"".join(seen["stderr"]).decode("utf-8", errors="replace") == demux.stderr.text()
    line = AttachDemuxer(100, 100, nonce=NONCE, on_output=lambda s, d: seen[s].append(d))
    seen["stdout"].clear()
    line.feed(frame(1, b"hi\n"))
    assert seen["stdout"] == [b"hi\n"]
