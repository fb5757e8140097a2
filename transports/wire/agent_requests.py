"""Signed agent requests: who sent this HTTP request, when, and is it the only time it is sent.

Every agent request carries five headers. The signature is Ed25519 by the agent's node identity over
`DOMAIN || 0x00 || pack([method, target, timestamp_ms, nonce, sha256(body), agent_public_key])`, where `pack` is the
project's canonical msgpack: a list of typed values has exactly one encoding, so no field can bleed into the next
(as it could in a delimiter-joined string). The domain keeps a request signature from ever passing as an offer's,
a result's or libp2p's.

This module is shared by the coordinator (verify) and the node's pull transport (sign), and imports nothing heavier
than the identity module.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from transports.wire.codec import now_ms, pack
from transports.wire.coordinator_errors import CoordinatorReason, Refused
from transports.wire.identity import PUBLIC_KEY_SIZE, SIGNATURE_SIZE, NodeIdentity, verify

DOMAIN = b"edgecoder-mesh/coordinator-request/v1"
MAX_SKEW_MS = 120_000
NONCE_TTL_MS = 300_000  # longer than twice the skew: a request too old to be skewed-refused is never forgotten
NONCE_SIZE = 16

AGENT = "x-edgecoder-agent"
TIMESTAMP = "x-edgecoder-timestamp"
NONCE = "x-edgecoder-nonce"
BODY_SHA256 = "x-edgecoder-body-sha256"
SIGNATURE = "x-edgecoder-signature"
HEADERS = (AGENT, TIMESTAMP, NONCE, BODY_SHA256, SIGNATURE)


def signed_message(
    method: str, target: str, timestamp_ms: int, nonce: bytes, body_sha256: bytes, agent: bytes
) -> bytes:
    return DOMAIN + b"\x00" + pack([method.upper(), target, timestamp_ms, nonce, body_sha256, agent])


def sign_request(
    identity: NodeIdentity,
    method: str,
    target: str,
    body: bytes,
    *,
    timestamp_ms: int | None = None,
    nonce: bytes | None = None,
) -> dict[str, str]:
    """The headers that authenticate one request. `target` is the path, with `?query` if there is one."""
    ts = now_ms() if timestamp_ms is None else timestamp_ms
    nonce = os.urandom(NONCE_SIZE) if nonce is None else nonce
    digest = hashlib.sha256(body).digest()
    signature = identity.sign(signed_message(method, target, ts, nonce, digest, identity.public_key))
    return {
        AGENT: identity.public_key.hex(),
        TIMESTAMP: str(ts),
        NONCE: nonce.hex(),
        BODY_SHA256: digest.hex(),
        SIGNATURE: signature.hex(),
    }


@dataclass(frozen=True, slots=True)
class VerifiedRequest:
    agent: bytes
    nonce: bytes
    timestamp_ms: int


def _hex_field(headers: dict[str, str], name: str, size: int | None) -> bytes:
    try:
        value = bytes.fromhex(headers[name])
    except ValueError:
        raise Refused(CoordinatorReason.MALFORMED, f"header {name} is not hex") from None
    if size is not None and len(value) != size:
        raise Refused(CoordinatorReason.MALFORMED, f"header {name} is not {size} bytes")
    return value


def verify_request(
    headers: dict[str, str], method: str, target: str, body: bytes, *, now: int | None = None
) -> VerifiedRequest:
    """Presence, shape, clock, digest and signature, cheapest first. The nonce's freshness is the caller's: it
    needs the store. Raises `Refused`."""
    missing = [h for h in HEADERS if h not in headers]
    if missing:
        raise Refused(CoordinatorReason.UNSIGNED, f"missing header {missing[0]}")
    agent = _hex_field(headers, AGENT, PUBLIC_KEY_SIZE)
    nonce = _hex_field(headers, NONCE, None)
    if not 8 <= len(nonce) <= 64:
        raise Refused(CoordinatorReason.MALFORMED, "nonce must be 8 to 64 bytes")
    claimed_digest = _hex_field(headers, BODY_SHA256, 32)
    signature = _hex_field(headers, SIGNATURE, SIGNATURE_SIZE)
    raw_ts = headers[TIMESTAMP]
    if not raw_ts.isascii() or not raw_ts.isdigit() or len(raw_ts) > 16:
        raise Refused(CoordinatorReason.MALFORMED, "timestamp must be milliseconds since the epoch")
    timestamp = int(raw_ts)
    now = now_ms() if now is None else now
    if abs(now - timestamp) > MAX_SKEW_MS:
        raise Refused(CoordinatorReason.SKEWED, f"timestamp is {now - timestamp} ms from the coordinator's clock")
    digest = hashlib.sha256(body).digest()
    if digest != claimed_digest:
        raise Refused(CoordinatorReason.BAD_SIGNATURE, "body does not match its sha256 header")
    if not verify(agent, signature, signed_message(method, target, timestamp, nonce, digest, agent)):
        raise Refused(CoordinatorReason.BAD_SIGNATURE, "request signature does not verify against the agent key")
    return VerifiedRequest(agent, nonce, timestamp)


# -- coordinator responses -------------------------------------------------------------------------------------
# A coordinator started with --key signs its /pull answers, bound to the request's nonce so that an old answer
# cannot be replayed to the agent. The offers inside are signed by their offerers anyway; this lets an agent pin the
# coordinator it meant to pull from.

RESPONSE_DOMAIN = b"edgecoder-mesh/coordinator-response/v1"
COORDINATOR_SIGNATURE = "x-edgecoder-coordinator-signature"


def _response_message(request_nonce: bytes, body: bytes) -> bytes:
    return RESPONSE_DOMAIN + b"\x00" + pack([request_nonce, hashlib.sha256(body).digest()])


def sign_response(identity: NodeIdentity, request_nonce: bytes, body: bytes) -> str:
    return identity.sign(_response_message(request_nonce, body)).hex()


def response_signature_valid(public_key: bytes, signature_hex: str | None, request_nonce: bytes, body: bytes) -> bool:
    if signature_hex is None:
        return False
    try:
        signature = bytes.fromhex(signature_hex)
    except ValueError:
        return False
    return verify(public_key, signature, _response_message(request_nonce, body))
