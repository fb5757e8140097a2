"""Reason codes: every rejection anywhere in the node is one of these, never a bare exception."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class Reason(enum.StrEnum):
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


@dataclass(frozen=True, slots=True)
class Rejection:
    reason: Reason
    detail: str = ""
    # For a refusal for want of room: when the refusing node will look at this peer's next offer.
    retry_after_ms: int | None = None

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
