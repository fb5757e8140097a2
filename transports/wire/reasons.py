"""Reason codes: the one vocabulary of every refusal and fault in the node, never a bare exception.

Every code any layer reports is a member of `Reason`, defined here once. A layer that needs a closed set of its own
(a frame's fault, a BLE session's, the connection defences', the coordinator's HTTP refusals, the executor's
`queueReason` and `errorKind`) keeps an enum whose values are these codes, and maps it onto `Reason` by a table that
tests/test_reasons.py checks for totality (`transports.vocabulary` lists them all). The executor cannot import this
floor, so its two enums spell their codes themselves; `QUEUE_REASONS` and `ERROR_KINDS` below tie them to `Reason`.
docs/reference/reasons.md lists every code, its cause and what to do about it, generated from
`transports.wire.reason_reference` by scripts/gen_reasons.py.

A new code: add it here, to `WIRE_REFUSALS` if a refusal on the wire may carry it (or to the layer enum that uses
it), give it its cause and remedy in `transports.wire.reason_reference`, then run scripts/gen_reasons.py and commit
the page. tests/test_reasons.py fails, naming the step, until all of that is done.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from executor.contract import ErrorKind, ExecResult, QueueReason, refusal


class Reason(enum.StrEnum):
    # -- refusals carried on the wire (`WIRE_REFUSALS`): an offer, a claim or a result, refused by a peer ----------
    # The codec: the first thing a hostile peer touches.
    TOO_LARGE = "too_large"
    MALFORMED = "malformed"
    UNSUPPORTED_VERSION = "unsupported_version"
    BAD_SIGNATURE = "bad_signature"
    EXPIRED = "expired"
    NOT_YET_VALID = "not_yet_valid"
    TTL_TOO_LONG = "ttl_too_long"
    # The intake, after the codec.
    REPLAYED = "replayed"
    RATE_LIMITED = "rate_limited"
    LANGUAGE_NOT_ALLOWED = "language_not_allowed"
    OFFERER_DENIED = "offerer_denied"
    SANDBOX_REQUIRED = "sandbox_required_for_remote_task"
    SANDBOX_UNAVAILABLE = "sandbox_unavailable"
    # v2 offers: who may run it, and on what sandbox tier.
    WRONG_AUDIENCE = "wrong_audience"  # sent to another node, or came by a route its audience rules out
    NOT_INVITED = "not_invited"  # a claimed offer that invites only others
    ISOLATION_INSUFFICIENT = "isolation_insufficient"  # the offer needs a stronger sandbox tier than this node's
    # v3 offers: the runtime and resources it needs (transports/wire/needs.py).
    RUNTIME_UNAVAILABLE = "runtime_unavailable"  # not declared and built here, or built with another package set
    RESOURCES_INSUFFICIENT = "resources_insufficient"  # fewer cores or less memory, another architecture, no GPU
    BUSY = "busy"
    SHUTTING_DOWN = "shutting_down"
    # Claims and results.
    CLAIM_REFUSED = "claim_refused"
    UNKNOWN_OFFER = "unknown_offer"
    WRONG_EXECUTOR = "wrong_executor"
    TIMEOUT = "timeout"
    RESULTS_DISAGREE = "results_disagree"  # k replicas asked for, and their results differ
    # Jobs (issue 23): cancels, queueing with a deadline, attempts.
    NOT_OFFERER = "not_offerer"  # a cancel signed by anyone but the offer's own offerer
    QUEUE_DEADLINE = "queue_deadline"  # the offer's queueDeadlineMs passed while it waited (or before it arrived)
    STALE_ATTEMPT = "stale_attempt"  # an event for an attempt of a job that is no longer its current one
    JOB_FINISHED = "job_finished"  # an event for a job that has already ended
    # Sealed offers (transports.wire.sealed): the payload the offerer sent does not open, or is not what it signed.
    PAYLOAD_MISMATCH = "payload_mismatch"
    # The peer could not be dialled or the link dropped: nobody answered, which is not the same as a refusal.
    UNREACHABLE = "unreachable"

    # -- a run's result: the executor's `queueReason` and `errorKind` (QUEUE_REASONS, ERROR_KINDS) -----------------
    OUTSIDE_SUBSET = "outside_subset"
    MEMORY_EXCEEDED = "memory_exceeded"  # errorKind spells it memory-exceeded
    SANDBOX_VIOLATION = "sandbox_violation"  # errorKind sandbox-violation
    EXECUTION_FAILED = "execution_failed"  # errorKind execution-failed
    ABORTED = "aborted"
    NODE_ERROR = "node_error"  # the node failed while handling the offer (a bug, not the program)

    # -- a frame on a stream (transports.framing.FrameFault) -----------------------------------------------------
    CLOSED = "closed"

    # -- the connection-level defences (transports.hardening.refusals.Refusal) ---------------------------------
    SOURCE_CONCURRENCY = "source_concurrency"
    SOURCE_RATE = "source_rate"
    PENDING_FULL = "pending_full"
    GATED = "gated"
    HANDSHAKE_TIMEOUT = "handshake_timeout"
    HANDSHAKE_FAILED = "handshake_failed"
    CONNECTION_LIMIT = "connection_limit"
    PEER_RATE = "peer_rate"
    WINDOW_VIOLATION = "window_violation"
    STREAM_CAP = "stream_cap"
    INVALID_GOSSIP = "invalid_gossip"
    INVALID_FRAMES = "invalid_frames"
    PEER_BANNED = "peer_banned"
    RETRY_TOO_SOON = "retry_too_soon"
    RETRY_IGNORED = "retry_ignored"

    # -- a BLE session (transports.ble.reasons.BleReason) ------------------------------------------------------
    MALFORMED_FRAME = "malformed_frame"
    OUT_OF_ORDER_CHUNK = "out_of_order_chunk"
    DUPLICATE_CHUNK = "duplicate_chunk"
    DIGEST_MISMATCH = "digest_mismatch"
    OVERRUN = "overrun"
    BAD_PEER_INFO = "bad_peer_info"
    NO_SERVICE = "no_service"
    DISCONNECTED = "disconnected"
    CONNECT_FAILED = "connect_failed"
    RESULT_REFUSED = "result_refused"

    # -- the coordinator's HTTP refusals (transports.wire.coordinator_errors.CoordinatorReason) -----------------
    UNSIGNED = "unsigned"
    SKEWED = "skewed"
    REPLAYED_NONCE = "replayed_nonce"
    UNKNOWN_AGENT = "unknown_agent"
    UNKNOWN_TASK = "unknown_task"
    NOT_CLAIMED = "not_claimed"
    CLAIMED_BY_OTHER = "claimed_by_other"
    DUPLICATE_TASK = "duplicate_task"
    RESULT_MISMATCH = "result_mismatch"
    NOT_FOUND = "not_found"
    INTERNAL = "internal"


# The offer itself is at fault, wherever it is sent: too large, not a well-formed signed offer, or outside its
# lifetime. No node will take it as it is.
BAD_OFFER: frozenset[Reason] = frozenset(
    {
        Reason.TOO_LARGE,
        Reason.MALFORMED,
        Reason.UNSUPPORTED_VERSION,
        Reason.BAD_SIGNATURE,
        Reason.EXPIRED,
        Reason.NOT_YET_VALID,
        Reason.TTL_TOO_LONG,
    }
)

# The codes a refusal on the wire may carry (direct and control streams, BLE, a coordinator's /release), and the
# label values of edgecoder_offers_rejected_total. A peer's refusal with any other code is `malformed`.
WIRE_REFUSALS: frozenset[Reason] = BAD_OFFER | frozenset(
    {
        Reason.REPLAYED,
        Reason.RATE_LIMITED,
        Reason.LANGUAGE_NOT_ALLOWED,
        Reason.OFFERER_DENIED,
        Reason.SANDBOX_REQUIRED,
        Reason.SANDBOX_UNAVAILABLE,
        Reason.WRONG_AUDIENCE,
        Reason.NOT_INVITED,
        Reason.ISOLATION_INSUFFICIENT,
        Reason.RUNTIME_UNAVAILABLE,
        Reason.RESOURCES_INSUFFICIENT,
        Reason.BUSY,
        Reason.SHUTTING_DOWN,
        Reason.CLAIM_REFUSED,
        Reason.UNKNOWN_OFFER,
        Reason.WRONG_EXECUTOR,
        Reason.TIMEOUT,
        Reason.RESULTS_DISAGREE,
        Reason.NOT_OFFERER,
        Reason.QUEUE_DEADLINE,
        Reason.STALE_ATTEMPT,
        Reason.JOB_FINISHED,
        Reason.PAYLOAD_MISMATCH,
        Reason.UNREACHABLE,
    }
)


def wire_refusal(code: object) -> Reason | None:
    """The `Reason` a peer's refusal names, when it is one a refusal on the wire may carry; None otherwise."""
    try:
        reason = Reason(code) if isinstance(code, str) else None
    except ValueError:
        return None
    return reason if reason in WIRE_REFUSALS else None


# The executor's two enums, onto this one (the executor sits under the wire floor, so it spells its own codes).
QUEUE_REASONS: dict[QueueReason, Reason] = {
    QueueReason.OUTSIDE_SUBSET: Reason.OUTSIDE_SUBSET,
    QueueReason.TIMEOUT: Reason.TIMEOUT,
    QueueReason.MEMORY: Reason.MEMORY_EXCEEDED,
    QueueReason.SANDBOX_UNAVAILABLE: Reason.SANDBOX_UNAVAILABLE,
    QueueReason.SANDBOX_REQUIRED: Reason.SANDBOX_REQUIRED,
    QueueReason.BUSY: Reason.BUSY,
    QueueReason.ABORTED: Reason.ABORTED,
    QueueReason.NODE_ERROR: Reason.NODE_ERROR,
    QueueReason.ISOLATION_INSUFFICIENT: Reason.ISOLATION_INSUFFICIENT,
    QueueReason.RUNTIME_UNAVAILABLE: Reason.RUNTIME_UNAVAILABLE,
    QueueReason.PAYLOAD_MISMATCH: Reason.PAYLOAD_MISMATCH,
}
ERROR_KINDS: dict[ErrorKind, Reason] = {
    ErrorKind.TIMEOUT: Reason.TIMEOUT,
    ErrorKind.MEMORY_EXCEEDED: Reason.MEMORY_EXCEEDED,
    ErrorKind.SANDBOX_VIOLATION: Reason.SANDBOX_VIOLATION,
    ErrorKind.ABORTED: Reason.ABORTED,
    ErrorKind.EXECUTION_FAILED: Reason.EXECUTION_FAILED,
}

# Refusals that the seed's contract defines as a run's result: an offer refused for one of these is answered as the
# run that never started (ok false, no process, exitCode nil), with the errorKind and queueReason the executor itself
# gives the same cause (executor.runner), beside the reason code. The intake refuses them before any claim.
RUN_RESULT_REFUSALS: dict[Reason, tuple[ErrorKind, QueueReason]] = {
    Reason.SANDBOX_REQUIRED: (ErrorKind.SANDBOX_VIOLATION, QueueReason.SANDBOX_REQUIRED),
    Reason.SANDBOX_UNAVAILABLE: (ErrorKind.SANDBOX_VIOLATION, QueueReason.SANDBOX_UNAVAILABLE),
    Reason.ISOLATION_INSUFFICIENT: (ErrorKind.SANDBOX_VIOLATION, QueueReason.ISOLATION_INSUFFICIENT),
    Reason.BUSY: (ErrorKind.ABORTED, QueueReason.BUSY),
}


def run_result_of(reason: Reason, detail: str = "") -> ExecResult | None:
    """The seed's run result for a refusal with this reason, or None when the seed defines none for it."""
    fixed = RUN_RESULT_REFUSALS.get(reason)
    if fixed is None:
        return None
    error_kind, queue_reason = fixed
    # The seed fixes the host request's stderr to the bare code; the others say the code, then why.
    stderr = str(reason) if reason is Reason.SANDBOX_REQUIRED or not detail else f"{reason}: {detail[:512]}"
    return refusal(stderr, error_kind=error_kind, queue_reason=queue_reason)


@dataclass(frozen=True, slots=True)
class Rejection:
    reason: Reason
    detail: str = ""
    # For a refusal for want of room: when the refusing node will look at this peer's next offer.
    retry_after_ms: int | None = None
    # The seed's run result of this refusal (`RUN_RESULT_REFUSALS`), None for the others. Filled in from the reason
    # when not given; an offerer gives the one its peer sent.
    result: ExecResult | None = None

    def __post_init__(self) -> None:
        if self.result is None:
            object.__setattr__(self, "result", run_result_of(self.reason, self.detail))

    def to_json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"reason": str(self.reason), "detail": self.detail}
        if self.retry_after_ms is not None:
            shown["retryAfterMs"] = self.retry_after_ms
        return shown


class Rejected(Exception):
    """Raised inside the codec and intake, caught at their edge and turned into a `Rejection` value."""

    def __init__(self, reason: Reason, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else str(reason))
        self.rejection = Rejection(reason, detail)

    @property
    def reason(self) -> Reason:
        return self.rejection.reason
