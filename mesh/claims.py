"""The offerer's side of gossip offers: exactly one claim per offer, and only the claimant's result counts.

A gossip offer is heard by many nodes; without claims it would run on all of them. The offerer invites a few
runners by name in the signed offer (`mesh.invitations`); an invitee that wants the work asks the offerer over a
direct stream, sending its own status with the request. The desk grants `redundancy` claims per job (one by default)
and refuses the rest: claimants that were not invited (`not_invited`), that say `sandboxMode: none` (the mesh's
counterpart of a coordinator refusing `/pull` to an agent that cannot sandbox), or whose sandbox tiers fall short
of the offer's minimum (`isolation_insufficient`).

A job may be issued more than once (a fresh offer id each time, other invitees): when no invitee claims in time,
or a claim lapses without a result. The issues share one job, so the grant limit holds across all of them, and a
late result for an earlier issue still counts. A claimant whose claim lapsed without a result gets a strike with
this offerer (`Strikes`): it is invited last from then on.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import trio

from mesh.peers import Heartbeat, PeerDirectory
from transports.wire.identity import public_key_of_peer_id
from transports.wire.needs import unmet_by
from transports.wire.offers import MAX_RESULT_BYTES, ReceivedOffer, meets
from transports.wire.reasons import Reason, Rejected, Rejection
from transports.wire.results import TaskResult, open_result
from transports.wire.sealed import Payload, SealKey, open_sealed_result, seal_payload

# Asks a peer for its current status over a direct stream: the status, or why not.
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
    offer_id: bytes
    deadline: float


@dataclass(slots=True)
class ClaimJob:
    """One piece of work, over all its issues: the grants, the results, and the claim requests it drew."""

    # How many independent runners (distinct PeerIDs) should run it: 1, or k for k-of-k replication.
    redundancy: int = 1
    grants: list[_Grant] = field(default_factory=list)
    lapsed: list[_Grant] = field(default_factory=list)  # grants whose lease ran out without a result
    results: list[TaskResult] = field(default_factory=list)
    requests: int = 0  # claim requests received, granted or not
    refused: int = 0
    struck: set[str] = field(default_factory=set)
    done: trio.Event = field(default_factory=trio.Event)  # set once `redundancy` results are in

    @property
    def complete(self) -> bool:
        return len(self.results) >= self.redundancy


@dataclass(slots=True)
class Sealing:
    """What the offerer of a sealed offer keeps to itself: the payload, and the key the offer names."""

    payload: Payload
    key: SealKey = field(default_factory=SealKey)


@dataclass(slots=True)
class PostedOffer:
    """One issue of a job: the offer as signed and published."""

    received: ReceivedOffer
    job: ClaimJob = field(default_factory=ClaimJob)
    # A sealed offer's payload and the private half of its key: the payload goes, sealed, to the claimant granted,
    # and the key opens the result sealed back. None for an offer published in the clear.
    sealing: Sealing | None = None

    @property
    def results(self) -> list[TaskResult]:
        return self.job.results

    @property
    def refused(self) -> int:
        return self.job.refused

    @property
    def done(self) -> trio.Event:
        return self.job.done


class Strikes:
    """Claimants that won a claim from this offerer and never delivered, counted, bounded (oldest forgotten)."""

    def __init__(self, capacity: int = 4096) -> None:
        self._counts: OrderedDict[str, int] = OrderedDict()
        self.capacity = capacity

    def add(self, peer_id: str) -> None:
        self._counts[peer_id] = self._counts.get(peer_id, 0) + 1
        self._counts.move_to_end(peer_id)
        while len(self._counts) > self.capacity:
            self._counts.popitem(last=False)

    def __getitem__(self, peer_id: str) -> int:
        return self._counts.get(peer_id, 0)

    def __len__(self) -> int:
        return len(self._counts)


@dataclass(eq=False)
class ClaimDesk:
    peers: PeerDirectory
    _: KW_ONLY
    redundancy: int = 1
    lease_margin_s: float = LEASE_MARGIN_S
    # Asks a claimant we have no status of for its own (the direct transport's status request).
    ask_status: AskStatus | None = None
    capacity: int = 10_000
    monotonic: Callable[[], float] = time.monotonic
    _posted: OrderedDict[bytes, PostedOffer] = field(default_factory=OrderedDict, init=False, repr=False)
    strikes: Strikes = field(default_factory=Strikes, init=False)

    def post(self, received: ReceivedOffer, job: ClaimJob | None = None, sealing: Sealing | None = None) -> PostedOffer:
        """Open an issue for claims; `job` joins it to the earlier issues of the same work. A sealed offer comes
        with its `sealing`: the payload to send the claimant granted."""
        if sealing is not None and received.offer.sealed is None:
            raise ValueError("only a sealed offer is posted with a sealing")
        posted = PostedOffer(received, job or ClaimJob(redundancy=self.redundancy), sealing)
        self._posted[received.offer.offer_id] = posted
        while len(self._posted) > self.capacity:
            self._posted.popitem(last=False)
        return posted

    def __len__(self) -> int:
        """Issues open for claims now: at most `capacity` (oldest forgotten), each withdrawn when its offer ends."""
        return len(self._posted)

    def get(self, offer_id: bytes) -> PostedOffer | None:
        return self._posted.get(offer_id)

    def withdraw(self, offer_id: bytes) -> None:
        self._posted.pop(offer_id, None)

    def _live_grants(self, job: ClaimJob) -> list[_Grant]:
        now = self.monotonic()
        delivered = {r.executor for r in job.results}
        return [g for g in job.grants if g.deadline > now or _key_of(g.claimant) in delivered]

    async def _claimant_status(self, claimant: str, status: dict[str, Any] | None) -> Heartbeat | None:
        """The claimant's own word on itself: sent with its claim, known from presence, or asked for."""
        if status is not None:
            sent = Heartbeat.parse(claimant, status, self.monotonic())
            if sent is not None:
                return sent
        known = self.peers.get(claimant)
        if known is None and self.ask_status is not None:
            answer = await self.ask_status(claimant)
            if not isinstance(answer, Rejection):
                known = self.peers.observe(claimant, answer)
        return known

    async def grant_claim(
        self, offer_id: bytes, claimant: str, status: dict[str, Any] | None = None
    ) -> Rejection | None:
        """None grants a clear offer's claim. A sealed offer's claim names the key to seal its payload to."""
        posted = self._posted.get(offer_id)
        if posted is not None and posted.received.offer.sealed is not None:
            posted.job.requests += 1
            posted.job.refused += 1
            return Rejection(Reason.MALFORMED, "a claim on a sealed offer names the key to seal it to (sealTo)")
        return await self._grant(posted, claimant, status)

    async def grant_sealed_claim(
        self, offer_id: bytes, claimant: str, status: dict[str, Any] | None, seal_to: bytes
    ) -> Rejection | bytes:
        """A sealed offer's grant: its payload sealed to `seal_to`, the key the claimant made for this claim (sent
        over its Noise-authenticated stream, so it is the claimant's). Sealed before judging, so that a key no one
        can hold is refused before it takes a grant; a refused claim never sees the payload."""
        posted = self._posted.get(offer_id)
        if posted is None:
            return Rejection(Reason.UNKNOWN_OFFER, "no such offer is open here")
        try:
            if posted.received.offer.sealed is None:
                raise Rejected(Reason.MALFORMED, "this offer went out in the clear: its claim names no key")
            if posted.sealing is None:  # someone else's sealed offer, relayed: its payload is not ours to give
                raise Rejected(Reason.CLAIM_REFUSED, "this node does not hold the offer's payload")
            sealed = seal_payload(posted.sealing.payload, posted.received.digest, seal_to)
        except Rejected as rejected:
            posted.job.requests += 1
            posted.job.refused += 1
            return rejected.rejection
        return await self._grant(posted, claimant, status) or sealed

    async def _grant(
        self, posted: PostedOffer | None, claimant: str, status: dict[str, Any] | None
    ) -> Rejection | None:
        if posted is None:
            return Rejection(Reason.UNKNOWN_OFFER, "no such offer is open here")
        job = posted.job
        job.requests += 1
        refusal = await self._judge(posted, claimant, status)
        if refusal is not None:
            job.refused += 1
        return refusal

    async def _judge(self, posted: PostedOffer, claimant: str, status: dict[str, Any] | None) -> Rejection | None:
        offer, job = posted.received.offer, posted.job
        if time.time() * 1000 > offer.expires_at_ms:
            return Rejection(Reason.EXPIRED, "the offer has expired")
        if _key_of(claimant) is None:
            # Its result could never be verified against its PeerID: granting would only strand the offer.
            return Rejection(Reason.CLAIM_REFUSED, "the claimant's PeerID embeds no Ed25519 key")
        audience = offer.audience
        if audience is not None and audience.invited and claimant not in audience.invited:
            # Its own intake should have refused the offer; a claimant that skips that check gets the same answer.
            return Rejection(Reason.NOT_INVITED, "this offer invites other claimants")
        heartbeat = await self._claimant_status(claimant, status)
        if heartbeat is None or heartbeat.sandbox_mode != "docker":
            why = "no status from the claimant" if heartbeat is None else "the claimant reports sandboxMode: none"
            return Rejection(Reason.SANDBOX_UNAVAILABLE, why)
        if not any(meets(tier, offer.min_isolation) for tier in heartbeat.isolation):
            runs = ", ".join(heartbeat.isolation) or "none"
            why = f"the offer needs {offer.min_isolation} or stronger; the claimant runs {runs}"
            return Rejection(Reason.ISOLATION_INSUFFICIENT, why)
        # Its own intake should have refused an offer it cannot meet; a claimant that skips that check (or whose
        # runtime changed since) gets the same answer, from what it says of itself now.
        unmet = unmet_by(heartbeat.capabilities, offer.needs)
        if unmet is not None:
            return Rejection(unmet[0], f"the claimant: {unmet[1]}")
        live = self._live_grants(job)
        if any(g.claimant == claimant and g.offer_id == offer.offer_id for g in live):
            return None  # a retried claim by the same peer is the same claim
        if any(g.claimant == claimant for g in live):
            # Replicas must come from distinct runners: one runner's two results would agree with themselves.
            return Rejection(Reason.CLAIM_REFUSED, "already claimed by this claimant under another issue")
        if len(live) >= job.redundancy or job.complete:
            return Rejection(Reason.CLAIM_REFUSED, "already claimed")
        lease = offer.limits.timeout_ms / 1000 + self.lease_margin_s
        job.grants = [*live, _Grant(claimant, offer.offer_id, self.monotonic() + lease)]
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
        job = posted.job
        # A claim that lapsed still counts when its result comes late: the work ran, and it is the first result.
        if not any(g.claimant == sender and g.offer_id == result.offer_id for g in job.grants + job.lapsed):
            return Rejection(Reason.CLAIM_REFUSED, "the sender holds no claim on this offer")
        if any(r.executor == result.executor for r in job.results):
            return None  # a repeated delivery of the same result
        job.results.append(result)
        if job.complete:
            job.done.set()
        return None

    async def accept_sealed_result(self, offer_id: bytes, sealed: bytes, sender: str) -> Rejection | None:
        """A sealed offer's result, sealed to the offer's key: opened here, then taken as any result."""
        posted = self._posted.get(offer_id)
        if posted is None:
            return Rejection(Reason.UNKNOWN_OFFER, "no such offer is open here")
        if posted.sealing is None:
            return Rejection(Reason.MALFORMED, "this offer went out in the clear: its result is not sealed")
        try:
            raw = open_sealed_result(sealed, posted.received.digest, posted.sealing.key, max_size=MAX_RESULT_BYTES)
        except Rejected as rejected:
            return rejected.rejection
        return await self.accept_result(raw, sender)

    def undelivered(self, job: ClaimJob) -> list[tuple[str, bytes]]:
        """(claimant, offer id) of each grant on `job`, lapsed ones included, that has not delivered a result."""
        delivered = {r.executor for r in job.results}
        return [(g.claimant, g.offer_id) for g in job.lapsed + job.grants if _key_of(g.claimant) not in delivered]

    def lapsed(self, job: ClaimJob) -> bool:
        """True when a granted claim's lease ran out without its result: the offerer may re-offer that share.

        The lapsed grants are set aside (a later issue's grant is judged on its own), and each claimant whose claim
        lapsed gets a strike (once per job): it is invited last from then on.
        """
        if job.complete:
            return False
        live = self._live_grants(job)
        expired = [g for g in job.grants if g not in live]
        if not expired:
            return False
        for grant in expired:
            if grant.claimant not in job.struck:
                job.struck.add(grant.claimant)
                self.strikes.add(grant.claimant)
        job.lapsed += expired
        job.grants = live
        return True

    def claimed(self, job: ClaimJob) -> bool:
        """Enough claims are live (someone is running each share) or results are in."""
        return len(self._live_grants(job)) >= job.redundancy or job.complete
