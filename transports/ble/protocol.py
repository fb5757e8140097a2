"""The EdgeCoder BLE GATT protocol: one service, four characteristics, and the small messages they carry.

    IDENTITY      read           msgpack {"peerId": str, "publicKey": 32 bytes}: who claims to offer (unauthenticated)
    CAPABILITIES  read           msgpack {"version": 2, "maxMessage": int, "nonce": 16 bytes}: what the offering side
                                 can take back, and a nonce fresh for this link that the claim must sign
    OFFER         write, notify  the central subscribes, writes SEND_OFFER, and the offer arrives as framed
                                 notifications (see `framing`)
    EXCHANGE      write, notify  the central writes framed CLAIM, RESULT and REFUSAL messages; the offering side
                                 answers CLAIM with GRANT and RESULT with RESULT_ACK (a REFUSAL gets no answer)

Every message on EXCHANGE starts with one kind byte. The offer itself is opaque bytes here: only the node's intake
decodes it.

A claim is bound to a key: it names the claimant's PeerID (which embeds its Ed25519 key) and carries that key's
signature over this link's nonce and the offer's digest. So a claim cannot be made in someone else's name, nor
replayed on another link, and the result must then be signed by the same key.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack

from transports.ble.reasons import BleFault, BleReason

PROTOCOL_VERSION = 2

SERVICE_UUID = "5e7c0de0-6d65-4a6f-8b1e-000000000000"
IDENTITY_UUID = "5e7c0de0-6d65-4a6f-8b1e-000000000001"
CAPABILITIES_UUID = "5e7c0de0-6d65-4a6f-8b1e-000000000002"
OFFER_UUID = "5e7c0de0-6d65-4a6f-8b1e-000000000003"
EXCHANGE_UUID = "5e7c0de0-6d65-4a6f-8b1e-000000000004"

# Written to OFFER to ask for the offer. A write, not the subscription itself, starts the transfer, so that no
# notification is sent before the central's subscription is in place.
SEND_OFFER = b"\x01"

# The offer and the result caps match the codec's own (`transports.wire.codec.DEFAULT_MAX_MESSAGE_BYTES` and
# `transports.wire.offers.MAX_RESULT_BYTES`); they are repeated here so that the transport does not import the codec.
DEFAULT_MAX_OFFER_BYTES = 256 * 1024
DEFAULT_MAX_RESULT_BYTES = 512 * 1024
# Everything else is tiny; a hostile peer gets no more room than this for it.
MAX_SMALL_MESSAGE = 512
MAX_PEER_ID_CHARS = 128
MAX_DETAIL_CHARS = 200
MAX_REASON_CHARS = 64
NONCE_SIZE = 16
SIGNATURE_SIZE = 64
DIGEST_SIZE = 32
# Signed by the claimant. Distinct from every prefix the mesh codec signs under, so a claim signature can never be
# replayed as an offer, a result or a gossip claim, nor one of those as a BLE claim.
CLAIM_DOMAIN = b"edgecoder-mesh/ble-claim/v1\x00"


class Kind(enum.IntEnum):
    CLAIM = 0x01
    RESULT = 0x02
    REFUSAL = 0x03  # the node's intake refused the offer: a reason the offerer may want to show
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
    nonce: bytes  # fresh for each link: the claim signs it
    version: int = PROTOCOL_VERSION
    max_message: int = DEFAULT_MAX_RESULT_BYTES

    def encode(self) -> bytes:
        return _pack({"version": self.version, "maxMessage": self.max_message, "nonce": self.nonce})

    @classmethod
    def decode(cls, data: bytes) -> Capabilities:
        value = _unpack_map(data, "capabilities")
        version = _field(value, "version", int, "capabilities")
        if version != PROTOCOL_VERSION:
            raise BleFault(BleReason.UNSUPPORTED_VERSION, f"peer speaks version {version}")
        nonce = _field(value, "nonce", bytes, "capabilities")
        if len(nonce) != NONCE_SIZE:
            raise BleFault(BleReason.BAD_PEER_INFO, f"capabilities: nonce of {len(nonce)} bytes")
        return cls(nonce, version, _field(value, "maxMessage", int, "capabilities"))


class ClaimSigner(Protocol):
    """What a claimant needs: its PeerID, its raw Ed25519 key and a signature (a
    `transports.wire.identity.NodeIdentity`)."""

    @property
    def peer_id(self) -> str: ...

    @property
    def public_key(self) -> bytes: ...

    def sign(self, message: bytes) -> bytes: ...


def claim_statement(nonce: bytes, offer_digest: bytes, claimant_key: bytes) -> bytes:
    return CLAIM_DOMAIN + nonce + offer_digest + claimant_key


@dataclass(frozen=True, slots=True)
class Claim:
    claimant: str  # the claiming node's PeerID: it names the key that signs this claim and, later, the result
    offer_digest: bytes
    signature: bytes

    @classmethod
    def signed(cls, signer: ClaimSigner, nonce: bytes, offer_digest: bytes) -> Claim:
        return cls(signer.peer_id, offer_digest, signer.sign(claim_statement(nonce, offer_digest, signer.public_key)))

    def encode(self) -> bytes:
        fields = {"claimant": self.claimant, "offerDigest": self.offer_digest, "signature": self.signature}
        return bytes([Kind.CLAIM]) + _pack(fields)

    @classmethod
    def decode_body(cls, body: bytes) -> Claim:
        value = _unpack_map(body, "claim")
        claimant = _field(value, "claimant", str, "claim")
        if len(claimant) > MAX_PEER_ID_CHARS:
            raise BleFault(BleReason.BAD_PEER_INFO, "claim: PeerID too long")
        digest = _field(value, "offerDigest", bytes, "claim")
        signature = _field(value, "signature", bytes, "claim")
        if len(digest) != DIGEST_SIZE or len(signature) != SIGNATURE_SIZE:
            raise BleFault(BleReason.BAD_PEER_INFO, "claim: digest or signature of the wrong size")
        return cls(claimant, digest, signature)


@dataclass(frozen=True, slots=True)
class Refusal:
    """The node's intake refused the offer. Unauthenticated: a hint for the offerer, never proof of anything."""

    reason: str
    detail: str = ""

    def encode(self) -> bytes:
        fields = {"reason": self.reason[:MAX_REASON_CHARS], "detail": self.detail[:MAX_DETAIL_CHARS]}
        return bytes([Kind.REFUSAL]) + _pack(fields)

    @classmethod
    def decode_body(cls, body: bytes) -> Refusal:
        value = _unpack_map(body, "refusal")
        reason = _field(value, "reason", str, "refusal")
        detail = value.get("detail", "")
        if not isinstance(detail, str):
            raise BleFault(BleReason.BAD_PEER_INFO, "refusal: detail not str")
        return cls(reason[:MAX_REASON_CHARS], detail[:MAX_DETAIL_CHARS])


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
