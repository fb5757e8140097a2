"""Properties of the offer and result codec: the first thing a hostile peer touches."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from executor.contract import ExecResult
from tests.strategies import NOW, OFFERER, exec_results, offers
from transports.wire.codec import Domain, pack, seal
from transports.wire.identity import NodeIdentity
from transports.wire.offers import ClockPolicy, TaskOffer, open_offer, parse_offer
from transports.wire.reasons import Reason, Rejected
from transports.wire.results import TaskResult, open_result

EXECUTOR = NodeIdentity(bytes(range(32, 64)))


def offer_at_now(**changes: object) -> TaskOffer:
    fields: dict[str, object] = {
        "offer_id": b"\x01" * 16,
        "offerer": OFFERER.public_key,
        "issued_at_ms": NOW,
        "expires_at_ms": NOW + 60_000,
        "language": "python",
        "code": "print(1)",
    }
    fields.update(changes)
    return TaskOffer(**fields)  # type: ignore[arg-type]


def reason_of(raw: bytes, **kw: object) -> Reason:
    with pytest.raises(Rejected) as info:
        open_offer(raw, now=NOW, **kw)  # type: ignore[arg-type]
    return info.value.reason


@given(offers())
def test_offer_round_trip(offer: TaskOffer) -> None:
    received = open_offer(offer.sign(OFFERER), now=NOW)
    assert received.offer == offer


@given(offers(), exec_results, st.none() | st.binary(min_size=32, max_size=32), st.integers(0, 1000))
def test_result_round_trip(offer: TaskOffer, result: ExecResult, digest: bytes | None, dropped: int) -> None:
    task_result = TaskResult.answering(offer, b"\x07" * 32, EXECUTOR.public_key, result)
    if task_result.version >= 2:
        task_result = dataclasses.replace(task_result, stream_digest=digest, stream_dropped=dropped)
    assert open_result(task_result.sign(EXECUTOR), expect_executor=EXECUTOR.public_key) == task_result


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(offers(), st.data())
def test_any_single_bit_flip_is_rejected(offer: TaskOffer, data: st.DataObject) -> None:
    raw = bytearray(offer.sign(OFFERER))
    bit = data.draw(st.integers(0, len(raw) * 8 - 1))
    raw[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(Rejected):
        open_offer(bytes(raw), now=NOW)


@given(st.binary(max_size=2048))
def test_arbitrary_bytes_only_ever_give_a_typed_rejection(raw: bytes) -> None:
    with pytest.raises(Rejected):
        open_offer(raw, now=NOW)
    with pytest.raises(Rejected):
        open_result(raw)


@given(
    st.recursive(
        st.none() | st.binary(max_size=8) | st.integers(-(2**63), 2**64 - 1),
        lambda c: st.lists(c, max_size=3),
    )
)
def test_arbitrary_msgpack_shapes_only_ever_give_a_typed_rejection(value: object) -> None:
    with pytest.raises(Rejected):
        open_offer(msgpack.packb(value), now=NOW)


# No deadline: a signature check is fast, but the shared machine stalls a single example now and then.
@settings(deadline=None)
@given(offers(), st.data())
def test_the_signature_covers_every_field(offer: TaskOffer, data: st.DataObject) -> None:
    """Change any one field, keep the original signature: it no longer verifies."""
    signed = msgpack.unpackb(offer.sign(OFFERER))
    signature = signed[1]
    fields = offer.to_wire_fields()
    name = data.draw(st.sampled_from(sorted(fields)))
    replacement: Any = {
        "version": 1,
        "offerId": b"\xee" * 16,
        "offerer": OFFERER.public_key,
        "issuedAt": fields["issuedAt"] + 1,
        "expiresAt": fields["expiresAt"] - 1,
        "language": "javascript" if fields["language"] == "python" else "python",
        "code": fields["code"] + " ",
        "input": [fields["input"]],
        "limits": {**fields["limits"], "memoryMb": fields["limits"]["memoryMb"] + 1},
        "sandbox": "host" if fields["sandbox"] == "docker" else "docker",
        "replyTo": [*fields["replyTo"], "/ip4/127.0.0.1/tcp/1"],
        "audience": {"to": OFFERER.peer_id} if "claim" in fields.get("audience", {}) else {"claim": list[str]()},
        "minIsolation": "runc" if fields.get("minIsolation") is None else None,
        "attempt": fields.get("attempt", 1) % 16 + 1,
        "queueDeadlineMs": fields["expiresAt"] if fields.get("queueDeadlineMs") is None else None,
        "follow": not fields.get("follow"),
    }[name]
    if name in ("version", "offerer"):  # changing these is rejected before the signature, as it must be
        return
    tampered = pack([pack({**fields, name: replacement}), signature])
    assert reason_of(tampered) == Reason.BAD_SIGNATURE


def test_version_is_checked_before_anything_else_in_the_body() -> None:
    raw = seal(Domain.OFFER, {"version": 4, "whatever": "the v4 shape is"}, OFFERER)
    assert reason_of(raw) == Reason.UNSUPPORTED_VERSION


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("attempt", 0),
        ("attempt", 17),
        ("attempt", True),
        ("follow", 1),
        ("queueDeadlineMs", NOW),  # not after issuedAt
        ("queueDeadlineMs", NOW + 60_001),  # after the offer expires
        ("queueDeadlineMs", -1),
    ],
)
def test_v3_fields_are_strict(name: str, value: object) -> None:
    raw = seal(Domain.OFFER, {**offer_at_now().to_wire_fields(), name: value}, OFFERER)
    assert reason_of(raw) == Reason.MALFORMED


def test_v3_fields_are_unknown_to_a_v2_offer() -> None:
    fields = {**offer_at_now(version=2).to_wire_fields(), "attempt": 1}
    assert reason_of(seal(Domain.OFFER, fields, OFFERER)) == Reason.MALFORMED
    with pytest.raises(ValueError):
        offer_at_now(version=2, follow=True).sign(OFFERER)


def test_a_v3_offer_is_answered_with_a_v2_result_and_older_ones_with_v1() -> None:
    result = ExecResult(ok=True, stdout="1\n", exit_code=0)
    for version, expected in ((1, 1), (2, 1), (3, 2)):
        audience = None if version == 1 else offer_at_now().audience
        offer = offer_at_now(version=version, audience=audience)
        answer = TaskResult.answering(offer, b"\x07" * 32, EXECUTOR.public_key, result)
        opened = open_result(answer.sign(EXECUTOR), expect_executor=EXECUTOR.public_key)
        assert opened.version == expected and opened.attempt == offer.attempt


def test_size_is_checked_before_parsing() -> None:
    assert reason_of(b"\xc0" * 300_000) == Reason.TOO_LARGE
    small_cap = offer_at_now(code="x" * 2000).sign(OFFERER)
    assert reason_of(small_cap, max_size=1000) == Reason.TOO_LARGE


@pytest.mark.parametrize(
    ("issued", "expires", "reason"),
    [
        (NOW - 120_000, NOW - 31_000, Reason.EXPIRED),
        (NOW + 31_000, NOW + 90_000, Reason.NOT_YET_VALID),
        (NOW, NOW + 600_001, Reason.TTL_TOO_LONG),
    ],
)
def test_clock(issued: int, expires: int, reason: Reason) -> None:
    raw = offer_at_now(issued_at_ms=issued, expires_at_ms=expires).sign(OFFERER)
    assert reason_of(raw) == reason


def test_clock_skew_within_policy_is_accepted() -> None:
    raw = offer_at_now(issued_at_ms=NOW + 29_000, expires_at_ms=NOW + 89_000).sign(OFFERER)
    open_offer(raw, now=NOW)
    assert reason_of(raw, clock=ClockPolicy(max_skew_ms=1_000)) == Reason.NOT_YET_VALID


def test_offer_expiring_before_issue_is_malformed() -> None:
    raw = seal(Domain.OFFER, {**offer_at_now().to_wire_fields(), "expiresAt": NOW - 1}, OFFERER)
    assert reason_of(raw) == Reason.MALFORMED


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("language", "ruby"),
        ("sandbox", "vm"),
        ("offerId", b"short"),
        ("code", 42),
        ("issuedAt", True),  # a bool is never an int
        ("issuedAt", -1),
        ("input", b"bytes cannot become JSON"),
        ("input", float("nan")),
        ("limits", {"timeoutMs": 1, "memoryMb": 1}),
        ("limits", {"timeoutMs": 0, "memoryMb": 1, "milliCpus": 1}),
        ("replyTo", "not a list"),
        ("origin", "local"),  # an offer never carries an origin: an unknown field is refused
    ],
)
def test_strict_types(name: str, value: object) -> None:
    raw = seal(Domain.OFFER, {**offer_at_now().to_wire_fields(), name: value}, OFFERER)
    assert reason_of(raw) == Reason.MALFORMED


def test_deep_nesting_is_malformed_not_a_crash() -> None:
    deep: list[object] = []
    for _ in range(40):
        deep = [deep]
    raw = seal(Domain.OFFER, {**offer_at_now().to_wire_fields(), "input": deep}, OFFERER)
    assert reason_of(raw) == Reason.MALFORMED
    assert reason_of(b"\x91" * 5000 + b"\x90") == Reason.MALFORMED


def test_non_canonical_encodings_are_refused() -> None:
    good = offer_at_now().sign(OFFERER)
    body, signature = msgpack.unpackb(good)
    # The same body with its keys in another order: one value, a second byte string.
    reordered = msgpack.packb(dict(reversed(list(msgpack.unpackb(body).items()))), use_bin_type=True)
    assert reason_of(msgpack.packb([reordered, signature], use_bin_type=True)) == Reason.MALFORMED
    # A non-minimal length prefix on the envelope's array.
    assert reason_of(b"\xdc\x00\x02" + good[1:]) == Reason.MALFORMED


def test_a_result_signature_never_passes_as_an_offer_signature() -> None:
    """Same key, same body bytes, other domain: the domain separation is what refuses it."""
    offer = offer_at_now()
    body = pack(offer.to_wire_fields())
    cross = pack([body, OFFERER.sign(Domain.RESULT + b"\x00" + body)])
    assert reason_of(cross) == Reason.BAD_SIGNATURE
    naked = pack([body, OFFERER.sign(body)])  # no domain at all, as a careless signer would do
    assert reason_of(naked) == Reason.BAD_SIGNATURE


def test_result_from_someone_other_than_the_claimant_is_refused() -> None:
    result = TaskResult(b"\x01" * 16, b"\x02" * 32, EXECUTOR.public_key, ExecResult(ok=True), NOW)
    with pytest.raises(Rejected) as info:
        open_result(result.sign(EXECUTOR), expect_executor=OFFERER.public_key)
    assert info.value.reason == Reason.WRONG_EXECUTOR


def test_result_with_forged_executor_field_is_refused() -> None:
    result = TaskResult(b"\x01" * 16, b"\x02" * 32, EXECUTOR.public_key, ExecResult(ok=True), NOW)
    forged = seal(Domain.RESULT, result.to_wire_fields(), OFFERER)  # signed by someone else
    with pytest.raises(Rejected) as info:
        open_result(forged)
    assert info.value.reason == Reason.BAD_SIGNATURE


def test_parse_does_no_signature_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parsing is the cheap part: the one signature check happens in `signature_valid`, and only there."""
    import transports.wire.codec

    calls: list[bytes] = []
    real = transports.wire.codec.verify

    def counting(public_key: bytes, signature: bytes, message: bytes) -> bool:
        calls.append(message)
        return real(public_key, signature, message)

    monkeypatch.setattr(transports.wire.codec, "verify", counting)
    received = parse_offer(offer_at_now().sign(OFFERER))
    assert calls == []
    assert received.digest == hashlib.sha256(received.raw).digest()
    assert received.signature_valid() and len(calls) == 1
