"""Sealed offers on the wire: the envelope, the sealed payload and result, their vectors, and an independent opener.

The sealed vectors hold HPKE ciphertexts, which are random by construction (a fresh ephemeral key per seal), so they
are known answers for opening, not for sealing: `python -m tests.test_sealed --write` seals them afresh, only on a
deliberate protocol change. `hpke_base_open` below opens them with RFC 9180's key schedule written out over plain
`cryptography` primitives (X25519, HMAC, HKDF-Expand, ChaCha20-Poly1305), not through `cryptography`'s HPKE: a second
implementation agreeing on the same bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest
from cryptography.hazmat.primitives import hashes, hmac
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_vectors import ISSUED, OFFER_SEAL_PRIVATE, OFFERER_SEED, VECTORS
from transports.wire.codec import Domain, seal
from transports.wire.identity import NodeIdentity
from transports.wire.offers import TaskOffer, open_offer
from transports.wire.reasons import Reason, Rejected
from transports.wire.sealed import (
    ENC_SIZE,
    PAYLOAD_INFO,
    RESULT_INFO,
    Payload,
    SealKey,
    direct_form,
    open_direct_form,
    open_payload,
    open_sealed_result,
    seal_payload,
    seal_result,
)

OFFERER = NodeIdentity(OFFERER_SEED)
# The runner's claim key of the vectors: RFC 7748 section 6.1's Bob.
CLAIM_SEAL_PRIVATE = bytes.fromhex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb")
MARKER = "sealed-marker-6f1c2b"


def sealed_offer(code: str = f"print('{MARKER}')\n", input: Any = None) -> tuple[TaskOffer, SealKey, Payload]:
    clear = TaskOffer.create(OFFERER, language="python", code=code, input=input or {"marker": MARKER})
    key = SealKey()
    return clear.sealed_with(key.public), key, clear.payload


def test_a_sealed_offer_carries_terms_and_neither_code_nor_input() -> None:
    offer, key, payload = sealed_offer()
    raw = offer.sign(OFFERER)
    assert MARKER.encode() not in raw
    received = open_offer(raw)
    assert received.offer.sealed == payload.terms(key.public)
    assert received.offer.code == "" and received.offer.input is None
    assert received.offer.version == 3


def test_the_granted_runner_opens_the_payload_and_gets_the_offer_back() -> None:
    offer, _, payload = sealed_offer(input={"xs": [1, 2, 3], "marker": MARKER})
    received = open_offer(offer.sign(OFFERER))
    claim = SealKey()
    sealed = seal_payload(payload, received.digest, claim.public)
    assert MARKER.encode() not in sealed
    assert received.offer.sealed is not None
    opened = open_payload(sealed, received.digest, claim, received.offer.sealed)
    assert received.offer.opened(opened).payload == payload


def test_a_runner_that_holds_another_key_cannot_open_it() -> None:
    offer, _, payload = sealed_offer()
    received = open_offer(offer.sign(OFFERER))
    sealed = seal_payload(payload, received.digest, SealKey().public)
    assert received.offer.sealed is not None
    with pytest.raises(Rejected) as refused:
        open_payload(sealed, received.digest, SealKey(), received.offer.sealed)
    assert refused.value.reason == Reason.PAYLOAD_MISMATCH


def test_a_payload_sealed_for_another_offer_does_not_open_for_this_one() -> None:
    offer, _, payload = sealed_offer()
    received = open_offer(offer.sign(OFFERER))
    claim = SealKey()
    sealed = seal_payload(payload, hashlib.sha256(b"another offer").digest(), claim.public)
    assert received.offer.sealed is not None
    with pytest.raises(Rejected) as refused:
        open_payload(sealed, received.digest, claim, received.offer.sealed)
    assert refused.value.reason == Reason.PAYLOAD_MISMATCH


def test_an_offerer_that_sends_other_code_than_it_signed_is_refused() -> None:
    offer, _, _ = sealed_offer()
    received = open_offer(offer.sign(OFFERER))
    claim = SealKey()
    other = seal_payload(Payload("import os; os.system('x')", {"marker": MARKER}), received.digest, claim.public)
    assert received.offer.sealed is not None
    with pytest.raises(Rejected) as refused:
        open_payload(other, received.digest, claim, received.offer.sealed)
    assert refused.value.reason == Reason.PAYLOAD_MISMATCH
    assert "code" in refused.value.rejection.detail


@settings(max_examples=60, deadline=None)  # deadline off: HPKE and signing on a loaded shared machine
@given(st.data())
def test_any_altered_byte_of_a_sealed_payload_is_refused(data: st.DataObject) -> None:
    """Property: flipping any bit of any byte of the sealed payload makes it `payload_mismatch` or `malformed`,
    never another payload."""
    offer, _, payload = sealed_offer()
    received = open_offer(offer.sign(OFFERER))
    claim = SealKey()
    sealed = bytearray(seal_payload(payload, received.digest, claim.public))
    at = data.draw(st.integers(0, len(sealed) - 1))
    sealed[at] ^= 1 << data.draw(st.integers(0, 7))
    assert received.offer.sealed is not None
    with pytest.raises(Rejected) as refused:
        open_payload(bytes(sealed), received.digest, claim, received.offer.sealed)
    assert refused.value.reason in (Reason.PAYLOAD_MISMATCH, Reason.MALFORMED)


json_data = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=60, deadline=None)  # deadline off: HPKE and signing on a loaded shared machine
@given(code=st.text(max_size=300), input=json_data)
def test_whatever_the_offerer_seals_the_runner_opens_exactly(code: str, input: Any) -> None:
    """Property: any code and JSON input survive seal and open unchanged, and match their signed terms."""
    payload = Payload(code, input)
    clear = TaskOffer.create(OFFERER, language="python", code=code, input=input)
    key = SealKey()
    received = open_offer(clear.sealed_with(key.public).sign(OFFERER))
    claim = SealKey()
    assert received.offer.sealed is not None
    opened = open_payload(
        seal_payload(payload, received.digest, claim.public), received.digest, claim, received.offer.sealed
    )
    assert opened == payload


def test_the_result_is_sealed_back_to_the_offers_key_only() -> None:
    offer, key, _ = sealed_offer()
    digest = open_offer(offer.sign(OFFERER)).digest
    sealed = seal_result(b"signed result bytes", digest, key.public)
    assert open_sealed_result(sealed, digest, key, max_size=1024) == b"signed result bytes"
    with pytest.raises(Rejected) as refused:
        open_sealed_result(sealed, digest, SealKey(), max_size=1024)
    assert refused.value.reason == Reason.PAYLOAD_MISMATCH


def test_a_sealed_offer_with_code_or_without_terms_is_malformed() -> None:
    offer, _, _ = sealed_offer()
    fields = offer.to_wire_fields()
    for changed in ({**fields, "code": "print(1)"}, {k: v for k, v in fields.items() if k != "sealed"}):
        with pytest.raises(Rejected) as refused:
            open_offer(seal(Domain.OFFER, changed, OFFERER))
        assert refused.value.reason == Reason.MALFORMED
    clear = TaskOffer.create(OFFERER, language="python", code="print(1)")
    assert open_offer(clear.sign(OFFERER)).offer.sealed is None
    with pytest.raises(ValueError):
        dataclasses.replace(offer, code="print(1)").sign(OFFERER)


def test_a_seal_key_no_one_can_hold_is_malformed() -> None:
    with pytest.raises(Rejected) as refused:
        seal_payload(Payload("x"), bytes(32), bytes(32))  # the all-zero point: the shared secret would be zero
    assert refused.value.reason == Reason.MALFORMED


# -- vectors, and an independent opener ----------------------------------------------------------------------------


def _i2osp(value: int, length: int) -> bytes:
    return value.to_bytes(length, "big")


def _extract(salt: bytes, ikm: bytes) -> bytes:
    mac = hmac.HMAC(salt or bytes(32), hashes.SHA256())
    mac.update(ikm)
    return mac.finalize()


def _expand(prk: bytes, info: bytes, length: int) -> bytes:
    return HKDFExpand(hashes.SHA256(), length, info).derive(prk)


def hpke_base_open(private: bytes, sealed: bytes, info: bytes) -> bytes:
    """RFC 9180 base mode, DHKEM(X25519, HKDF-SHA256) / HKDF-SHA256 / ChaCha20-Poly1305, single shot, written out."""
    kem_suite = b"KEM" + _i2osp(0x0020, 2)
    suite = b"HPKE" + _i2osp(0x0020, 2) + _i2osp(0x0001, 2) + _i2osp(0x0003, 2)

    def labeled_extract(sid: bytes, salt: bytes, label: bytes, ikm: bytes) -> bytes:
        return _extract(salt, b"HPKE-v1" + sid + label + ikm)

    def labeled_expand(sid: bytes, prk: bytes, label: bytes, ctx: bytes, length: int) -> bytes:
        return _expand(prk, struct.pack(">H", length) + b"HPKE-v1" + sid + label + ctx, length)

    enc, ciphertext = sealed[:ENC_SIZE], sealed[ENC_SIZE:]
    key = X25519PrivateKey.from_private_bytes(private)
    dh = key.exchange(X25519PublicKey.from_public_bytes(enc))
    kem_context = enc + key.public_key().public_bytes_raw()
    eae_prk = labeled_extract(kem_suite, b"", b"eae_prk", dh)
    shared_secret = labeled_expand(kem_suite, eae_prk, b"shared_secret", kem_context, 32)
    context = (
        b"\x00" + labeled_extract(suite, b"", b"psk_id_hash", b"") + labeled_extract(suite, b"", b"info_hash", info)
    )
    secret = labeled_extract(suite, shared_secret, b"secret", b"")
    aead_key = labeled_expand(suite, secret, b"key", context, 32)
    nonce = labeled_expand(suite, secret, b"base_nonce", context, 12)  # sequence 0: the base nonce itself
    return ChaCha20Poly1305(aead_key).decrypt(nonce, ciphertext, b"")


def _sealed_offer_vector() -> tuple[bytes, TaskOffer]:
    wire = bytes.fromhex(json.loads((VECTORS / "offer-v3-sealed.json").read_text())["wire"])
    return wire, open_offer(wire, now=ISSUED).offer


def build() -> dict[str, dict[str, Any]]:
    """Seal the vectors afresh (their ciphertexts differ at each run)."""
    wire, offer = _sealed_offer_vector()
    digest = hashlib.sha256(wire).digest()
    payload = Payload(
        "import json, sys\nprint(sum(json.load(sys.stdin)['xs']))\n", {"xs": [1, 2, 3]}
    )  # the offer-v1 vector's work
    claim = SealKey.from_private_bytes(CLAIM_SEAL_PRIVATE)
    result_wire = bytes.fromhex(json.loads((VECTORS / "result-v1.json").read_text())["wire"])
    assert offer.sealed is not None
    return {
        "sealed-payload-v1": {
            "suite": "HPKE base mode: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, ChaCha20-Poly1305",
            "offerWire": wire.hex(),
            "offerDigest": digest.hex(),
            "info": (PAYLOAD_INFO + digest).hex(),
            "recipientPrivate": CLAIM_SEAL_PRIVATE.hex(),
            "recipientPublic": claim.public.hex(),
            "plaintext": payload.encode().hex(),
            "sealed": seal_payload(payload, digest, claim.public).hex(),
        },
        "sealed-direct-v1": {
            "what": "a direct offer frame in the envelope-plus-payload form: {offer, payload}, canonical msgpack",
            "offerWire": wire.hex(),
            "payload": payload.encode().hex(),
            "frame": direct_form(wire, payload).hex(),
        },
        "sealed-result-v1": {
            "suite": "HPKE base mode: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, ChaCha20-Poly1305",
            "offerDigest": digest.hex(),
            "info": (RESULT_INFO + digest).hex(),
            "recipientPrivate": OFFER_SEAL_PRIVATE.hex(),
            "recipientPublic": offer.sealed.key.hex(),
            "plaintext": result_wire.hex(),
            "sealed": seal_result(result_wire, digest, offer.sealed.key).hex(),
        },
    }


def _vector(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((VECTORS / f"{name}.json").read_text())
    return loaded


def test_the_sealed_payload_vector_opens_for_the_sealed_offer_vector() -> None:
    vector = _vector("sealed-payload-v1")
    wire, offer = _sealed_offer_vector()
    assert vector["offerWire"] == wire.hex() and vector["offerDigest"] == hashlib.sha256(wire).hexdigest()
    assert offer.sealed is not None
    claim = SealKey.from_private_bytes(bytes.fromhex(vector["recipientPrivate"]))
    opened = open_payload(bytes.fromhex(vector["sealed"]), hashlib.sha256(wire).digest(), claim, offer.sealed)
    assert opened.encode().hex() == vector["plaintext"]
    assert msgpack.unpackb(bytes.fromhex(vector["plaintext"]))["input"] == {"xs": [1, 2, 3]}


def test_an_independent_implementation_opens_both_sealed_vectors() -> None:
    for name in ("sealed-payload-v1", "sealed-result-v1"):
        vector = _vector(name)
        plaintext = hpke_base_open(
            bytes.fromhex(vector["recipientPrivate"]), bytes.fromhex(vector["sealed"]), bytes.fromhex(vector["info"])
        )
        assert plaintext.hex() == vector["plaintext"], name


def test_the_independent_implementation_opens_what_we_seal_now() -> None:
    """Not only the committed bytes: a fresh seal, to a fresh key, opens the same way."""
    claim = X25519PrivateKey.generate()
    sealed = seal_payload(Payload("print(1)", [MARKER]), bytes(32), claim.public_key().public_bytes_raw())
    plaintext = hpke_base_open(claim.private_bytes_raw(), sealed, PAYLOAD_INFO + bytes(32))
    assert msgpack.unpackb(plaintext) == {"code": "print(1)", "input": [MARKER]}


def test_the_direct_form_vector_opens_to_the_sealed_offer_and_a_payload_that_matches_it() -> None:
    vector = _vector("sealed-direct-v1")
    wire, offer = _sealed_offer_vector()
    raw, payload = open_direct_form(bytes.fromhex(vector["frame"]), max_size=1 << 20)
    assert raw == wire and offer.sealed is not None
    payload.check(offer.sealed)
    assert msgpack.unpackb(bytes.fromhex(vector["frame"])) == {"offer": wire, "payload": payload.encode()}


def test_the_sealed_vectors_describe_the_committed_offer_and_result() -> None:
    """What `build` would write, ciphertext aside, is what is committed."""
    for name, fresh in build().items():
        committed = _vector(name)
        assert {k: v for k, v in committed.items() if k != "sealed"} == {
            k: v for k, v in fresh.items() if k != "sealed"
        }, name


if __name__ == "__main__" and "--write" in sys.argv:
    for name, vector in build().items():
        path: Path = VECTORS / f"{name}.json"
        path.write_text(json.dumps(vector, indent=2) + "\n")
        print("wrote", path)
