"""The coordinator's refusal codes: each is a typed JSON body `{"reason", "detail"}` with one HTTP status.

They are the coordinator's own codes, not `transports.wire.reasons.Reason`: most of them (a skewed clock, a replayed
request nonce, a task claimed by another agent) describe the HTTP exchange, not an offer. A node's own rejection of an
offer travels back inside `/release` as a `transports.wire.reasons.Reason` value.
"""

from __future__ import annotations

import enum
from typing import Any


class CoordinatorReason(enum.StrEnum):
    UNSIGNED = "unsigned"
    BAD_SIGNATURE = "bad_signature"
    SKEWED = "skewed"
    REPLAYED_NONCE = "replayed_nonce"
    TOO_LARGE = "too_large"
    RATE_LIMITED = "rate_limited"
    # A table is at its cap (queued tasks in all or for one offerer, or agents): try again later.
    BUSY = "busy"
    UNKNOWN_AGENT = "unknown_agent"
    SANDBOX_UNAVAILABLE = "sandbox_unavailable"
    UNKNOWN_TASK = "unknown_task"
    NOT_CLAIMED = "not_claimed"
    CLAIMED_BY_OTHER = "claimed_by_other"
    DUPLICATE_TASK = "duplicate_task"
    WRONG_EXECUTOR = "wrong_executor"
    RESULT_MISMATCH = "result_mismatch"
    MALFORMED = "malformed"
    NOT_FOUND = "not_found"
    INTERNAL = "internal"
    # An offer refused on enqueue keeps the codec's own reason (expired, bad_signature, ...); see `offer_refused`.


STATUS: dict[str, int] = {
    CoordinatorReason.UNSIGNED: 401,
    CoordinatorReason.BAD_SIGNATURE: 401,
    CoordinatorReason.SKEWED: 401,
    CoordinatorReason.REPLAYED_NONCE: 401,
    CoordinatorReason.TOO_LARGE: 413,
    CoordinatorReason.RATE_LIMITED: 429,
    CoordinatorReason.BUSY: 503,
    CoordinatorReason.UNKNOWN_AGENT: 403,
    CoordinatorReason.SANDBOX_UNAVAILABLE: 403,
    CoordinatorReason.UNKNOWN_TASK: 404,
    CoordinatorReason.NOT_CLAIMED: 409,
    CoordinatorReason.CLAIMED_BY_OTHER: 409,
    CoordinatorReason.DUPLICATE_TASK: 409,
    CoordinatorReason.WRONG_EXECUTOR: 403,
    CoordinatorReason.RESULT_MISMATCH: 422,
    CoordinatorReason.MALFORMED: 400,
    CoordinatorReason.NOT_FOUND: 404,
    CoordinatorReason.INTERNAL: 500,
}
DEFAULT_STATUS = 422  # an offer or result refused by the codec for a reason not listed above (expired, ...)


class Refused(Exception):
    """Raised anywhere inside a request; the app turns it into the JSON refusal. Never carries a traceback out."""

    def __init__(
        self, reason: str, detail: str = "", *, status: int | None = None, retry_after_s: int | None = None
    ) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = str(reason)
        self.detail = detail
        self.status = status if status is not None else STATUS.get(self.reason, DEFAULT_STATUS)
        # Sent as `Retry-After` (429 and 503): when trying again may succeed.
        self.retry_after_s = retry_after_s

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "detail": self.detail}
