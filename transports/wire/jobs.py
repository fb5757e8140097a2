"""The job messages beside offers and results (issue 23): the offerer's signed cancel, the runner's signed progress,
and the framed output chunks a follower receives.

- `JobCancel` (domain `edgecoder-mesh/cancel/v1`): `{version: 1, offerId, offerer, issuedAt}`, signed by the offer's
  offerer. It is self-standing, so it can travel any route (the offer stream, a stream of its own, a claim's
  offerer, a coordinator): a runner holds it against the offer it names and refuses one signed by anyone else
  (`not_offerer`).
- `JobProgress` (domain `edgecoder-mesh/progress/v1`): `{version: 1, offerId, executor, attempt, state, position,
  at}`, signed by the runner: `queued` with the offer's place in its queue (1 first), or `running`.
- `OutputChunk`: `{type: "output", seq, stream, data}`, not signed one by one: the result signs `streamDigest`, the
  SHA-256 over every chunk sent, in order, each as the canonical msgpack array `[seq, stream, data]`
  (`StreamDigest`), so the follower checks at the end that what it showed is what the runner signed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from transports.wire.codec import Domain, Fields, open_envelope, pack, seal
from transports.wire.identity import PUBLIC_KEY_SIZE, NodeIdentity
from transports.wire.offers import MAX_ATTEMPTS, OFFER_ID_SIZE, now_ms, require_version
from transports.wire.reasons import Reason, Rejected

CANCEL_VERSION = 1
PROGRESS_VERSION = 1
MAX_JOB_MESSAGE_BYTES = 1024
PROGRESS_STATES = ("queued", "running")
STREAMS = ("stdout", "stderr")
# One chunk's payload: the sandbox reads 64 KiB at a time; a chunk carries at most this much of it.
MAX_CHUNK_BYTES = 16 * 1024
_CANCEL_FIELDS = frozenset({"version", "offerId", "offerer", "issuedAt"})
_PROGRESS_FIELDS = frozenset({"version", "offerId", "executor", "attempt", "state", "position", "at"})
_CHUNK_FIELDS = frozenset({"type", "seq", "stream", "data"})


@dataclass(frozen=True, slots=True)
class JobCancel:
    offer_id: bytes
    offerer: bytes
    issued_at_ms: int

    @classmethod
    def create(cls, offerer: NodeIdentity, offer_id: bytes, *, issued_at_ms: int | None = None) -> JobCancel:
        return cls(offer_id, offerer.public_key, now_ms() if issued_at_ms is None else issued_at_ms)

    def to_wire_fields(self) -> dict[str, Any]:
        return {
            "version": CANCEL_VERSION,
            "offerId": self.offer_id,
            "offerer": self.offerer,
            "issuedAt": self.issued_at_ms,
        }

    def sign(self, identity: NodeIdentity) -> bytes:
        if identity.public_key != self.offerer:
            raise ValueError("a cancel is signed by the offerer it names")
        return seal(Domain.CANCEL, self.to_wire_fields(), identity)


def open_cancel(raw: bytes) -> JobCancel:
    """Decode a cancel and verify it against the key it names. Whether that key is the offer's own offerer is the
    runner's check (`not_offerer`). Raises `Rejected`, nothing else."""
    envelope = open_envelope(Domain.CANCEL, raw, max_size=MAX_JOB_MESSAGE_BYTES)
    require_version(envelope, "cancel", (CANCEL_VERSION,))
    f = Fields(envelope.fields, _CANCEL_FIELDS, "cancel")
    cancel = JobCancel(
        offer_id=f.binary("offerId", OFFER_ID_SIZE),
        offerer=f.binary("offerer", PUBLIC_KEY_SIZE),
        issued_at_ms=f.integer("issuedAt"),
    )
    if not envelope.signature_valid(cancel.offerer):
        raise Rejected(Reason.BAD_SIGNATURE, "cancel signature does not verify against its offerer")
    return cancel


@dataclass(frozen=True, slots=True)
class JobProgress:
    offer_id: bytes
    executor: bytes
    attempt: int
    state: str
    position: int | None = None
    at_ms: int = 0

    def to_wire_fields(self) -> dict[str, Any]:
        return {
            "version": PROGRESS_VERSION,
            "offerId": self.offer_id,
            "executor": self.executor,
            "attempt": self.attempt,
            "state": self.state,
            "position": self.position,
            "at": self.at_ms,
        }

    def sign(self, identity: NodeIdentity) -> bytes:
        if identity.public_key != self.executor:
            raise ValueError("progress is signed by its executor")
        if self.state not in PROGRESS_STATES:
            raise ValueError(f"progress state must be one of {PROGRESS_STATES}")
        return seal(Domain.PROGRESS, self.to_wire_fields(), identity)


def open_progress(raw: bytes, *, expect_executor: bytes | None = None) -> JobProgress:
    envelope = open_envelope(Domain.PROGRESS, raw, max_size=MAX_JOB_MESSAGE_BYTES)
    require_version(envelope, "progress", (PROGRESS_VERSION,))
    f = Fields(envelope.fields, _PROGRESS_FIELDS, "progress")
    progress = JobProgress(
        offer_id=f.binary("offerId", OFFER_ID_SIZE),
        executor=f.binary("executor", PUBLIC_KEY_SIZE),
        attempt=f.integer("attempt", 1, MAX_ATTEMPTS),
        state=f.text("state", 16, choices=PROGRESS_STATES),
        position=f.opt_integer("position", 1, 1 << 20),
        at_ms=f.integer("at"),
    )
    if expect_executor is not None and progress.executor != expect_executor:
        raise Rejected(Reason.WRONG_EXECUTOR, "progress signed by a key other than the runner's")
    if not envelope.signature_valid(progress.executor):
        raise Rejected(Reason.BAD_SIGNATURE, "progress signature does not verify against its executor")
    return progress


@dataclass(frozen=True, slots=True)
class OutputChunk:
    seq: int
    stream: str
    data: bytes

    def to_wire(self) -> dict[str, Any]:
        return {"type": "output", "seq": self.seq, "stream": self.stream, "data": self.data}

    @classmethod
    def from_wire(cls, value: Any) -> OutputChunk:
        if not isinstance(value, dict):
            raise Rejected(Reason.MALFORMED, "output chunk is not a map")
        f = Fields(value, _CHUNK_FIELDS, "output")
        if value.get("type") != "output":
            raise Rejected(Reason.MALFORMED, "output chunk: 'type' must be 'output'")
        data = value.get("data")
        if type(data) is not bytes or len(data) > MAX_CHUNK_BYTES:
            raise Rejected(Reason.MALFORMED, f"output chunk: 'data' must be at most {MAX_CHUNK_BYTES} bytes")
        return cls(seq=f.integer("seq", 0, 2**32), stream=f.text("stream", 8, choices=STREAMS), data=data)


class StreamDigest:
    """SHA-256 over the chunks of one stream, in order: the runner's over what it sent, the follower's over what it
    received. They match exactly when the follower showed what the runner signed."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self.count = 0

    def update(self, chunk: OutputChunk) -> None:
        self._hash.update(pack([chunk.seq, chunk.stream, chunk.data]))
        self.count += 1

    def digest(self) -> bytes | None:
        """None when nothing was streamed (the result's `streamDigest` is then nil)."""
        return self._hash.digest() if self.count else None
