"""Property tests for the BLE chunk framing: round trip at every MTU, and every kind of damage detected."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transports.ble.framing import (
    DEFAULT_ATT_MTU,
    MAX_ATTRIBUTE_SIZE,
    Reassembler,
    encode_frames,
    notify_frame_size,
)
from transports.ble.reasons import BleFault, BleReason

CAP = 256 * 1024
mtus = st.integers(min_value=DEFAULT_ATT_MTU, max_value=MAX_ATTRIBUTE_SIZE + 3 + 10)
messages = st.binary(min_size=0, max_size=3000)


def reassemble(frames: list[bytes], cap: int = CAP) -> list[bytes]:
    """Every message the receiver would accept from these frames (raises BleFault on detected damage)."""
    receiver = Reassembler(cap)
    done = []
    for frame in frames:
        message = receiver.feed(frame)
        if message is not None:
            done.append(message)
    return done


def accepted_or_fault(frames: list[bytes]) -> list[bytes] | BleFault:
    try:
        return reassemble(frames)
    except BleFault as fault:
        return fault


@given(messages, mtus)
def test_round_trip_at_every_mtu(message: bytes, mtu: int) -> None:
    size = notify_frame_size(mtu)
    frames = encode_frames(message, size)
    assert all(len(f) <= size <= MAX_ATTRIBUTE_SIZE for f in frames)
    assert all(len(f) <= mtu - 3 for f in frames)
    assert reassemble(frames) == [message]


def test_default_mtu_frames_fit_twenty_bytes() -> None:
    assert notify_frame_size(DEFAULT_ATT_MTU) == 20
    frames = encode_frames(b"x" * 1000, 20)
    assert max(map(len, frames)) == 20
    assert reassemble(frames) == [b"x" * 1000]


def test_messages_follow_each_other_on_one_stream() -> None:
    frames = encode_frames(b"first", 20, 0) + encode_frames(b"second" * 10, 20, 1)
    assert reassemble(frames) == [b"first", b"second" * 10]


def test_a_repeated_whole_message_is_a_duplicate() -> None:
    with pytest.raises(BleFault) as info:
        reassemble(encode_frames(b"once", 64, 0) * 2)
    assert info.value.code == BleReason.DUPLICATE_CHUNK


def test_a_skipped_message_number_is_out_of_order() -> None:
    with pytest.raises(BleFault) as info:
        reassemble(encode_frames(b"one", 64, 0) + encode_frames(b"three", 64, 2))
    assert info.value.code == BleReason.OUT_OF_ORDER


# Damage: whatever happens to the frames, the receiver never accepts anything but the original message. It either
# raises a typed fault, or (a lost or lengthened tail) is left waiting, which the session's idle timeout ends.
damage_settings = settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])


def never_wrong(message: bytes, frames: list[bytes]) -> BleFault | None:
    result = accepted_or_fault(frames)
    if isinstance(result, BleFault):
        return result
    assert result in ([], [message]), "damaged frames reassembled into a different message"
    return None


@damage_settings
@given(st.binary(min_size=1, max_size=2000), mtus, st.data())
def test_dropped_chunk_is_detected(message: bytes, mtu: int, data: st.DataObject) -> None:
    frames = encode_frames(message, notify_frame_size(mtu))
    i = data.draw(st.integers(0, len(frames) - 1))
    damaged = frames[:i] + frames[i + 1 :]
    fault = never_wrong(message, damaged)
    assert accepted_or_fault(damaged) != [message]
    if fault is not None:
        assert fault.code in (BleReason.OUT_OF_ORDER, BleReason.DUPLICATE_CHUNK, BleReason.MALFORMED_FRAME)


@damage_settings
@given(st.binary(min_size=1, max_size=2000), mtus, st.data())
def test_duplicated_chunk_is_detected(message: bytes, mtu: int, data: st.DataObject) -> None:
    frames = encode_frames(message, notify_frame_size(mtu))
    i = data.draw(st.integers(0, len(frames) - 1))
    damaged = [*frames[: i + 1], frames[i], *frames[i + 1 :]]
    result = accepted_or_fault(damaged)
    if i == len(frames) - 1 and i > 0:
        # The message was already complete; its duplicate last frame then fails to start a new message.
        assert isinstance(result, BleFault) and result.code == BleReason.OUT_OF_ORDER
    else:
        assert isinstance(result, BleFault) and result.code == BleReason.DUPLICATE_CHUNK


@damage_settings
@given(st.binary(min_size=200, max_size=2000), mtus, st.data())
def test_reordered_chunks_are_detected(message: bytes, mtu: int, data: st.DataObject) -> None:
    frames = encode_frames(message, notify_frame_size(mtu))
    if len(frames) < 2:
        return
    i = data.draw(st.integers(0, len(frames) - 2))
    j = data.draw(st.integers(i + 1, len(frames) - 1))
    damaged = list(frames)
    damaged[i], damaged[j] = damaged[j], damaged[i]
    result = accepted_or_fault(damaged)
    assert isinstance(result, BleFault) and result.code == BleReason.OUT_OF_ORDER


@damage_settings
@given(st.binary(min_size=1, max_size=2000), mtus, st.data())
def test_any_corrupted_byte_is_detected(message: bytes, mtu: int, data: st.DataObject) -> None:
    frames = encode_frames(message, notify_frame_size(mtu))
    i = data.draw(st.integers(0, len(frames) - 1))
    pos = data.draw(st.integers(0, len(frames[i]) - 1))
    flip = data.draw(st.integers(1, 255))
    frame = bytearray(frames[i])
    frame[pos] ^= flip
    damaged = [*frames[:i], bytes(frame), *frames[i + 1 :]]
    assert accepted_or_fault(damaged) != [message]
    never_wrong(message, damaged)


def test_payload_corruption_is_a_digest_mismatch() -> None:
    frames = encode_frames(b"a" * 500, 64)
    frames[3] = frames[3][:10] + bytes([frames[3][10] ^ 1]) + frames[3][11:]
    with pytest.raises(BleFault) as info:
        reassemble(frames)
    assert info.value.code == BleReason.DIGEST_MISMATCH


def test_declared_length_over_the_cap_is_refused_at_the_first_frame() -> None:
    frames = encode_frames(b"z" * 5000, 244)
    receiver = Reassembler(max_message=4096)
    with pytest.raises(BleFault) as info:
        receiver.feed(frames[0])
    assert info.value.code == BleReason.TOO_LARGE
    assert info.value.to_rejection().reason == "too_large"


def test_more_bytes_than_declared_is_an_overrun() -> None:
    extra = encode_frames(b"q" * 100, 20)
    extra[-1] = extra[-1] + b"tail"
    with pytest.raises(BleFault) as info:
        reassemble(extra)
    assert info.value.code == BleReason.OVERRUN


@pytest.mark.parametrize("frame", [b"", b"\x00", b"\x00\x00\x00\x00\x00\x00"])
def test_short_frames_are_malformed(frame: bytes) -> None:
    with pytest.raises(BleFault) as info:
        Reassembler(CAP).feed(frame)
    assert info.value.code == BleReason.MALFORMED_FRAME


def test_receiver_recovers_after_a_fault() -> None:
    receiver = Reassembler(CAP)
    with pytest.raises(BleFault):
        receiver.feed(encode_frames(b"x" * 100, 20)[1])
    assert reassemble(encode_frames(b"ok", 20)) == [b"ok"]
    for frame in encode_frames(b"again", 20):
        result = receiver.feed(frame)
    assert result == b"again"


def test_frame_size_bounds() -> None:
    with pytest.raises(ValueError):
        encode_frames(b"x", 7)
    with pytest.raises(ValueError):
        encode_frames(b"x", 513)
    assert notify_frame_size(517) == 512
    assert notify_frame_size(1000) == 512
