"""The offering side's protocol as an I/O-free state machine: links come and go, writes arrive, actions go out.

`BumbleOfferPeripheral` (peripheral.py) runs it on a bumble `Device`; the fuzz harness and the unit tests drive it
directly. Nothing here awaits, sleeps or touches a radio, so every path can be tested with plain calls.

What it promises, whatever any central writes:

* **One claimant at a time, bound to a key.** A claim names a PeerID and carries that key's signature over this
  link's nonce (served in CAPABILITIES) and the offer digest. A PeerID that embeds no Ed25519 key, a bad signature,
  or a claim signed for another link is refused. The same claimant asking again (after a reconnect) is granted again.
* **Grants lapse.** A grant that brings no verified result within `grant_lease_s` lapses: the offer is open to
  others, the holder's links are dropped (so the offer is advertised again), and the lapsed key is not granted this
  offer again. The lease runs from the first grant; re-claiming does not extend it. A link that holds no grant and
  writes nothing for `link_idle_s` is dropped too: while a node is connected, the offer is not advertised.
* **Bounded memory per link and in total.** A link without a grant may buffer one small message (`MAX_SMALL_MESSAGE`
  bytes); only the link of the grant holder may buffer a result (`max_result_bytes`). At most `max_links` links are
  served (more are dropped), each for at most `max_messages_per_link` messages and `max_offer_sends_per_link` offer
  transfers. Records (claims, refusals) are kept in bounded deques.
* **Total.** `write` never raises: a framing or decoding fault is answered with a typed refusal on that link.
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from transports.ble.framing import Reassembler, encode_frames, notify_frame_size
from transports.ble.protocol import (
    DEFAULT_MAX_RESULT_BYTES,
    EXCHANGE_UUID,
    MAX_SMALL_MESSAGE,
    NONCE_SIZE,
    OFFER_UUID,
    SEND_OFFER,
    Answer,
    Capabilities,
    Claim,
    Kind,
    Refusal,
    claim_statement,
    offer_digest,
)
from transports.ble.reasons import BleFault
from transports.wire.identity import public_key_of_peer_id, verify

# (raw result, claimant PeerID, offer bytes) -> the verified result; raises on anything wrong.
ResultVerifier = Callable[[bytes, str, bytes], Any]


@dataclass(frozen=True, slots=True)
class Notify:
    link: int
    characteristic: str  # OFFER_UUID or EXCHANGE_UUID
    frames: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Disconnect:
    link: int
    why: str


Action = Notify | Disconnect


@dataclass(frozen=True, slots=True)
class ServerLimits:
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
    max_links: int = 4
    max_messages_per_link: int = 8
    max_offer_sends_per_link: int = 2
    # How long a grant may go without a verified result. The offerer sets it from the offer's own timeout.
    grant_lease_s: float = 120.0
    # A link that holds no grant and writes nothing for this long is dropped. While any node is connected, a
    # legacy advertiser is silent, so a link that just sits there would hide the offer from every other node.
    link_idle_s: float = 60.0
    keep_records: int = 64


@dataclass(slots=True)
class ClaimRecord:
    claimant: str
    granted: bool
    detail: str = ""


@dataclass(frozen=True, slots=True)
class RefusalRecord:
    link: int
    reason: str
    detail: str


@dataclass(slots=True)
class PeripheralState:
    """A copy of what the offering side has seen, safe to hand to another thread."""

    address: str
    granted_to: str | None
    claims: list[ClaimRecord] = field(default_factory=list)
    results_refused: list[str] = field(default_factory=list)
    refusals: list[RefusalRecord] = field(default_factory=list)
    lapsed: list[str] = field(default_factory=list)
    has_result: bool = False
    links_served: int = 0


@dataclass(slots=True)
class _Link:
    nonce: bytes
    exchange: Reassembler
    claimant: str | None = None  # set once this link's claim was granted
    messages: int = 0
    offer_sends: int = 0
    offers_sent: int = 0  # numbers this link's offer messages (see `framing`)
    answers_sent: int = 0
    last_write: float = 0.0


@dataclass(slots=True)
class _Grant:
    claimant: str
    granted_at: float


class OfferServer:
    def __init__(
        self,
        offer: bytes,
        verify_result: ResultVerifier,
        *,
        limits: ServerLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
        make_nonce: Callable[[], bytes] = lambda: os.urandom(NONCE_SIZE),
    ) -> None:
        self.offer = offer
        self.digest = offer_digest(offer)
        self.verify_result = verify_result
        self.limits = limits or ServerLimits()
        self._clock = clock
        self._make_nonce = make_nonce
        self._links: dict[int, _Link] = {}
        self._grant: _Grant | None = None
        self.lapsed: set[str] = set()
        self.claims: collections.deque[ClaimRecord] = collections.deque(maxlen=self.limits.keep_records)
        self.refusals: collections.deque[RefusalRecord] = collections.deque(maxlen=self.limits.keep_records)
        self.results_refused: collections.deque[str] = collections.deque(maxlen=self.limits.keep_records)
        self.result: Any = None
        self.result_raw: bytes | None = None
        self.links_served = 0

    # -- what the owner asks ------------------------------------------------------------------------------------

    @property
    def granted_to(self) -> str | None:
        self._lapse_if_due()
        return self._grant.claimant if self._grant is not None else None

    @property
    def buffered_bytes(self) -> int:
        """Bytes held in reassembly across every link: bounded by one result plus one small message per link."""
        return sum(link.exchange.buffered for link in self._links.values())

    @property
    def link_count(self) -> int:
        return len(self._links)

    def is_granted_link(self, link: int) -> bool:
        state = self._links.get(link)
        return state is not None and state.claimant is not None and state.claimant == self.granted_to

    def state(self, address: str = "") -> PeripheralState:
        return PeripheralState(
            address,
            self.granted_to,
            list(self.claims),
            list(self.results_refused),
            list(self.refusals),
            sorted(self.lapsed),
            self.result is not None,
            self.links_served,
        )

    # -- links --------------------------------------------------------------------------------------------------

    def connect(self, link: int) -> list[Action]:
        if len(self._links) >= self.limits.max_links:
            return [Disconnect(link, f"already serving {self.limits.max_links} links")]
        self._links[link] = _Link(self._make_nonce(), Reassembler(MAX_SMALL_MESSAGE), last_write=self._clock())
        self.links_served += 1
        return []

    def disconnect(self, link: int) -> None:
        self._links.pop(link, None)

    def capabilities(self, link: int) -> bytes:
        state = self._links.get(link)
        # A read on a link this server does not serve (refused, or already gone) gets a nonce nobody can claim with.
        nonce = state.nonce if state is not None else bytes(NONCE_SIZE)
        return Capabilities(nonce, max_message=self.limits.max_result_bytes).encode()

    # -- writes -------------------------------------------------------------------------------------------------

    def tick(self) -> list[Action]:
        """Call now and then (the radio does, every second): lapses grants and drops links that only hold the radio."""
        actions: list[Action] = [Disconnect(link, "its grant lapsed without a result") for link in self._lapse_if_due()]
        now = self._clock()
        for link, state in self._links.items():
            if state.claimant is None and now - state.last_write >= self.limits.link_idle_s:
                actions.append(Disconnect(link, f"idle for {self.limits.link_idle_s:g} s without a grant"))
        return actions

    def write(self, link: int, characteristic: str, value: bytes, att_mtu: int) -> list[Action]:
        state = self._links.get(link)
        if state is None:
            return []
        state.last_write = self._clock()
        if characteristic == OFFER_UUID:
            return self._on_offer_write(link, state, value, att_mtu)
        if characteristic == EXCHANGE_UUID:
            return self._on_exchange_write(link, state, value, att_mtu)
        return []

    def _on_offer_write(self, link: int, state: _Link, value: bytes, att_mtu: int) -> list[Action]:
        if value != SEND_OFFER:
            return self._count_message(link, state) or []
        state.offer_sends += 1
        if state.offer_sends > self.limits.max_offer_sends_per_link:
            return [Disconnect(link, "asked for the offer too many times")]
        number = state.offers_sent
        state.offers_sent += 1
        return [Notify(link, OFFER_UUID, tuple(encode_frames(self.offer, notify_frame_size(att_mtu), number)))]

    def _on_exchange_write(self, link: int, state: _Link, value: bytes, att_mtu: int) -> list[Action]:
        try:
            message = state.exchange.feed(value)
        except BleFault as fault:
            kind = Kind.GRANT if state.claimant is None else Kind.RESULT_ACK
            return self._count_message(link, state) or self._answer(
                link, state, Answer(kind, False, f"ble/{fault.code}"), att_mtu
            )
        if message is None:
            return []
        if over := self._count_message(link, state):
            return over
        tag, body = message[:1], message[1:]
        if tag == bytes([Kind.CLAIM]):
            return self._on_claim(link, state, body, att_mtu)
        if tag == bytes([Kind.RESULT]):
            return self._on_result(link, state, body, att_mtu)
        if tag == bytes([Kind.REFUSAL]):
            try:
                refusal = Refusal.decode_body(body)
            except BleFault:
                return []
            self.refusals.append(RefusalRecord(link, refusal.reason, refusal.detail))
            return []
        return self._answer(link, state, Answer(Kind.RESULT_ACK, False, "unknown message kind"), att_mtu)

    def _count_message(self, link: int, state: _Link) -> list[Action]:
        state.messages += 1
        if state.messages > self.limits.max_messages_per_link:
            return [Disconnect(link, f"more than {self.limits.max_messages_per_link} messages on one link")]
        return []

    def _answer(self, link: int, state: _Link, answer: Answer, att_mtu: int) -> list[Action]:
        number = state.answers_sent
        state.answers_sent += 1
        return [Notify(link, EXCHANGE_UUID, tuple(encode_frames(answer.encode(), notify_frame_size(att_mtu), number)))]

    # -- claims and results -------------------------------------------------------------------------------------

    def _lapse_if_due(self) -> list[int]:
        """Withdraw a grant whose lease ran out; returns the links that held it."""
        grant = self._grant
        if grant is None or self.result is not None or self._clock() - grant.granted_at < self.limits.grant_lease_s:
            return []
        self.lapsed.add(grant.claimant)
        self._grant = None
        holders = []
        for link, state in self._links.items():
            if state.claimant == grant.claimant:
                state.claimant = None
                state.exchange.max_message = MAX_SMALL_MESSAGE
                holders.append(link)
        return holders

    def _decide_claim(self, state: _Link, body: bytes) -> tuple[str, bool, str]:
        try:
            claim = Claim.decode_body(body)
        except BleFault as fault:
            return "?", False, f"ble/{fault.code}"
        if claim.offer_digest != self.digest:
            return claim.claimant, False, "unknown offer"
        try:
            key = public_key_of_peer_id(claim.claimant)
        except Exception:  # base58, multihash and key-type errors alike: this PeerID names no Ed25519 key
            return claim.claimant, False, "claimant is not an Ed25519 PeerID"
        if not verify(key, claim.signature, claim_statement(state.nonce, claim.offer_digest, key)):
            return claim.claimant, False, "claim signature does not verify for this link"
        self._lapse_if_due()
        if self.result is not None:
            return claim.claimant, False, "already answered"
        if claim.claimant in self.lapsed:
            return claim.claimant, False, "an earlier grant to this claimant lapsed without a result"
        if self._grant is not None and self._grant.claimant != claim.claimant:
            return claim.claimant, False, "already claimed"
        if self._grant is None:
            self._grant = _Grant(claim.claimant, self._clock())
        return claim.claimant, True, ""

    def _on_claim(self, link: int, state: _Link, body: bytes, att_mtu: int) -> list[Action]:
        claimant, granted, detail = self._decide_claim(state, body)
        if granted:
            state.claimant = claimant
            state.exchange.max_message = self.limits.max_result_bytes + 1  # room for a result and its kind byte
        self.claims.append(ClaimRecord(claimant, granted, detail))
        return self._answer(link, state, Answer(Kind.GRANT, granted, detail), att_mtu)

    def _on_result(self, link: int, state: _Link, raw: bytes, att_mtu: int) -> list[Action]:
        if state.claimant is None or state.claimant != self.granted_to:
            return self._refuse_result(link, state, "no granted claim on this link", att_mtu)
        try:
            verified = self.verify_result(raw, state.claimant, self.offer)
        except Exception as exc:  # the verifier's own typed rejection, or any decoding failure: all refusals
            return self._refuse_result(link, state, f"{type(exc).__name__}: {exc}", att_mtu)
        if self.result is None:
            self.result, self.result_raw = verified, raw
        return self._answer(link, state, Answer(Kind.RESULT_ACK, True), att_mtu)

    def _refuse_result(self, link: int, state: _Link, detail: str, att_mtu: int) -> list[Action]:
        self.results_refused.append(detail)
        return self._answer(link, state, Answer(Kind.RESULT_ACK, False, detail), att_mtu)
