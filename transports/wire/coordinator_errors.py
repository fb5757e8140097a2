"""The coordinator's refusal codes: each is a typed JSON body `{"reason", "detail"}` with one HTTP status.

They are the coordinator's own codes, not `transports.wire.reasons.Reason`: most of them (a skewed clock, a replayed
request nonce, a task claimed by another agent) describe the HTTP exchange, not an offer. A node's own rejection of an
offer travels back inside `/release` as a `transports.wire.reasons.Reason` value.
"""

from __future__ import annotations

import enum
from typing import Any

from transports.wire.reasons import Reason


class CoordinatorReason(enum.StrEnum):
    UNSIGNED = Reason.UNSIGNED
    BAD_SIGNATURE = Reason.BAD_SIGNATURE
    SKEWED = Reason.SKEWED
    REPLAYED_NONCE = Reason.REPLAYED_NONCE
    TOO_LARGE = Reason.TOO_LARGE
    RATE_LIMITED = Reason.RATE_LIMITED
    # A table is at its cap (queued tasks in all or for one offerer, or agents): try again later.
    BUSY = Reason.BUSY
    UNKNOWN_AGENT = Reason.UNKNOWN_AGENT
    SANDBOX_UNAVAILABLE = Reason.SANDBOX_UNAVAILABLE
    UNKNOWN_TASK = Reason.UNKNOWN_TASK
    NOT_CLAIMED = Reason.NOT_CLAIMED
    CLAIMED_BY_OTHER = Reason.CLAIMED_BY_OTHER
    DUPLICATE_TASK = Reason.DUPLICATE_TASK
    WRONG_EXECUTOR = Reason.WRONG_EXECUTOR
    RESULT_MISMATCH = Reason.RESULT_MISMATCH
    MALFORMED = Reason.MALFORMED
    NOT_FOUND = Reason.NOT_FOUND
    INTERNAL = Reason.INTERNAL
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
