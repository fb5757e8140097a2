"""`TaskOffer`: the signed offer of work, the first of the mesh's two signed messages (the other, `TaskResult`, is in
transports/wire/results.py), and its wire codec.

An offer never carries an origin: origin is what the receiving intake decides. An offer may ask for `host`, so that
the executor can be seen to refuse it.

Version 2 is a v1 offer plus the signed `audience` (who may run it: one node it was sent to directly, or whoever
the offerer grants a claim to, optionally only among named invitees) and `minIsolation` (the weakest sandbox tier the
offerer accepts). Version 3 (the version this round's features share: jobs, runtimes, sealed offers add their fields
here) adds the job's lifecycle: `attempt` (which try of one job this issue is, 1 first; a re-offer after a runner's
fault counts up), `queueDeadlineMs` (the Unix time in ms until which a busy runner may hold the offer in its queue
instead of refusing `busy`; null: refuse at once) and `follow` (the offerer wants the program's output as it comes,
on the stream the offer came on), and what it needs of its runner: `runtime`, `runtimeDigest` and `minResources`
(transports/wire/needs.py; on the wire only when set). Versions 1 and 2 are still accepted, with no audience (v1),
no minimum (v1), first attempt, no queueing, no stream and no needs (the `python` runtime, on any node).

Results, the answers to offers, are in transports/wire/results.py.

Version 3 also has `sealed` (`transports.wire.sealed`), present only in a sealed offer, which then carries no `code`
and no `input` field but their digests and sizes and the offerer's ephemeral X25519 key: the payload reaches the
granted runner alone. An offer without `sealed` carries its code and input as before.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass, field
from typing import Any

from executor.contract import (
    LANGUAGES,
    SANDBOXES,
    Language,
    Limits,
    SandboxKind,
)
from transports.wire.codec import DEFAULT_MAX_MESSAGE_BYTES, Domain, Envelope, Fields, now_ms, open_envelope, seal
from transports.wire.identity import PUBLIC_KEY_SIZE, NodeIdentity
from transports.wire.needs import NEED_FIELDS, Needs
from transports.wire.reasons import Reason, Rejected
from transports.wire.sealed import Payload, SealedTerms

OFFER_VERSION = 3
OFFER_VERSIONS = (1, 2, 3)
RESULT_VERSION = 2
RESULT_VERSIONS = (1, 2)
# A job is tried at most this many times (issue 23: a runner's fault is retried elsewhere, 3 times by default).
MAX_ATTEMPTS = 16
OFFER_ID_SIZE = 16
DIGEST_SIZE = 32
MAX_CODE_CHARS = 128 * 1024
MAX_OUTPUT_CHARS = 96 * 1024  # room for the executor's 64 KiB byte cap after utf-8 replacement
MAX_REPLY_ADDRS = 8
MAX_ADDR_CHARS = 256
MAX_INVITEES = 8
MAX_PEER_ID_CHARS = 64
# The sandbox tiers, weakest first: an offer's `minIsolation` is met by its own tier and any after it.
ISOLATION_TIERS = ("runc", "gvisor")
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
_OFFER_FIELDS_V2 = _OFFER_FIELDS | {"audience", "minIsolation"}
_OFFER_FIELDS_V3 = _OFFER_FIELDS_V2 | {"attempt", "queueDeadlineMs", "follow", "sealed"} | NEED_FIELDS
_OFFER_FIELDS_BY_VERSION = {1: _OFFER_FIELDS, 2: _OFFER_FIELDS_V2, 3: _OFFER_FIELDS_V3}
_LIMIT_FIELDS = frozenset({"timeoutMs", "memoryMb", "milliCpus"})


def meets(tier: str, minimum: str | None) -> bool:
    """Whether sandbox tier `tier` is at least `minimum` (None: any tier)."""
    return minimum is None or (
        tier in ISOLATION_TIERS and ISOLATION_TIERS.index(tier) >= ISOLATION_TIERS.index(minimum)
    )


@dataclass(frozen=True, slots=True)
class Audience:
    """Who may run an offer, signed into it, so that it cannot be replayed to anyone else.

    - `to`: sent directly to this one PeerID; only that node runs it, and only when the offer reached it directly.
    - otherwise claimed: it runs where the offerer grants a claim (gossip, BLE, a coordinator's lease), never when
      it arrives on a direct stream. `invited` non-empty: only these PeerIDs may claim it (the rest refuse it at
      once, `not_invited`), so that claims per offer do not grow with the mesh.
    """

    to: str | None = None
    invited: tuple[str, ...] = ()

    @classmethod
    def direct(cls, peer_id: str) -> Audience:
        return cls(to=peer_id)

    @classmethod
    def claimed(cls, invited: tuple[str, ...] | list[str] = ()) -> Audience:
        if len(invited) > MAX_INVITEES:
            raise ValueError(f"an offer invites at most {MAX_INVITEES} claimants")
        return cls(invited=tuple(invited))

    @property
    def is_direct(self) -> bool:
        return self.to is not None

    def to_wire(self) -> dict[str, Any]:
        return {"to": self.to} if self.to is not None else {"claim": list(self.invited)}

    @classmethod
    def from_wire(cls, value: dict[str, Any]) -> Audience:
        f = Fields(value, frozenset({"to", "claim"}), "offer.audience")
        if len(value) != 1:
            raise Rejected(Reason.MALFORMED, "offer.audience: exactly one of 'to' or 'claim'")
        if "to" in value:
            return cls(to=_peer_id_text(f.text("to", MAX_PEER_ID_CHARS), "offer.audience.to"))
        invited = f.str_list("claim", MAX_INVITEES, MAX_PEER_ID_CHARS)
        if len(set(invited)) != len(invited):
            raise Rejected(Reason.MALFORMED, "offer.audience.claim names a PeerID twice")
        return cls(invited=tuple(_peer_id_text(p, "offer.audience.claim") for p in invited))


def _peer_id_text(text: str, where: str) -> str:
    """A base58btc PeerID (no libp2p import: the codec must stay light). Its key is checked where it matters."""
    if not 40 <= len(text) <= MAX_PEER_ID_CHARS or not set(text) <= _BASE58:
        raise Rejected(Reason.MALFORMED, f"{where}: {text[:64]!r} is not a PeerID")
    return text


_BASE58 = frozenset("123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz")


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
    # v2: who may run it; None only on a v1 offer (any transport, no claim needed beyond the transport's own).
    audience: Audience | None = field(default_factory=Audience)
    # v2: the weakest sandbox tier the offerer accepts; None is any.
    min_isolation: str | None = None
    # v3: which try of the job this is (1 first), until when a busy runner may queue it (Unix ms; None: refuse
    # busy at once), and whether the offerer wants the output streamed as it comes.
    attempt: int = 1
    queue_deadline_ms: int | None = None
    follow: bool = False
    # v3: the terms of a sealed offer, whose `code` is then "" and `input` None (the payload comes after the grant).
    sealed: SealedTerms | None = None
    # v3: the runtime (by name, optionally by digest) and the minimum resources it needs; empty: `python`, any node.
    needs: Needs = field(default_factory=Needs)
    version: int = OFFER_VERSION

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
        audience: Audience | None = None,
        min_isolation: str | None = None,
        attempt: int = 1,
        queue_deadline_ms: int | None = None,
        follow: bool = False,
        needs: Needs | None = None,
    ) -> TaskOffer:
        """A version 3 offer; `audience` defaults to claimed by anyone (gossip, BLE, a coordinator)."""
        if min_isolation is not None and min_isolation not in ISOLATION_TIERS:
            raise ValueError(f"minIsolation must be one of {ISOLATION_TIERS}")
        if not 1 <= attempt <= MAX_ATTEMPTS:
            raise ValueError(f"attempt must be in [1, {MAX_ATTEMPTS}]")
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
            audience=audience or Audience(),
            min_isolation=min_isolation,
            attempt=attempt,
            queue_deadline_ms=queue_deadline_ms,
            follow=follow,
            needs=needs or Needs(),
        )

    @property
    def payload(self) -> Payload:
        """The code and input a clear offer carries (a sealed one's are only known once its payload is opened)."""
        return Payload(self.code, self.input)

    def sealed_with(self, key: bytes) -> TaskOffer:
        """The sealed form of this clear offer: its payload's terms and `key` (the offerer's ephemeral X25519 public
        key) instead of its code and input. The offerer keeps `payload` to send to the runner it grants."""
        if self.sealed is not None:
            raise ValueError("this offer is sealed already")
        return dataclasses.replace(self, version=3, code="", input=None, sealed=self.payload.terms(key))

    def opened(self, payload: Payload) -> TaskOffer:
        """This sealed offer with its checked payload in place, for the executor."""
        if self.sealed is None:
            raise ValueError("only a sealed offer is opened")
        payload.check(self.sealed)
        return dataclasses.replace(self, code=payload.code, input=payload.input)

    def to_wire_fields(self) -> dict[str, Any]:
        clear = {"code": self.code, "input": self.input} if self.sealed is None else {"sealed": self.sealed.to_wire()}
        return {
            "version": self.version,
            "offerId": self.offer_id,
            "offerer": self.offerer,
            "issuedAt": self.issued_at_ms,
            "expiresAt": self.expires_at_ms,
            "language": self.language,
            **clear,
            "limits": {
                "timeoutMs": self.limits.timeout_ms,
                "memoryMb": self.limits.memory_mb,
                "milliCpus": round(self.limits.cpus * 1000),
            },
            "sandbox": self.sandbox,
            "replyTo": list(self.reply_to),
            **(
                {}
                if self.version == 1
                else {
                    "audience": (self.audience or Audience()).to_wire(),
                    "minIsolation": self.min_isolation,
                }
            ),
            **(
                {"attempt": self.attempt, "queueDeadlineMs": self.queue_deadline_ms, "follow": self.follow}
                if self.version >= 3
                else {}
            ),
            **(self.needs.to_wire() if self.version >= 3 else {}),
        }

    def sign(self, identity: NodeIdentity) -> bytes:
        if identity.public_key != self.offerer:
            raise ValueError("an offer is signed by its offerer")
        if self.version == 1 and (self.audience is not None or self.min_isolation is not None):
            raise ValueError("a version 1 offer carries no audience and no minIsolation")
        if self.version < 3 and (self.attempt != 1 or self.queue_deadline_ms is not None or self.follow):
            raise ValueError("a version 1 or 2 offer carries no attempt, queueDeadlineMs or follow")
        if self.sealed is not None and (self.version < 3 or self.code or self.input is not None):
            raise ValueError("a sealed offer is version 3 and carries no code and no input")
        if self.version < 3 and not self.needs.empty:
            raise ValueError("a version 1 or 2 offer carries no runtime and no minResources")
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


def require_version(envelope: Envelope, what: str, versions: tuple[int, ...]) -> int:
    """The version is read before the shape: a newer version may well have another shape."""
    version = envelope.fields.get("version")
    if type(version) is not int:
        raise Rejected(Reason.MALFORMED, f"{what}: 'version' must be an integer")
    if version not in versions:
        spoken = " and ".join(str(v) for v in versions)
        raise Rejected(Reason.UNSUPPORTED_VERSION, f"{what} version {version}; this node speaks {spoken}")
    return version


def parse_offer(raw: bytes, *, max_size: int = DEFAULT_MAX_MESSAGE_BYTES) -> ReceivedOffer:
    envelope = open_envelope(Domain.OFFER, raw, max_size=max_size)
    version = require_version(envelope, "offer", OFFER_VERSIONS)
    f = Fields(envelope.fields, _OFFER_FIELDS_BY_VERSION[version], "offer")
    sealed = SealedTerms.from_wire(f.map("sealed")) if "sealed" in f.data else None
    if sealed is not None and ("code" in f.data or "input" in f.data):
        raise Rejected(Reason.MALFORMED, "offer: a sealed offer carries no code and no input")
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
        code="" if sealed is not None else f.text("code", MAX_CODE_CHARS),
        input=None if sealed is not None else f.json_data("input"),
        limits=limits,
        sandbox=f.text("sandbox", 16, choices=SANDBOXES),  # type: ignore[arg-type]
        reply_to=f.str_list("replyTo", MAX_REPLY_ADDRS, MAX_ADDR_CHARS),
        audience=None if version == 1 else Audience.from_wire(f.map("audience")),
        min_isolation=None if version == 1 else f.opt_text("minIsolation", 16, choices=ISOLATION_TIERS),
        attempt=1 if version < 3 else f.integer("attempt", 1, MAX_ATTEMPTS),
        queue_deadline_ms=None if version < 3 else f.opt_integer("queueDeadlineMs"),
        follow=False if version < 3 else f.boolean("follow"),
        sealed=sealed,
        needs=Needs() if version < 3 else Needs.from_wire(envelope.fields),
    )
    if offer.expires_at_ms <= offer.issued_at_ms:
        raise Rejected(Reason.MALFORMED, "offer expires before it is issued")
    deadline = offer.queue_deadline_ms
    if deadline is not None and not offer.issued_at_ms < deadline <= offer.expires_at_ms:
        raise Rejected(Reason.MALFORMED, "offer's queueDeadlineMs is not within its lifetime")
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
