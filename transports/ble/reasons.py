"""Why a BLE session failed: precise transport codes, mapped onto the node's `Reason` values.

Every code is a `Reason` (the node's one vocabulary); `BleReason` is the closed set a BLE session reports, and
`AS_REASON` maps each one onto the nearest refusal the wire carries. The fine code survives in the rejection's detail
(``"ble/<code>: ..."``), so logs and tests can tell a digest mismatch from a reordered chunk.
"""

from __future__ import annotations

import enum

from transports.wire.reasons import Reason, Rejection


class BleReason(enum.StrEnum):
    # Framing: the bytes on the air did not reassemble into exactly what was sent.
    MALFORMED_FRAME = Reason.MALFORMED_FRAME
    OUT_OF_ORDER = Reason.OUT_OF_ORDER_CHUNK  # a chunk is missing, or chunks were reordered
    DUPLICATE_CHUNK = Reason.DUPLICATE_CHUNK
    DIGEST_MISMATCH = Reason.DIGEST_MISMATCH
    TOO_LARGE = Reason.TOO_LARGE
    OVERRUN = Reason.OVERRUN  # more bytes than the declared total length
    # The GATT conversation.
    BAD_PEER_INFO = Reason.BAD_PEER_INFO  # identity or capabilities unreadable or malformed
    UNSUPPORTED_VERSION = Reason.UNSUPPORTED_VERSION
    NO_SERVICE = Reason.NO_SERVICE
    TIMEOUT = Reason.TIMEOUT  # the peer stalled: no progress within the idle or total deadline
    DISCONNECTED = Reason.DISCONNECTED
    CONNECT_FAILED = Reason.CONNECT_FAILED
    CLAIM_REFUSED = Reason.CLAIM_REFUSED
    RESULT_REFUSED = Reason.RESULT_REFUSED


# Onto the wire refusals (`transports.wire.reasons.WIRE_REFUSALS`): every code, checked total by tests/test_reasons.py.
AS_REASON: dict[BleReason, Reason] = {
    BleReason.TOO_LARGE: Reason.TOO_LARGE,
    BleReason.UNSUPPORTED_VERSION: Reason.UNSUPPORTED_VERSION,
    BleReason.TIMEOUT: Reason.TIMEOUT,
    BleReason.CLAIM_REFUSED: Reason.CLAIM_REFUSED,
    # A link that drops or never comes up is unreachable; everything else is bytes that did not decode.
    BleReason.DISCONNECTED: Reason.UNREACHABLE,
    BleReason.CONNECT_FAILED: Reason.UNREACHABLE,
    BleReason.MALFORMED_FRAME: Reason.MALFORMED,
    BleReason.OUT_OF_ORDER: Reason.MALFORMED,
    BleReason.DUPLICATE_CHUNK: Reason.MALFORMED,
    BleReason.DIGEST_MISMATCH: Reason.MALFORMED,
    BleReason.OVERRUN: Reason.MALFORMED,
    BleReason.BAD_PEER_INFO: Reason.MALFORMED,
    BleReason.NO_SERVICE: Reason.MALFORMED,
    BleReason.RESULT_REFUSED: Reason.MALFORMED,
}


def as_reason(code: BleReason) -> Reason:
    return AS_REASON[code]


class BleFault(Exception):
    """A typed BLE failure. Raised inside the transport, caught at the session edge and turned into a `Rejection`."""

    def __init__(self, code: BleReason, detail: str = "") -> None:
        super().__init__(f"{code}: {detail}" if detail else str(code))
        self.code = code
        self.detail = detail

    def to_rejection(self) -> Rejection:
        detail = f"ble/{self.code}: {self.detail}" if self.detail else f"ble/{self.code}"
        return Rejection(as_reason(self.code), detail)
