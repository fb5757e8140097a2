"""The offerer's side of gossip offers: exactly one claim per offer, and only the claimant's result counts.

A gossip offer is heard by many nodes; without claims it would run on all of them. A node that wants the work asks
the offerer over a direct stream. The desk grants `redundancy` claims per offer (one by default) and refuses the
rest, and it refuses any claimant whose latest heartbeat does not say `sandboxMode: docker`: the mesh's counterpart of
a coordinator refusing `/pull` to an agent that cannot sandbox. A claim that brings no result within its lease
lapses, so the slot opens again and the offerer may re-offer.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from mesh.identity import public_key_of_peer_id
from mesh.offers import ReceivedOffer, TaskResult, meets, open_result
from mesh.peers import PeerDirectory
from mesh.reasons import Reason, Rejected, Rejection

# Asks a peer for its current heartbeat over a direct stream: the heartbeat, or why not.
AskStatus = Callable[[str], Awaitable[dict[str, Any] | Rejection]]

# Beyond the offer's own timeout: the claimant's queueing, container start and the trip back.
LEASE_MARGIN_S = 15.0


def _key_of(peer_id: str) -> bytes | None:
    """The Ed25519 key a PeerID embeds, or None (a secp256k1 or RSA PeerID embeds another kind, or none)."""
    try:
        return public_key_of_peer_id(peer_id)
    except ValueError:
        return None


@dataclass(slots=True)
class _Grant:
    claimant: str
    deadline: float


@dataclass(slots=True)
class PostedOffer:
    received: ReceivedOffer
    grants: list[_Grant] = field(default_factory=list)
    results: list[TaskResult] = field(default_factory=list)
    refused: int = 0
    done: trio.Event = field(default_factory=trio.Event)


class ClaimDesk:
    def __init__(
        self,
        peers: PeerDirectory,
        *,
        redundancy: int = 1,
        lease_margin_s: float = LEASE_MARGIN_S,
        ask_status: AskStatus | None = None,
        capacity: int = 10_000,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.peers = peers
        self.redundancy = redundancy
        self.lease_margin_s = lease_margin_s
        self._ask_status = ask_status
        self.capacity = capacity
        self._monotonic = monotonic
        self._posted: OrderedDict[bytes, PostedOffer] = OrderedDict()

    def post(self, received: ReceivedOffer) -> PostedOffer:
        posted = PostedOffer(received)
        self._posted[received.offer.offer_id] = posted
        while len(self._posted) > self.capacity:
            self._posted.popitem(last=False)
        return posted

    def get(self, offer_id: bytes) -> PostedOffer | None:
        return self._posted.get(offer_id)

    def withdraw(self, offer_id: bytes) -> None:
        self._posted.pop(offer_id, None)

    def _live_grants(self, posted: PostedOffer) -> list[_Grant]:
        now = self._monotonic()
        delivered = {r.executor for r in posted.results}
        return [g for g in posted.grants if g.deadline > now or _key_of(g.claimant) in delivered]

    async def grant_claim(self, offer_id: bytes, claimant: str) -> Rejection | None:
        posted = self._posted.get(offer_id)
        if posted is None:
            return Rejection(Reason.UNKNOWN_OFFER, "no such offer is open here")
        offer = posted.received.offer
        if time.time() * 1000 > offer.expires_at_ms:
            return Rejection(Reason.EXPIRED, "the offer has expired")
        if _key_of(claimant) is None:
            # Its result could never be verified against its PeerID: granting would only strand the offer.
            posted.refused += 1
            return Rejection(Reason.CLAIM_REFUSED, "the claimant's PeerID embeds no Ed25519 key")
        audience = offer.audience
        if audience is not None and audience.invited and claimant not in audience.invited:
            # Its own intake should have refused the offer; a claimant that skips that check gets the same answer.
            posted.refused += 1
            return Rejection(Reason.NOT_INVITED, "this offer invites other claimants")
        mode = self.peers.sandbox_mode(claimant)
        if mode is None and self._ask_status is not None:
            # Heartbeats are flooded only every few seconds; rather than wait for the next one, ask the claimant
            # itself. The answer comes over its own authenticated stream and is checked like any heartbeat.
            status = await self._ask_status(claimant)
            if not isinstance(status, Rejection):
                self.peers.observe(claimant, status)
                mode = self.peers.sandbox_mode(claimant)
        if mode != "docker":
            posted.refused += 1
            why = "no fresh heartbeat from the claimant" if mode is None else "the claimant reports sandboxMode: none"
            return Rejection(Reason.SANDBOX_UNAVAILABLE, why)
        heartbeat = self.peers.get(claimant)
        tiers = heartbeat.isolation if heartbeat is not None else ()
        if not any(meets(tier, offer.min_isolation) for tier in tiers):
            posted.refused += 1
            return Rejection(
                Reason.ISOLATION_INSUFFICIENT,
                f"the offer needs {offer.min_isolation} or stronger; the claimant runs {', '.join(tiers) or 'none'}",
            )
        live = self._live_grants(posted)
        if any(g.claimant == claimant for g in live):
            return None  # a retried claim by the same peer is the same claim
        if len(live) >= self.redundancy:
            posted.refused += 1
            return Rejection(Reason.CLAIM_REFUSED, "already claimed")
        lease = offer.limits.timeout_ms / 1000 + self.lease_margin_s
        posted.grants = [*live, _Grant(claimant, self._monotonic() + lease)]
        return None

    async def accept_result(self, raw: bytes, sender: str) -> Rejection | None:
        try:
            result = open_result(raw, expect_executor=public_key_of_peer_id(sender))
        except Rejected as rejected:
            return rejected.rejection
        except ValueError:
            return Rejection(Reason.WRONG_EXECUTOR, "the sender's PeerID embeds no Ed25519 key")
        posted = self._posted.get(result.offer_id)
        if posted is None:
            return Rejection(Reason.UNKNOWN_OFFER, "no such offer is open here")
        if result.offer_digest != posted.received.digest:
            return Rejection(Reason.MALFORMED, "the result names another offer's bytes")
        if not any(g.claimant == sender for g in posted.grants):
            return Rejection(Reason.CLAIM_REFUSED, "the sender holds no claim on this offer")
        if any(r.executor == result.executor for r in posted.results):
            return None  # a repeated delivery of the same result
        posted.results.append(result)
        posted.done.set()
        return None

    def undelivered_claimants(self, posted: PostedOffer) -> list[str]:
        """PeerIDs granted a claim on `posted` that have not delivered a result."""
        delivered = {r.executor for r in posted.results}
        return [g.claimant for g in posted.grants if _key_of(g.claimant) not in delivered]

    def lapsed(self, offer_id: bytes) -> bool:
        """True when claims were granted, none is still live, and no result came: the offerer may re-offer."""
        posted = self._posted.get(offer_id)
        return posted is not None and bool(posted.grants) and not posted.results and not self._live_grants(posted)
