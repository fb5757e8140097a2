"""Request signing, token buckets and release dispositions, in-process."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mesh.coordinator.release import disposition_of
from transports.wire import agent_requests as signing
from transports.wire.coordinator_errors import Refused
from transports.wire.identity import NodeIdentity
from transports.wire.reasons import Reason

IDENTITY = NodeIdentity(bytes(range(32)))
NOW = 1_800_000_000_000


def headers(body: bytes = b"{}", **kw: Any) -> dict[str, str]:
    return signing.sign_request(IDENTITY, "POST", "/pull", body, timestamp_ms=NOW, **kw)


def reason_of(hdrs: dict[str, str], *, method: str = "POST", target: str = "/pull", body: bytes = b"{}") -> str:
    try:
        signing.verify_request(hdrs, method, target, body, now=NOW)
    except Refused as exc:
        return exc.reason
    return "ok"


def test_round_trip() -> None:
    verified = signing.verify_request(headers(), "post", "/pull", b"{}", now=NOW + signing.MAX_SKEW_MS)
    assert verified.agent == IDENTITY.public_key


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"method": "PUT"}, "bad_signature"),
        ({"target": "/pull?x=1"}, "bad_signature"),
        ({"body": b"{ }"}, "bad_signature"),
    ],
)
def test_every_signed_part_is_covered(change: dict[str, Any], reason: str) -> None:
    assert reason_of(headers(), **change) == reason


@pytest.mark.parametrize("name", signing.HEADERS)
def test_missing_header_is_unsigned(name: str) -> None:
    hdrs = headers()
    del hdrs[name]
    assert reason_of(hdrs) == "unsigned"


@given(st.sampled_from([signing.AGENT, signing.NONCE, signing.BODY_SHA256, signing.SIGNATURE]), st.data())
def test_any_flipped_bit_in_a_header_is_refused(name: str, data: st.DataObject) -> None:
    hdrs = headers()
    raw = bytearray(bytes.fromhex(hdrs[name]))
    index = data.draw(st.integers(0, len(raw) - 1))
    raw[index] ^= 1 << data.draw(st.integers(0, 7))
    hdrs[name] = raw.hex()
    assert reason_of(hdrs) in ("bad_signature", "malformed")


def test_timestamp_change_and_skew() -> None:
    hdrs = headers()
    hdrs[signing.TIMESTAMP] = str(NOW + 1)
    assert reason_of(hdrs) == "bad_signature"
    stale = signing.sign_request(IDENTITY, "POST", "/pull", b"{}", timestamp_ms=NOW - signing.MAX_SKEW_MS - 1)
    assert reason_of(stale) == "skewed"


def test_domain_keeps_request_signatures_apart() -> None:
    message = signing.signed_message("POST", "/pull", NOW, b"n" * 16, b"d" * 32, IDENTITY.public_key)
    assert message.startswith(b"edgecoder-mesh/coordinator-request/v1\x00")
    assert signing.RESPONSE_DOMAIN != signing.DOMAIN


def test_response_signature_is_bound_to_the_request_nonce() -> None:
    sig = signing.sign_response(IDENTITY, b"a" * 16, b'{"task": null}')
    assert signing.response_signature_valid(IDENTITY.public_key, sig, b"a" * 16, b'{"task": null}')
    assert not signing.response_signature_valid(IDENTITY.public_key, sig, b"b" * 16, b'{"task": null}')
    assert not signing.response_signature_valid(IDENTITY.public_key, None, b"a" * 16, b'{"task": null}')
    assert not signing.response_signature_valid(IDENTITY.public_key, "zz", b"a" * 16, b'{"task": null}')


def test_every_reason_has_a_disposition() -> None:
    for reason in Reason:
        assert disposition_of(reason) in ("failed", "requeue_elsewhere", "requeue")
    assert disposition_of(Reason.SANDBOX_REQUIRED) == "failed"
    assert disposition_of(Reason.REPLAYED) == "requeue_elsewhere"
    assert disposition_of(Reason.BUSY) == "requeue"
