"""The EdgeCoder BLE GATT protocol: one service, four characteristics, and the small messages they carry.

    IDENTITY      read           msgpack {"peerId": str, "publicKey": 32 bytes}: who claims to offer (unauthenticated)
    CAPABILITIES  read           msgpack {"version": 1, "maxMessage": int}: what the offering side can take back
    OFFER         write, notify  the central subscribes, writes SEND_OFFER, and the offer arrives as framed
                                 notifications (see `framing`)
    EXCHANGE      write, notify  the central writes framed CLAIM and RESULT messages; the offering side answers each
                                 with a framed GRANT or RESULT_ACK notification

Every message on EXCHANGE starts with one kind byte. The offer itself is opaque bytes here: only the node's intake
decodes it.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from typing import Any

import msgpack

from transports.ble.reasons import BleFault, BleReason

PROTOCOL_VERSION = 1

SERVICE_UUID = "5e7c0de0-6d65-4a6f-8b1e-000000000000"
IDENTITY_UUID = "5e7c0de0-6d65-4a6f-8b1e-000000000001"
CAPABILITIES_UUID = "5e7c0de0-6d65-4a6f-8b1e-000000000002"
OFFER_UUID = "5e7c0de0-6d65-4a6f-8b1e-000000000003"
EXCHANGE_UUID = "5e7c0de0-6d65-4a6f-8b1e-000000000004"

# Written to OFFER to ask for the offer. A write, not the subscription itself, starts the transfer, so that no
# notification is sent before the central's subscription is in place.
SEND_OFFER = b"\x01"

# The offer and the result caps match the codec's own (`mesh.codec.DEFAULT_MAX_MESSAGE_BYTES` and
# `mesh.offers.MAX_RESULT_BYTES`); they are repeated here so that the transport does not import the codec.
DEFAULT_MAX_OFFER_BYTES = 256 * 1024
DEFAULT_MAX_RESULT_BYTES = 512 * 1024
# Everything else is tiny; a hostile peer gets no more room than this for it.
MAX_SMALL_MESSAGE = 512
MAX_PEER_ID_CHARS = 128
MAX_DETAIL_CHARS = 200


class Kind(enum.IntEnum):
    CLAIM = 0x01
    RESULT = 0x02
    GRANT = 0x81
    RESULT_ACK = 0x82


def offer_digest(offer: bytes) -> bytes:
    """Binds a claim to the exact offer bytes the claimant read (the same digest the codec uses)."""
    return hashlib.sha256(offer).digest()


def _pack(value: dict[str, Any]) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def _unpack_map(data: bytes, what: str) -> dict[str, Any]:
    if len(data) > MAX_SMALL_MESSAGE:
        raise BleFault(BleReason.BAD_PEER_INFO, f"{what}: {len(data)} bytes")
    try:
        value = msgpack.unpackb(data, raw=False, strict_map_key=True)  # size checked above
    except Exception as exc:  # msgpack raises a zoo of types on bad input; all mean the same here
        raise BleFault(BleReason.BAD_PEER_INFO, f"{what}: not msgpack ({type(exc).__name__})") from None
    if not isinstance(value, dict):
        raise BleFault(BleReason.BAD_PEER_INFO, f"{what}: not a map")
    return value


def _field(value: dict[str, Any], name: str, kind: type, what: str) -> Any:
    item = value.get(name)
    if not isinstance(item, kind) or (isinstance(item, bool) and kind is int):
        raise BleFault(BleReason.BAD_PEER_INFO, f"{what}: field {name!r} missing or not {kind.__name__}")
    return item


@dataclass(frozen=True, slots=True)
class PeerInfo:
    """What the offering side says about itself. Unauthenticated: anyone can advertise anyone's PeerID."""

    peer_id: str
    public_key: bytes

    def encode(self) -> bytes:
        return _pack({"peerId": self.peer_id, "publicKey": self.public_key})

    @classmethod
    def decode(cls, data: bytes) -> PeerInfo:
        value = _unpack_map(data, "identity")
        peer_id = _field(value, "peerId", str, "identity")
        key = _field(value, "publicKey", bytes, "identity")
        if len(peer_id) > MAX_PEER_ID_CHARS or len(key) != 32:
            raise BleFault(BleReason.BAD_PEER_INFO, "identity: bad PeerID or key size")
        return cls(peer_id, key)


@dataclass(frozen=True, slots=True)
class Capabilities:
    version: int = PROTOCOL_VERSION
    max_message: int = DEFAULT_MAX_RESULT_BYTES

    def encode(self) -> bytes:
        return _pack({"version": self.version, "maxMessage": self.max_message})

    @classmethod
    def decode(cls, data: bytes) -> Capabilities:
        value = _unpack_map(data, "capabilities")
        version = _field(value, "version", int, "capabilities")
        if version != PROTOCOL_VERSION:
            raise BleFault(BleReason.UNSUPPORTED_VERSION, f"peer speaks version {version}")
        return cls(version, _field(value, "maxMessage", int, "capabilities"))


@dataclass(frozen=True, slots=True)
class Claim:
    claimant: str  # the claiming node's PeerID: the result must be signed by this key
    offer_digest: bytes

    def encode(self) -> bytes:
        return bytes([Kind.CLAIM]) + _pack({"claimant": self.claimant, "offerDigest": self.offer_digest})

    @classmethod
    def decode_body(cls, body: bytes) -> Claim:
        value = _unpack_map(body, "claim")
        claimant = _field(value, "claimant", str, "claim")
        if len(claimant) > MAX_PEER_ID_CHARS:
            raise BleFault(BleReason.BAD_PEER_INFO, "claim: PeerID too long")
        return cls(claimant, _field(value, "offerDigest", bytes, "claim"))


@dataclass(frozen=True, slots=True)
class Answer:
    """The offering side's answer to a claim (GRANT) or to a result (RESULT_ACK)."""

    kind: Kind
    ok: bool
    detail: str = ""

    def encode(self) -> bytes:
        return bytes([self.kind]) + _pack({"ok": self.ok, "detail": self.detail[:MAX_DETAIL_CHARS]})

    @classmethod
    def decode(cls, message: bytes) -> Answer:
        if not message or message[0] not in (Kind.GRANT, Kind.RESULT_ACK):
            raise BleFault(BleReason.MALFORMED_FRAME, "answer of unknown kind")
        value = _unpack_map(message[1:], "answer")
        ok = value.get("ok")
        detail = value.get("detail", "")
        if not isinstance(ok, bool) or not isinstance(detail, str):
            raise BleFault(BleReason.MALFORMED_FRAME, "answer fields")
        return cls(Kind(message[0]), ok, detail[:MAX_DETAIL_CHARS])
