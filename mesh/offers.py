"""`TaskOffer` and `TaskResult`: the two signed messages of the mesh, and their wire codec.

An offer never carries an origin: origin is what the receiving intake decides. An offer may ask for `host`, so that
the executor can be seen to refuse it.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

from executor.contract import LANGUAGES, SANDBOXES, ErrorKind, ExecResult, Language, Limits, SandboxKind
from mesh.codec import DEFAULT_MAX_MESSAGE_BYTES, Domain, Envelope, Fields, open_envelope, seal
from mesh.identity import PUBLIC_KEY_SIZE, NodeIdentity
from mesh.reasons import Reason, Rejected

PROTOCOL_VERSION = 1
OFFER_ID_SIZE = 16
DIGEST_SIZE = 32
MAX_CODE_CHARS = 128 * 1024
MAX_OUTPUT_CHARS = 96 * 1024  # room for the executor's 64 KiB byte cap after utf-8 replacement
MAX_REPLY_ADDRS = 8
MAX_ADDR_CHARS = 256
# Two 64 KiB output streams can triple in size as utf-8 once invalid bytes become U+FFFD, so results get more room.
MAX_RESULT_BYTES = 512 * 1024

_OFFER_FIELDS = frozenset(
    {
        "version",
        "offerId",
        "offerer",
        "issuedAt",
        "expiresAt",
        "language",
        "code",
        "input",
        "limits",
        "sandbox",
        "replyTo",
    }
)
_LIMIT_FIELDS = frozenset({"timeoutMs", "memoryMb", "milliCpus"})
_RESULT_FIELDS = frozenset(
    {
        "version",
        "offerId",
        "offerDigest",
        "executor",
        "completedAt",
        "ok",
        "stdout",
        "stderr",
        "exitCode",
        "durationMs",
        "queueForCloud",
        "queueReason",
        "errorKind",
        "stdoutTruncated",
        "stderrTruncated",
    }
)
_ERROR_KINDS = tuple(str(k) for k in ErrorKind)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class ClockPolicy:
    max_ttl_ms: int = 10 * 60 * 1000
    max_skew_ms: int = 30 * 1000


@dataclass(frozen=True, slots=True)
class TaskOffer:
    offer_id: bytes
    offerer: bytes
    issued_at_ms: int
    expires_at_ms: int
    language: Language
    code: str
    input: Any = None
    limits: Limits = field(default_factory=Limits)
    sandbox: SandboxKind = "docker"
    # Multiaddrs where the offerer takes claims and results. Empty when the reply rides the delivering link (BLE).
    reply_to: tuple[str, ...] = ()
    version: int = PROTOCOL_VERSION

    @classmethod
    def create(
        cls,
        offerer: NodeIdentity,
        *,
        language: Language,
        code: str,
        input: Any = None,
        limits: Limits | None = None,
        sandbox: SandboxKind = "docker",
        ttl_ms: int = 60_000,
        reply_to: tuple[str, ...] = (),
        issued_at_ms: int | None = None,
    ) -> TaskOffer:
        issued = now_ms() if issued_at_ms is None else issued_at_ms
        return cls(
            offer_id=os.urandom(OFFER_ID_SIZE),
            offerer=offerer.public_key,
            issued_at_ms=issued,
            expires_at_ms=issued + ttl_ms,
            language=language,
            code=code,
            input=input,
            limits=limits or Limits(),
            sandbox=sandbox,
            reply_to=tuple(reply_to),
        )

    def to_wire_fields(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "offerId": self.offer_id,
            "offerer": self.offerer,
            "issuedAt": self.issued_at_ms,
            "expiresAt": self.expires_at_ms,
            "language": self.language,
            "code": self.code,
            "input": self.input,
            "limits": {
                "timeoutMs": self.limits.timeout_ms,
                "memoryMb": self.limits.memory_mb,
                "milliCpus": round(self.limits.cpus * 1000),
            },
            "sandbox": self.sandbox,
            "replyTo": list(self.reply_to),
        }

    def sign(self, identity: NodeIdentity) -> bytes:
        if identity.public_key != self.offerer:
            raise ValueError("an offer is signed by its offerer")
        return seal(Domain.OFFER, self.to_wire_fields(), identity)


@dataclass(frozen=True, slots=True)
class ReceivedOffer:
    """An offer that has passed size, decode, shape and version checks. Its signature is not yet checked."""

    offer: TaskOffer
    envelope: Envelope
    raw: bytes

    @property
    def digest(self) -> bytes:
        return hashlib.sha256(self.raw).digest()

    def signature_valid(self) -> bool:
        return self.envelope.signature_valid(self.offer.offerer)


def _require_version(envelope: Envelope, what: str) -> int:
    """The version is read before the shape: a newer version may well have another shape."""
    version = envelope.fields.get("version")
    if type(version) is not int:
        raise Rejected(Reason.MALFORMED, f"{what}: 'version' must be an integer")
    if version != PROTOCOL_VERSION:
        raise Rejected(Reason.UNSUPPORTED_VERSION, f"{what} version {version}; this node speaks {PROTOCOL_VERSION}")
    return version


def parse_offer(raw: bytes, *, max_size: int = DEFAULT_MAX_MESSAGE_BYTES) -> ReceivedOffer:
    envelope = open_envelope(Domain.OFFER, raw, max_size=max_size)
    version = _require_version(envelope, "offer")
    f = Fields(envelope.fields, _OFFER_FIELDS, "offer")
    lf = Fields(f.map("limits"), _LIMIT_FIELDS, "offer.limits")
    limits = Limits(
        timeout_ms=lf.integer("timeoutMs", 1, 24 * 3600 * 1000),
        memory_mb=lf.integer("memoryMb", 1, 1 << 20),
        cpus=lf.integer("milliCpus", 1, 1 << 20) / 1000,
    )
    offer = TaskOffer(
        version=version,
        offer_id=f.binary("offerId", OFFER_ID_SIZE),
        offerer=f.binary("offerer", PUBLIC_KEY_SIZE),
        issued_at_ms=f.integer("issuedAt"),
        expires_at_ms=f.integer("expiresAt"),
        language=f.text("language", 16, choices=LANGUAGES),  # type: ignore[arg-type]
        code=f.text("code", MAX_CODE_CHARS),
        input=f.json_data("input"),
        limits=limits,
        sandbox=f.text("sandbox", 16, choices=SANDBOXES),  # type: ignore[arg-type]
        reply_to=f.str_list("replyTo", MAX_REPLY_ADDRS, MAX_ADDR_CHARS),
    )
    if offer.expires_at_ms <= offer.issued_at_ms:
        raise Rejected(Reason.MALFORMED, "offer expires before it is issued")
    return ReceivedOffer(offer, envelope, bytes(raw))


def check_clock(offer: TaskOffer, *, now: int | None = None, policy: ClockPolicy = ClockPolicy()) -> None:
    now = now_ms() if now is None else now
    if offer.expires_at_ms - offer.issued_at_ms > policy.max_ttl_ms:
        raise Rejected(Reason.TTL_TOO_LONG, f"lifetime over {policy.max_ttl_ms} ms")
    if now > offer.expires_at_ms + policy.max_skew_ms:
        raise Rejected(Reason.EXPIRED, f"expired {now - offer.expires_at_ms} ms ago")
    if offer.issued_at_ms > now + policy.max_skew_ms:
        raise Rejected(Reason.NOT_YET_VALID, f"issued {offer.issued_at_ms - now} ms in the future")


def open_offer(
    raw: bytes,
    *,
    now: int | None = None,
    clock: ClockPolicy = ClockPolicy(),
    max_size: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> ReceivedOffer:
    """Every codec check in the intake's order, signature last. Raises `Rejected`, nothing else."""
    received = parse_offer(raw, max_size=max_size)
    check_clock(received.offer, now=now, policy=clock)
    if not received.signature_valid():
        raise Rejected(Reason.BAD_SIGNATURE, "offer signature does not verify against its offerer")
    return received


# -- results -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TaskResult:
    offer_id: bytes
    offer_digest: bytes
    executor: bytes
    result: ExecResult
    completed_at_ms: int = field(default_factory=now_ms)
    version: int = PROTOCOL_VERSION

    def to_wire_fields(self) -> dict[str, Any]:
        r = self.result.to_json()
        return {
            "version": self.version,
            "offerId": self.offer_id,
            "offerDigest": self.offer_digest,
            "executor": self.executor,
            "completedAt": self.completed_at_ms,
            **r,
        }

    def sign(self, identity: NodeIdentity) -> bytes:
        if identity.public_key != self.executor:
            raise ValueError("a result is signed by its executor")
        return seal(Domain.RESULT, self.to_wire_fields(), identity)

    def to_json(self) -> dict[str, Any]:
        """The verified result as the CLI prints it: the contract's names, ids in hex."""
        return {
            **self.result.to_json(),
            "offerId": self.offer_id.hex(),
            "executor": self.executor.hex(),
        }


def open_result(raw: bytes, *, expect_executor: bytes | None = None, max_size: int = MAX_RESULT_BYTES) -> TaskResult:
    """Decode and verify a result. With `expect_executor`, the result must come from that key (the claimant)."""
    envelope = open_envelope(Domain.RESULT, raw, max_size=max_size)
    version = _require_version(envelope, "result")
    f = Fields(envelope.fields, _RESULT_FIELDS, "result")
    kind = f.opt_text("errorKind", 32, choices=_ERROR_KINDS)
    result = TaskResult(
        version=version,
        offer_id=f.binary("offerId", OFFER_ID_SIZE),
        offer_digest=f.binary("offerDigest", DIGEST_SIZE),
        executor=f.binary("executor", PUBLIC_KEY_SIZE),
        completed_at_ms=f.integer("completedAt"),
        result=ExecResult(
            ok=f.boolean("ok"),
            stdout=f.text("stdout", MAX_OUTPUT_CHARS),
            stderr=f.text("stderr", MAX_OUTPUT_CHARS),
            exit_code=f.opt_integer("exitCode", -(2**31), 2**31),
            duration_ms=f.integer("durationMs"),
            queue_for_cloud=f.boolean("queueForCloud"),
            queue_reason=f.opt_text("queueReason", 64),
            error_kind=None if kind is None else ErrorKind(kind),
            stdout_truncated=f.boolean("stdoutTruncated"),
            stderr_truncated=f.boolean("stderrTruncated"),
        ),
    )
    if expect_executor is not None and result.executor != expect_executor:
        raise Rejected(Reason.WRONG_EXECUTOR, "result signed by a key other than the claimant's")
    if not envelope.signature_valid(result.executor):
        raise Rejected(Reason.BAD_SIGNATURE, "result signature does not verify against its executor")
    return result
