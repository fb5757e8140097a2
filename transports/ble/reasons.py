"""Why a BLE session failed: precise transport codes, mapped onto the node's `Reason` values.

The node's `Reason` set is shared by every component and owned elsewhere, so the BLE transport keeps its own finer
codes (`BleReason`) and maps each one onto the nearest shared value. The fine code survives in the rejection's detail
(``"ble/<code>: ..."``), so logs and tests can tell a digest mismatch from a reordered chunk.
"""

from __future__ import annotations

import enum

from transports.wire.reasons import Reason, Rejection


class BleReason(enum.StrEnum):
    # Framing: the bytes on the air did not reassemble into exactly what was sent.
    MALFORMED_FRAME = "malformed_frame"
    OUT_OF_ORDER = "out_of_order_chunk"  # a chunk is missing, or chunks were reordered
    DUPLICATE_CHUNK = "duplicate_chunk"
    DIGEST_MISMATCH = "digest_mismatch"
    TOO_LARGE = "too_large"
    OVERRUN = "overrun"  # more bytes than the declared total length
    # The GATT conversation.
    BAD_PEER_INFO = "bad_peer_info"  # identity or capabilities unreadable or malformed
    UNSUPPORTED_VERSION = "unsupported_version"
    NO_SERVICE = "no_service"
    TIMEOUT = "timeout"  # the peer stalled: no progress within the idle or total deadline
    DISCONNECTED = "disconnected"
    CONNECT_FAILED = "connect_failed"
    CLAIM_REFUSED = "claim_refused"
    RESULT_REFUSED = "result_refused"


_AS_REASON: dict[BleReason, Reason] = {
    BleReason.TOO_LARGE: Reason.TOO_LARGE,
    BleReason.UNSUPPORTED_VERSION: Reason.UNSUPPORTED_VERSION,
    BleReason.TIMEOUT: Reason.TIMEOUT,
    BleReason.CLAIM_REFUSED: Reason.CLAIM_REFUSED,
    # A link that drops or never comes up is unreachable; everything else is bytes that did not decode.
    BleReason.DISCONNECTED: Reason.UNREACHABLE,
    BleReason.CONNECT_FAILED: Reason.UNREACHABLE,
}


def as_reason(code: BleReason) -> Reason:
    return _AS_REASON.get(code, Reason.MALFORMED)


class BleFault(Exception):
    """A typed BLE failure. Raised inside the transport, caught at the session edge and turned into a `Rejection`."""

    def __init__(self, code: BleReason, detail: str = "") -> None:
        super().__init__(f"{code}: {detail}" if detail else str(code))
        self.code = code
        self.detail = detail

    def to_rejection(self) -> Rejection:
        detail = f"ble/{self.code}: {self.detail}" if self.detail else f"ble/{self.code}"
        return Rejection(as_reason(self.code), detail)
