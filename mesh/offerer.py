"""The offerer's role: make an offer, send it to one peer or publish it to the mesh, and wait for a verified result.

A node composes one (`MeshNode.offerer`); the runner's side (intake, workers, executor) stays in mesh/node.py. On
gossip the offerer invites runners per issue (mesh.invitations), re-issues when nobody claims in time or a claim
lapses, checks that k replicas agree, and tells every claimant that delivered nothing to abort.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable, Collection, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any

import structlog
import trio

from mesh.claims import ClaimDesk, ClaimJob, PostedOffer, Sealing
from mesh.invitations import INVITEES, Candidate, candidates, choose_invitees
from mesh.peers import PeerDirectory
from transports.direct import ABORT_SEND_TIMEOUT, DirectAnswer, DirectTransport
from transports.gossip import GossipTransport
from transports.p2p import P2PHost
from transports.wire.identity import NodeIdentity, public_key_of_peer_id
from transports.wire.jobs import JobCancel, OutputChunk, StreamDigest
from transports.wire.needs import Needs
from transports.wire.offers import MAX_REPLY_ADDRS, OFFER_ID_SIZE, Audience, TaskOffer, now_ms, parse_offer
from transports.wire.reasons import Reason, Rejected, Rejection
from transports.wire.results import TaskResult, open_result, result_digest
from transports.wire.sealed import SealKey, direct_form, is_direct_form, open_direct_form

log = structlog.get_logger("edgecoder.node")

# Runners one gossip offer may invite over its issues when nobody claims in time: with `invitees` per issue, at most
# this many claim requests reach the offerer for it (a lapsed claim may still invite beyond, so as not to lose it).
MAX_INVITED = 8


@dataclass(frozen=True, slots=True)
class OfferOutcome:
    """What an offerer learns: a verified result, or a typed refusal."""

    result: TaskResult | None = None
    refusal: Rejection | None = None
    # Gossip only: claim requests the offerer received for this work over all its issues, those it refused (it was
    # already claimed, the claimant was not invited or cannot sandbox), and how many issues it took.
    claims_refused: int = 0
    claim_requests: int = 0
    issues: int = 0
    # Gossip with replicas: every runner's verified result (the first is `result`), all agreeing when `result` is set.
    replicas: tuple[TaskResult, ...] = ()
    # A followed offer: the output chunks received, and whether their digest is the one the result signs (None when
    # nothing was followed).
    streamed: int = 0
    stream_verified: bool | None = None

    @property
    def ok(self) -> bool:
        return self.result is not None and self.result.result.ok


@dataclass(eq=False)
class Offerer:
    """The offerer's side of a node: what it needs of the node is passed in, it owns nothing that runs."""

    identity: NodeIdentity
    p2p: P2PHost
    peers: PeerDirectory
    desk: ClaimDesk
    direct: DirectTransport
    gossip: GossipTransport
    _: KW_ONLY
    # How many runners to invite per issue of a gossip offer, how long to wait for one of them to claim before
    # inviting others, and how many distinct runners must agree by default (NodeConfig says more).
    invitees: int = INVITEES
    invite_window_s: float = 1.0
    claim_redundancy: int = 1
    # Our own clear offers go out sealed: gossip carries no code and no input (transports/wire/sealed.py).
    seal_gossip: bool = True

    async def wait_for_runner(self, *, timeout: float) -> bool:
        """Wait until a runner is known (a neighbour's status, or one a neighbour reports) and some peer takes
        offers on the topic (known at once on connect). Publishing before that would reach nobody."""
        with trio.move_on_after(timeout):
            while not (self.gossip.offer_subscribers() and self.runner_candidates(language=None, min_isolation=None)):
                await trio.sleep(0.05)
            return True
        return False

    def runner_candidates(
        self, *, language: str | None, min_isolation: str | None, needs: Needs | None = None
    ) -> list[Candidate]:
        return candidates(
            self.peers, language=language, min_isolation=min_isolation, me=self.identity.peer_id, needs=needs
        )

    def make_offer(self, *, to: str | None = None, invite: Sequence[str] = (), **fields: Any) -> bytes:
        """A signed offer from this node, replying to its own addresses.

        `to` (a PeerID, or a multiaddr ending in /p2p/<PeerID>) makes it a direct offer that only that node runs;
        otherwise it is claimed, by `invite`d PeerIDs only when given.
        """
        # What peers can reach: announced, expanded and relayed addresses, direct ones first.
        fields.setdefault("reply_to", tuple(self.p2p.addrs[:MAX_REPLY_ADDRS]))
        if to is not None:
            fields["audience"] = Audience.direct(to.rsplit("/p2p/", 1)[-1])
        elif invite:
            fields["audience"] = Audience.claimed(list(invite))
        return TaskOffer.create(self.identity, **fields).sign(self.identity)

    def sealed_direct(self, raw: bytes) -> bytes:
        """Our clear offer as a direct offer frame in the envelope-plus-payload form (`transports.wire.sealed`): the
        sealed offer and its payload, which the runner checks against the offer's digests, as a gossip runner checks
        the payload its grant carried."""
        offer = parse_offer(raw).offer
        sealed = offer.sealed_with(SealKey().public).sign(self.identity)
        return direct_form(sealed, offer.payload)

    async def offer_direct(
        self,
        peer: str,
        raw: bytes,
        *,
        cancel_on_stop: bool = False,
        on_output: Callable[[OutputChunk], None] | None = None,
    ) -> OfferOutcome:
        """Send any bytes (tests send garbage on purpose) and verify whatever comes back. With `cancel_on_stop`, a
        caller that stops waiting (Ctrl-C) sends the offer's signed cancel on the stream instead of a bare abort.
        With `on_output`, a followed offer's (`follow`) live output chunks are handed to it as they come; the
        outcome says whether they are what the result signs."""
        cancel = None
        offer_raw = _offer_of(raw)
        if cancel_on_stop:
            offer_id = parse_offer(offer_raw).offer.offer_id
            cancel = JobCancel.create(self.identity, offer_id).sign(self.identity)
        seen = StreamDigest()

        def shown(chunk: OutputChunk) -> None:
            seen.update(chunk)
            if on_output is not None:
                on_output(chunk)

        answer = await self.direct.send_offer(peer, raw, cancel=cancel, on_output=None if on_output is None else shown)
        outcome = self._verified_direct(peer, offer_raw, answer)
        if on_output is None or outcome.result is None:
            return outcome
        return dataclasses.replace(
            outcome, streamed=seen.count, stream_verified=seen.digest() == outcome.result.stream_digest
        )

    def _verified_direct(self, peer: str, offer_raw: bytes, answer: DirectAnswer) -> OfferOutcome:
        if answer.refusal is not None or answer.result is None:
            return OfferOutcome(refusal=answer.refusal or Rejection(Reason.MALFORMED, "empty answer"))
        try:
            result = open_result(answer.result)
        except Rejected as rejected:
            return OfferOutcome(refusal=rejected.rejection)
        if result.offer_digest != hashlib.sha256(offer_raw).digest():
            return OfferOutcome(refusal=Rejection(Reason.MALFORMED, "the result names another offer"))
        # The result must come from the peer we sent the offer to, when the address names it.
        if "/p2p/" in peer and result.executor != public_key_of_peer_id(peer.rsplit("/p2p/", 1)[1]):
            return OfferOutcome(refusal=Rejection(Reason.WRONG_EXECUTOR, "signed by another key than the peer's"))
        return OfferOutcome(result=result)

    async def cancel(self, peer: str, offer_id: bytes, *, signer: NodeIdentity | None = None) -> OfferOutcome:
        """Cancel this node's offer `offer_id` at the peer running it (a PeerID or a multiaddr ending in it): the
        outcome is the runner's signed result, `aborted` with the output so far, or how the job had already ended;
        or the runner's refusal (`unknown_offer`, `not_offerer`). `signer`: the offer's key, when this node's own is
        another (`edgecoder cancel` connects under a throwaway key, so as not to displace the offering process's
        connection, which has the offer's key as its PeerID)."""
        signer = signer or self.identity
        raw = JobCancel.create(signer, offer_id).sign(signer)
        answer = await self.direct.send_cancel(peer, raw)
        if answer.refusal is not None or answer.result is None:
            return OfferOutcome(refusal=answer.refusal or Rejection(Reason.MALFORMED, "empty answer"))
        try:
            result = open_result(answer.result, expect_executor=public_key_of_peer_id(peer.rsplit("/p2p/", 1)[-1]))
        except Rejected as rejected:
            return OfferOutcome(refusal=rejected.rejection)
        except ValueError:
            return OfferOutcome(refusal=Rejection(Reason.WRONG_EXECUTOR, "the peer's PeerID embeds no Ed25519 key"))
        if result.offer_id != offer_id:
            return OfferOutcome(refusal=Rejection(Reason.MALFORMED, "the answer is another offer's result"))
        return OfferOutcome(result=result)

    async def offer_gossip(self, raw: bytes, *, timeout: float = 30.0, replicas: int | None = None) -> OfferOutcome:
        """Publish, let exactly one invited runner run it (or `replicas` distinct ones), and wait for the verified
        result.

        With `replicas` k > 1 (default `claim_redundancy`), k distinct runners each run it and the result counts only
        when all k agree on what the program did (`result_digest`); otherwise the refusal is `results_disagree`.
        A single claimant can sign any result it likes; k agreeing ones cost a liar k keys among our invitees.

        Our own offer with an open audience gets invitees: each issue names up to `invitees` runners from the
        presence this node knows (`mesh.invitations`), and every other node refuses it at once. When none of them
        claims within `invite_window_s`, the work is re-issued under a fresh id to runners not yet invited (up to
        `MAX_INVITED` in all); when a granted claim lapses without a result, its claimant gets a strike and the work
        is re-issued to others (or, when nobody else is known, to those known again). The issues share one claim
        job, so it still runs once, and a late result for an earlier issue still counts. An offer that already names
        its invitees, or is not ours, is published as it is (and re-issued only after a lapse, if ours). However
        this ends, every claimant still holding a claim without having delivered is told to abort, and the issues
        leave the claim desk.

        Our own offer in the clear is sealed first (unless `seal_gossip` is off): every issue goes out without its
        code and input, under one ephemeral X25519 key, and the desk sends the payload, sealed, to each claimant it
        grants. An offer that is not ours goes out as it came.
        """
        deadline = trio.current_time() + timeout
        job = ClaimJob(redundancy=max(1, replicas or self.claim_redundancy))
        issues: list[PostedOffer] = []
        invited: list[str] = []
        received = parse_offer(raw)
        offer = received.offer
        if offer.sandbox != "docker":
            # Every node's intake refuses a remote host request before any claim, and a gossip refusal has no way
            # back: the offerer says so at once, in the seed's shape (the Rejection's result), not after its timeout.
            why = "a remote offer runs only in a sandbox: every node refuses one that asks for the host"
            return OfferOutcome(refusal=Rejection(Reason.SANDBOX_REQUIRED, why))
        ours = offer.offerer == self.identity.public_key
        sealing: Sealing | None = None
        if ours and self.seal_gossip and offer.sealed is None:
            sealing = Sealing(offer.payload)
            offer = offer.sealed_with(sealing.key.public)
            raw = offer.sign(self.identity)
            received = parse_offer(raw)
        inviting = ours and offer.audience is not None and offer.audience.to is None and not offer.audience.invited
        replicas = job.redundancy
        invitees = self._fresh_invitees(offer, invited, replicas=replicas) if inviting else []
        try:
            while True:
                if invitees or (issues and ours):
                    # No runner known on the first issue: it goes out open (anyone may claim), as published.
                    keep = not inviting
                    raw = self._reissue(offer, invitees, fresh_id=bool(issues), keep_audience=keep)
                    received = parse_offer(raw)
                    invited += [p for p in invitees if p not in invited]
                issues.append(self.desk.post(received, job, sealing))
                refusal = await self.gossip.publish_offer(raw)
                if refusal is not None:
                    return OfferOutcome(refusal=refusal)
                invitees, lapsed = await self._await_claim(job, offer, invited, deadline, inviting=inviting)
                if job.complete:
                    return self._agreed(job, issues)
                if trio.current_time() >= deadline or not ours:
                    why = "claims lapsed without a result" if lapsed else "no result in time"
                    return self._outcome(job, issues, refusal=Rejection(Reason.TIMEOUT, why))
                if lapsed:
                    log.info("re-offering after a lapsed claim", offer=received.offer.offer_id.hex())
                    if inviting:
                        invitees = self._fresh_invitees(offer, invited, replicas=replicas) or self._fresh_invitees(
                            offer, job.struck, replicas=replicas
                        )
        finally:
            with trio.CancelScope(shield=True):
                await self._abort_undelivered(job)
            for issue in issues:
                self.desk.withdraw(issue.received.offer.offer_id)

    async def _await_claim(
        self, job: ClaimJob, offer: TaskOffer, invited: list[str], deadline: float, *, inviting: bool
    ) -> tuple[list[str], bool]:
        """Wait for this issue: until a result, the deadline, a claim lapsing (True), or, while inviting, the invite
        window passing with nobody claiming and someone new to invite (their PeerIDs).

        A lapse counts once: `desk.lapsed` sets the lapsed grants aside as it reports them, so the new issue waits
        for its own claim instead of being re-published at every poll."""
        window = trio.current_time() + self.invite_window_s
        while trio.current_time() < deadline and not job.complete:
            if self.desk.lapsed(job):
                return [], True
            if inviting and trio.current_time() >= window and not self.desk.claimed(job):
                window = trio.current_time() + self.invite_window_s
                more = (
                    self._fresh_invitees(offer, invited, replicas=job.redundancy) if len(invited) < MAX_INVITED else []
                )
                if more:
                    return more, False
            with trio.move_on_after(0.05):
                await job.done.wait()
        return [], False

    def _fresh_invitees(self, offer: TaskOffer, exclude: Collection[str], *, replicas: int = 1) -> list[str]:
        """Runners for this offer, best first (`choose_invitees`), none of `exclude`: `invitees` of them, and, for
        k > 1 replicas, at least one more than k (a spare, so that one slow invitee does not cost an invite window)."""
        found = self.runner_candidates(language=offer.language, min_isolation=offer.min_isolation, needs=offer.needs)
        k = self.invitees if replicas <= 1 else max(self.invitees, replicas + 1)
        return choose_invitees(found, strikes=self.desk.strikes.__getitem__, exclude=exclude, k=k)

    def _agreed(self, job: ClaimJob, issues: list[PostedOffer]) -> OfferOutcome:
        """The first result, when every replica's says the same; `results_disagree` otherwise."""
        digests = {result_digest(r.result) for r in job.results}
        if len(digests) == 1:
            return self._outcome(job, issues, result=job.results[0])
        why = f"{len(job.results)} runners ran it and reported {len(digests)} different results"
        return self._outcome(job, issues, refusal=Rejection(Reason.RESULTS_DISAGREE, why))

    @staticmethod
    def _outcome(
        job: ClaimJob, issues: list[PostedOffer], *, result: TaskResult | None = None, refusal: Rejection | None = None
    ) -> OfferOutcome:
        return OfferOutcome(
            result=result,
            refusal=refusal,
            claims_refused=job.refused,
            claim_requests=job.requests,
            issues=len(issues),
            replicas=tuple(job.results),
        )

    async def _abort_undelivered(self, job: ClaimJob) -> None:
        """Tell each claimant that holds a claim and delivered nothing to stop: nobody waits for its result now."""
        targets = self.desk.undelivered(job)
        if not targets:
            return
        with trio.move_on_after(2 * ABORT_SEND_TIMEOUT):
            async with trio.open_nursery() as nursery:
                for claimant, offer_id in targets:
                    nursery.start_soon(self.direct.send_abort, claimant, offer_id)

    def _reissue(
        self, offer: TaskOffer, invitees: Sequence[str], *, fresh_id: bool, keep_audience: bool = False
    ) -> bytes:
        """The same work for other invitees (open when none): under a new id and a fresh lifetime once an issue has
        been published, since every node that admitted the old id keeps it spent."""
        changes: dict[str, Any] = {}
        if not keep_audience:
            changes["audience"] = Audience.claimed(list(invitees))
        if fresh_id:
            issued = now_ms()
            changes.update(
                offer_id=os.urandom(OFFER_ID_SIZE),
                issued_at_ms=issued,
                expires_at_ms=issued + (offer.expires_at_ms - offer.issued_at_ms),
            )
        return dataclasses.replace(offer, **changes).sign(self.identity)


def _offer_of(frame: bytes) -> bytes:
    """The offer's wire bytes in a direct offer frame: the frame itself, or the offer of the envelope-plus-payload
    form (what the result's digest names)."""
    if not is_direct_form(frame):
        return frame
    try:
        return open_direct_form(frame, max_size=len(frame))[0]
    except Rejected:
        return frame  # garbage on purpose: the peer refuses it
