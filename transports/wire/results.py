"""`TaskResult`: the signed answer to an offer (transports/wire/offers.py), and the unsigned run result a refusal the
seed defines as a run result carries beside its code.

Results are version 2 when they answer a v3 offer: v1 plus `attempt` (copied from the offer, so that a result names
the try it is for), `streamDigest` (SHA-256 over the output chunks streamed, `transports.wire.jobs`; null when
nothing was streamed) and `streamDropped` (chunks dropped over the cap). Version 1 results are still accepted.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from executor.contract import ErrorKind, ExecResult, QueueReason
from transports.wire.codec import Domain, Fields, now_ms, open_envelope, pack, seal
from transports.wire.identity import PUBLIC_KEY_SIZE, NodeIdentity
from transports.wire.offers import (
    DIGEST_SIZE,
    MAX_ATTEMPTS,
    MAX_OUTPUT_CHARS,
    MAX_RESULT_BYTES,
    OFFER_ID_SIZE,
    RESULT_VERSION,
    RESULT_VERSIONS,
    require_version,
)
from transports.wire.reasons import Reason, Rejected

if TYPE_CHECKING:
    from transports.wire.offers import TaskOffer

# The run_code contract's fields, as a result carries them and as a refusal the seed defines as a run result does
# (transports.wire.reasons.RUN_RESULT_REFUSALS).
_CONTRACT_FIELDS = frozenset(
    {
        "ok",
        "stdout",
        "stderr",
        "exitCode",
        "durationMs",
        "queueForCloud",
        "queueReason",
        "errorKind",
        "stdoutTruncated",
        "stderrTruncated",
    }
)
_RESULT_FIELDS = _CONTRACT_FIELDS | {"version", "offerId", "offerDigest", "executor", "completedAt"}
_RESULT_FIELDS_V2 = _RESULT_FIELDS | {"attempt", "streamDigest", "streamDropped"}
_ERROR_KINDS = tuple(str(k) for k in ErrorKind)
_QUEUE_REASONS = tuple(str(q) for q in QueueReason)


@dataclass(frozen=True, slots=True)
class TaskResult:
    offer_id: bytes
    offer_digest: bytes
    executor: bytes
    result: ExecResult
    completed_at_ms: int = field(default_factory=now_ms)
    # v2: the offer's attempt, the digest of the output streamed for it (None: nothing streamed), and how many
    # chunks were dropped over the output cap (`transports.wire.jobs.OutputStream`).
    attempt: int = 1
    stream_digest: bytes | None = None
    stream_dropped: int = 0
    version: int = RESULT_VERSION

    @classmethod
    def answering(cls, offer: TaskOffer, offer_digest: bytes, executor: bytes, result: ExecResult) -> TaskResult:
        """A result in the version its offer's sender reads: v2 for a v3 offer, v1 before."""
        version = 2 if offer.version >= 3 else 1
        return cls(offer.offer_id, offer_digest, executor, result, attempt=offer.attempt, version=version)

    def to_wire_fields(self) -> dict[str, Any]:
        r = self.result.to_json()
        v2 = {"attempt": self.attempt, "streamDigest": self.stream_digest, "streamDropped": self.stream_dropped}
        return {
            "version": self.version,
            "offerId": self.offer_id,
            "offerDigest": self.offer_digest,
            "executor": self.executor,
            "completedAt": self.completed_at_ms,
            **r,
            **(v2 if self.version >= 2 else {}),
        }

    def sign(self, identity: NodeIdentity) -> bytes:
        if identity.public_key != self.executor:
            raise ValueError("a result is signed by its executor")
        if self.version == 1 and (self.attempt != 1 or self.stream_digest is not None or self.stream_dropped):
            raise ValueError("a version 1 result carries no attempt and no stream")
        return seal(Domain.RESULT, self.to_wire_fields(), identity)

    def to_json(self) -> dict[str, Any]:
        """The verified result as the CLI prints it: the contract's names, ids in hex."""
        return {
            **self.result.to_json(),
            "offerId": self.offer_id.hex(),
            "executor": self.executor.hex(),
        }


def result_digest(result: ExecResult) -> bytes:
    """What replicas must agree on: what the program did (ok, exit code, error kind, its output), not how long it
    took, on which node, or when."""
    what = [result.ok, result.exit_code, None if result.error_kind is None else str(result.error_kind)]
    return hashlib.sha256(pack([*what, result.stdout, result.stderr, result.stdout_truncated])).digest()


def _contract(f: Fields) -> ExecResult:
    kind = f.opt_text("errorKind", 32, choices=_ERROR_KINDS)
    queue_reason = f.opt_text("queueReason", 64, choices=_QUEUE_REASONS)
    return ExecResult(
        ok=f.boolean("ok"),
        stdout=f.text("stdout", MAX_OUTPUT_CHARS),
        stderr=f.text("stderr", MAX_OUTPUT_CHARS),
        exit_code=f.opt_integer("exitCode", -(2**31), 2**31),
        duration_ms=f.integer("durationMs"),
        queue_for_cloud=f.boolean("queueForCloud"),
        queue_reason=None if queue_reason is None else QueueReason(queue_reason),
        error_kind=None if kind is None else ErrorKind(kind),
        stdout_truncated=f.boolean("stdoutTruncated"),
        stderr_truncated=f.boolean("stderrTruncated"),
    )


def parse_run_result(value: Any) -> ExecResult:
    """The unsigned run result a refusal carries (`transports.wire.reasons.RUN_RESULT_REFUSALS`), checked as
    strictly as a signed one's fields; `malformed` otherwise. A run that never started: never `ok`."""
    if type(value) is not dict:
        raise Rejected(Reason.MALFORMED, "a refusal's result must be a map")
    result = _contract(Fields(value, _CONTRACT_FIELDS, "refusal result"))
    if result.ok:
        raise Rejected(Reason.MALFORMED, "a refusal's result cannot be ok")
    return result


def open_result(raw: bytes, *, expect_executor: bytes | None = None, max_size: int = MAX_RESULT_BYTES) -> TaskResult:
    """Decode and verify a result. With `expect_executor`, the result must come from that key (the claimant)."""
    envelope = open_envelope(Domain.RESULT, raw, max_size=max_size)
    version = require_version(envelope, "result", RESULT_VERSIONS)
    f = Fields(envelope.fields, _RESULT_FIELDS if version == 1 else _RESULT_FIELDS_V2, "result")
    result = TaskResult(
        version=version,
        attempt=1 if version == 1 else f.integer("attempt", 1, MAX_ATTEMPTS),
        stream_digest=None if version == 1 else f.opt_binary("streamDigest", DIGEST_SIZE),
        stream_dropped=0 if version == 1 else f.integer("streamDropped", 0, 2**32),
        offer_id=f.binary("offerId", OFFER_ID_SIZE),
        offer_digest=f.binary("offerDigest", DIGEST_SIZE),
        executor=f.binary("executor", PUBLIC_KEY_SIZE),
        completed_at_ms=f.integer("completedAt"),
        result=_contract(f),
    )
    if expect_executor is not None and result.executor != expect_executor:
        raise Rejected(Reason.WRONG_EXECUTOR, "result signed by a key other than the claimant's")
    if not envelope.signature_valid(result.executor):
        raise Rejected(Reason.BAD_SIGNATURE, "result signature does not verify against its executor")
    return result
