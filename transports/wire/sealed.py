"""Sealed offers: the code and input reach only the runner the offerer granted, and gossip carries neither.

A sealed offer is an offer (version 3) whose `sealed` field replaces its `code` and `input` with their terms
(`SealedTerms`): the sha256 digest and byte size of each, and an ephemeral X25519 public key of the offerer, fresh
for each offer. Everything a runner decides on (language, limits, sandbox tier, audience, expiry) is in the signed
offer as before, so it decides whether to claim from the offer alone.

The payload (`Payload`: the code and the input) crosses one link once, after the offerer's claim desk granted a
claim: the grant carries it sealed to the claimant. The result goes back sealed to the offer's key.

Sealing is HPKE (RFC 9180) in base mode, single shot, from `cryptography`: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256,
ChaCha20-Poly1305 (KEM 0x0020, KDF 0x0001, AEAD 0x0003). A sealed message is `enc (32 bytes) || ciphertext`.

- The payload is sealed to an X25519 key the claimant generates for that one claim and sends with its claim request.
  The request travels on a Noise-authenticated stream, so the key is the claimant's; being fresh per claim, a key
  that leaks later opens nothing sealed earlier (the node's Ed25519 identity is never converted or reused).
  `info` is `PAYLOAD_INFO || sha256(the offer's wire bytes)`: a payload opens only for the offer it was sealed for.
  The plaintext is the canonical msgpack map `{"code": str, "input": <json data>}`.
- The result (the runner's signed result, wire bytes) is sealed to the offer's `key`, with
  `info = RESULT_INFO || sha256(the offer's wire bytes)`; only the offerer holds the private half.

The runner checks the opened payload against the signed terms before anything runs: the code's utf-8 bytes and the
input's canonical msgpack bytes must have the digests and sizes the offerer signed. Anything else, a payload that
does not open included, is `payload_mismatch`, and nothing runs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from transports.wire.codec import DEFAULT_MAX_MESSAGE_BYTES, Fields, pack, unpack_strict
from transports.wire.reasons import Reason, Rejected

SUITE = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)
KEY_SIZE = 32  # an X25519 public key
ENC_SIZE = 32  # HPKE's encapsulated key for DHKEM(X25519)
TAG_SIZE = 16  # ChaCha20-Poly1305's tag
DIGEST_SIZE = 32
PAYLOAD_INFO = b"edgecoder-mesh/payload/v1\x00"
RESULT_INFO = b"edgecoder-mesh/sealed-result/v1\x00"
# The code and input together may be as large as a whole clear offer was: sealing moves them, it does not grow them.
MAX_PAYLOAD_BYTES = DEFAULT_MAX_MESSAGE_BYTES
# The payload map's own keys and headers, HPKE's enc and tag.
MAX_SEALED_PAYLOAD = MAX_PAYLOAD_BYTES + 64 + ENC_SIZE + TAG_SIZE
_TERMS_FIELDS = frozenset({"codeDigest", "codeSize", "inputDigest", "inputSize", "key"})
_PAYLOAD_FIELDS = frozenset({"code", "input"})
_DIRECT_FIELDS = frozenset({"offer", "payload"})


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


@dataclass(frozen=True, slots=True)
class SealedTerms:
    """What a sealed offer says of its payload, signed with it: digests and sizes, and where results go."""

    code_digest: bytes
    code_size: int
    input_digest: bytes
    input_size: int
    key: bytes  # the offerer's ephemeral X25519 public key for this offer

    def to_wire(self) -> dict[str, Any]:
        return {
            "codeDigest": self.code_digest,
            "codeSize": self.code_size,
            "inputDigest": self.input_digest,
            "inputSize": self.input_size,
            "key": self.key,
        }

    @classmethod
    def from_wire(cls, value: dict[str, Any]) -> SealedTerms:
        f = Fields(value, _TERMS_FIELDS, "offer.sealed")
        terms = cls(
            code_digest=f.binary("codeDigest", DIGEST_SIZE),
            code_size=f.integer("codeSize", 0, MAX_PAYLOAD_BYTES),
            input_digest=f.binary("inputDigest", DIGEST_SIZE),
            input_size=f.integer("inputSize", 1, MAX_PAYLOAD_BYTES),  # msgpack nil is one byte
            key=f.binary("key", KEY_SIZE),
        )
        if terms.code_size + terms.input_size > MAX_PAYLOAD_BYTES:
            raise Rejected(Reason.TOO_LARGE, f"offer.sealed: code and input over {MAX_PAYLOAD_BYTES} bytes")
        return terms


@dataclass(frozen=True, slots=True)
class Payload:
    """The part of an offer that a sealed offer leaves out."""

    code: str
    input: Any = None

    def code_bytes(self) -> bytes:
        return self.code.encode("utf-8")

    def input_bytes(self) -> bytes:
        return pack(self.input)

    def terms(self, key: bytes) -> SealedTerms:
        code, data = self.code_bytes(), self.input_bytes()
        return SealedTerms(sha256(code), len(code), sha256(data), len(data), key)

    def encode(self) -> bytes:
        return pack({"code": self.code, "input": self.input})

    def check(self, terms: SealedTerms) -> None:
        """`payload_mismatch` unless this is the payload the terms describe."""
        code, data = self.code_bytes(), self.input_bytes()
        if len(code) != terms.code_size or sha256(code) != terms.code_digest:
            raise Rejected(Reason.PAYLOAD_MISMATCH, "the code is not the code the offer's digest names")
        if len(data) != terms.input_size or sha256(data) != terms.input_digest:
            raise Rejected(Reason.PAYLOAD_MISMATCH, "the input is not the input the offer's digest names")

    @classmethod
    def decode(cls, data: bytes) -> Payload:
        value = unpack_strict(data, max_size=MAX_SEALED_PAYLOAD)
        if type(value) is not dict:
            raise Rejected(Reason.MALFORMED, "payload: not a map")
        f = Fields(value, _PAYLOAD_FIELDS, "payload")
        return cls(code=f.text("code", MAX_PAYLOAD_BYTES), input=f.json_data("input"))


class SealKey:
    """An X25519 key pair used for one offer (the offerer's) or one claim (the claimant's), then forgotten."""

    __slots__ = ("_private", "public")

    def __init__(self, private: X25519PrivateKey | None = None) -> None:
        self._private = private or X25519PrivateKey.generate()
        self.public = self._private.public_key().public_bytes_raw()

    def __repr__(self) -> str:  # never print the private half
        return f"SealKey(public={self.public.hex()})"

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> SealKey:
        return cls(X25519PrivateKey.from_private_bytes(raw))

    def open(self, sealed: bytes, info: bytes) -> bytes:
        """The plaintext, or `payload_mismatch` when it was not sealed to this key for this `info` or was altered."""
        if len(sealed) < ENC_SIZE + TAG_SIZE:
            raise Rejected(Reason.MALFORMED, f"a sealed message is at least {ENC_SIZE + TAG_SIZE} bytes")
        try:
            return SUITE.decrypt(sealed, self._private, info=info)
        except (InvalidTag, ValueError):
            raise Rejected(
                Reason.PAYLOAD_MISMATCH, "does not open: altered, or sealed to another key or offer"
            ) from None


def seal_to(recipient: bytes, plaintext: bytes, info: bytes) -> bytes:
    """HPKE-seal `plaintext` to the X25519 public key `recipient`; `malformed` for a key no one can hold."""
    if len(recipient) != KEY_SIZE:
        raise Rejected(Reason.MALFORMED, f"a seal key is {KEY_SIZE} bytes")
    try:
        return SUITE.encrypt(plaintext, X25519PublicKey.from_public_bytes(recipient), info=info)
    except ValueError:  # a low-order point: the shared secret would be all zeros
        raise Rejected(Reason.MALFORMED, "the seal key is not a usable X25519 key") from None


def seal_payload(payload: Payload, offer_digest: bytes, recipient: bytes) -> bytes:
    return seal_to(recipient, payload.encode(), PAYLOAD_INFO + offer_digest)


def open_payload(sealed: bytes, offer_digest: bytes, key: SealKey, terms: SealedTerms) -> Payload:
    """Open and check a sealed payload: the payload, or `Rejected` (`payload_mismatch`, `malformed`, `too_large`)."""
    if not isinstance(sealed, bytes):
        raise Rejected(Reason.MALFORMED, "a sealed payload is bytes")
    if len(sealed) > MAX_SEALED_PAYLOAD:
        raise Rejected(Reason.TOO_LARGE, f"sealed payload of {len(sealed)} bytes > cap {MAX_SEALED_PAYLOAD}")
    payload = Payload.decode(key.open(sealed, PAYLOAD_INFO + offer_digest))
    payload.check(terms)
    return payload


def direct_form(offer_raw: bytes, payload: Payload) -> bytes:
    """A sealed offer and its payload in one direct offer frame: `{"offer": bin, "payload": bin}`, the payload the
    canonical msgpack map a grant carries sealed. The direct stream is Noise-encrypted to the one node the offer
    names, so the payload needs no sealing of its own there; the runner checks it against the offer's digests."""
    return pack({"offer": offer_raw, "payload": payload.encode()})


def open_direct_form(frame: bytes, *, max_size: int) -> tuple[bytes, Payload]:
    """The offer's wire bytes and the payload of a direct offer frame in the envelope-plus-payload form (the offer is
    still to be checked, and the payload against it), or `Rejected`."""
    value = unpack_strict(frame, max_size=max_size)
    if type(value) is not dict:
        raise Rejected(Reason.MALFORMED, "direct offer: not a map")
    f = Fields(value, _DIRECT_FIELDS, "direct offer")
    offer, payload = f.data.get("offer"), f.data.get("payload")
    if type(offer) is not bytes or type(payload) is not bytes:
        raise Rejected(Reason.MALFORMED, "direct offer: expected {offer: bytes, payload: bytes}")
    return offer, Payload.decode(payload)


def is_direct_form(frame: bytes) -> bool:
    """A msgpack map (a signed offer is an array): fixmap, map16 or map32."""
    return bool(frame) and (0x80 <= frame[0] <= 0x8F or frame[0] in (0xDE, 0xDF))


def seal_result(result_raw: bytes, offer_digest: bytes, offerer_key: bytes) -> bytes:
    return seal_to(offerer_key, result_raw, RESULT_INFO + offer_digest)


def open_sealed_result(sealed: bytes, offer_digest: bytes, key: SealKey, *, max_size: int) -> bytes:
    """The signed result's wire bytes (still to be verified), or `Rejected`."""
    if len(sealed) > max_size + ENC_SIZE + TAG_SIZE:
        raise Rejected(Reason.TOO_LARGE, f"sealed result of {len(sealed)} bytes > cap {max_size}")
    return key.open(sealed, RESULT_INFO + offer_digest)
