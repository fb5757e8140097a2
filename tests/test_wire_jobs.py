"""The job messages' codec (transports/wire/jobs.py): round trips, forgeries and garbage give typed rejections."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transports.wire.codec import Domain, pack, seal
from transports.wire.identity import NodeIdentity
from transports.wire.jobs import (
    MAX_CHUNK_BYTES,
    JobCancel,
    JobProgress,
    OutputChunk,
    StreamDigest,
    open_cancel,
    open_progress,
)
from transports.wire.reasons import Reason, Rejected

OFFERER = NodeIdentity(bytes(range(32)))
MALLORY = NodeIdentity(bytes(range(1, 33)))
RUNNER = NodeIdentity(bytes(range(2, 34)))
ids = st.binary(min_size=16, max_size=16)


def reason(parse: object, raw: bytes, **kw: object) -> Reason:
    with pytest.raises(Rejected) as info:
        parse(raw, **kw)  # type: ignore[operator]
    return info.value.reason


@given(ids, st.integers(0, 2**63 - 1))
def test_cancel_round_trip(offer_id: bytes, at: int) -> None:
    cancel = JobCancel.create(OFFERER, offer_id, issued_at_ms=at)
    assert open_cancel(cancel.sign(OFFERER)) == cancel


def test_a_cancel_naming_the_offerer_but_signed_by_another_key_is_refused() -> None:
    forged = seal(Domain.CANCEL, JobCancel.create(OFFERER, b"\x01" * 16).to_wire_fields(), MALLORY)
    assert reason(open_cancel, forged) == Reason.BAD_SIGNATURE
    with pytest.raises(ValueError):
        JobCancel.create(OFFERER, b"\x01" * 16).sign(MALLORY)


def test_a_cancel_signature_never_passes_for_another_message() -> None:
    """The domain separates them: an offer's or a progress's signature over the same fields verifies nothing here."""
    fields = JobCancel.create(OFFERER, b"\x01" * 16).to_wire_fields()
    assert reason(open_cancel, seal(Domain.OFFER, fields, OFFERER)) == Reason.BAD_SIGNATURE


@given(ids, st.integers(1, 16), st.sampled_from(["queued", "running"]), st.none() | st.integers(1, 1000))
def test_progress_round_trip(offer_id: bytes, attempt: int, state: str, position: int | None) -> None:
    progress = JobProgress(offer_id, RUNNER.public_key, attempt, state, position, 7)
    assert open_progress(progress.sign(RUNNER), expect_executor=RUNNER.public_key) == progress


def test_progress_from_another_runner_or_in_an_unknown_state_is_refused() -> None:
    raw = JobProgress(b"\x01" * 16, RUNNER.public_key, 1, "running").sign(RUNNER)
    assert reason(open_progress, raw, expect_executor=MALLORY.public_key) == Reason.WRONG_EXECUTOR
    fields = {**JobProgress(b"\x01" * 16, RUNNER.public_key, 1, "running").to_wire_fields(), "state": "succeeded"}
    assert reason(open_progress, seal(Domain.PROGRESS, fields, RUNNER)) == Reason.MALFORMED
    fields = {**fields, "state": "queued", "version": 2}
    assert reason(open_progress, seal(Domain.PROGRESS, fields, RUNNER)) == Reason.UNSUPPORTED_VERSION


@settings(deadline=None)  # the shared machine stalls an example now and then
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_only_ever_give_a_typed_rejection(raw: bytes) -> None:
    with pytest.raises(Rejected):
        open_cancel(raw)
    with pytest.raises(Rejected):
        open_progress(raw)


@pytest.mark.parametrize(
    "value",
    [
        [1, 2],
        {"type": "output", "seq": 0, "stream": "stdin", "data": b""},
        {"type": "output", "seq": -1, "stream": "stdout", "data": b""},
        {"type": "output", "seq": 0, "stream": "stdout", "data": "text"},
        {"type": "output", "seq": 0, "stream": "stdout", "data": b"x" * (MAX_CHUNK_BYTES + 1)},
        {"type": "result", "seq": 0, "stream": "stdout", "data": b""},
        {"type": "output", "seq": 0, "stream": "stdout", "data": b"", "more": 1},
    ],
)
def test_bad_chunks_are_malformed(value: object) -> None:
    with pytest.raises(Rejected) as info:
        OutputChunk.from_wire(value)
    assert info.value.reason == Reason.MALFORMED


@given(st.lists(st.tuples(st.sampled_from(["stdout", "stderr"]), st.binary(max_size=64)), max_size=8), st.data())
def test_the_digest_tells_whether_the_follower_saw_what_was_sent(
    pieces: list[tuple[str, bytes]], data: st.DataObject
) -> None:
    chunks = [OutputChunk(seq, stream, body) for seq, (stream, body) in enumerate(pieces)]
    sent, seen = StreamDigest(), StreamDigest()
    for chunk in chunks:
        sent.update(chunk)
        seen.update(OutputChunk.from_wire(msgpack.unpackb(pack(chunk.to_wire()))))
    assert sent.digest() == seen.digest()
    assert (sent.digest() is None) == (not chunks)
    if chunks:  # any one chunk lost, or changed, and the digests differ
        lost = data.draw(st.integers(0, len(chunks) - 1))
        partial = StreamDigest()
        for chunk in chunks[:lost] + chunks[lost + 1 :]:
            partial.update(chunk)
        assert partial.digest() != sent.digest()
