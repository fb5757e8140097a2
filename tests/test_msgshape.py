"""The msgpack shape walk: it passes every value we could send, refuses bombs in microseconds, and whatever it passes
decodes in memory linear in the input."""

from __future__ import annotations

import tracemalloc

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transports.wire.codec import MAX_WIRE_DEPTH, unpack_strict
from transports.wire.msgshape import check_shape
from transports.wire.reasons import Reason, Rejected

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=300)
    | st.binary(max_size=300),
    lambda c: st.lists(c, max_size=20) | st.dictionaries(st.text(max_size=10), c, max_size=20),
    max_leaves=60,
)


@given(values)
def test_every_value_we_could_send_passes(value: object) -> None:
    check_shape(msgpack.packb(value, use_bin_type=True), max_depth=MAX_WIRE_DEPTH)


@settings(max_examples=500)
@given(st.binary(max_size=2000))
def test_any_bytes_pass_or_are_malformed_and_what_passes_decodes_as_msgpack_says(data: bytes) -> None:
    try:
        check_shape(data, max_depth=MAX_WIRE_DEPTH)
    except Rejected as exc:
        assert exc.reason == Reason.MALFORMED
        return
    try:
        msgpack.unpackb(data, raw=False, strict_map_key=False, max_ext_len=0)
    except (ValueError, TypeError, msgpack.ExtraData):
        pass  # bad UTF-8 or unhashable keys: msgpack's own typed refusal, not a shape the walk should have caught


def nested(header: bytes, levels: int) -> bytes:
    return header * levels


@pytest.mark.parametrize(
    "bomb",
    [
        nested(b"\xdd\x00\x02\x00\x00", 1000),  # array32 of 131,072, nested: was 46 ms and 80 MB
        nested(b"\xdf\x00\x01\x00\x00", 1000),  # map32 of 65,536 pairs, nested
        nested(b"\x91", 5000),  # 5,000 levels of one-element arrays
        b"\xdd\xff\xff\xff\xff",  # one array declaring four billion elements
        b"\xdb\xff\xff\xff\xff" + b"x" * 10,  # a string declaring 4 GiB
    ],
)
def test_bombs_are_refused_without_allocating(bomb: bytes) -> None:
    """Refused by the shape walk before msgpack builds anything: a few kilobytes where msgpack alone took 80 MB (and
    46 ms of CPU; what the walk costs in time is a benchmark's figure, not a test's)."""
    tracemalloc.start()
    with pytest.raises(Rejected):
        unpack_strict(bomb, max_size=256 * 1024)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 64 * 1024, peak  # a few kilobytes, not megabytes


@settings(max_examples=200)
@given(st.lists(st.tuples(st.sampled_from([0x91, 0x92, 0x9F, 0x81]), st.integers(0, 3)), max_size=60))
def test_what_passes_decodes_in_memory_linear_in_the_input(headers: list[tuple[int, int]]) -> None:
    data = bytes(h for h, _ in headers) + b"\x00" * sum(n for _, n in headers)
    try:
        check_shape(data, max_depth=MAX_WIRE_DEPTH)
    except Rejected:
        return
    tracemalloc.start()
    try:
        msgpack.unpackb(data, strict_map_key=False)
    except Exception:
        pass
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak <= 200 * len(data) + 4096
