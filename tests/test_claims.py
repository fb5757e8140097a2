"""The offerer's claim desk and the peer directory behind it."""

from __future__ import annotations

from typing import Any

import trio

from executor.contract import ExecResult, Limits
from mesh.claims import LEASE_MARGIN_S, ClaimDesk, ClaimJob
from mesh.peers import PeerDirectory
from transports.wire.identity import NodeIdentity
from transports.wire.needs import Capabilities, Needs
from transports.wire.offers import Audience, TaskOffer, parse_offer
from transports.wire.reasons import Reason, Rejection
from transports.wire.results import TaskResult

OFFERER = NodeIdentity.generate()
RUNNER_A = NodeIdentity.generate()
RUNNER_B = NodeIdentity.generate()
NO_SANDBOX = NodeIdentity.generate()


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def heartbeat(identity: NodeIdentity, mode: str = "docker") -> dict[str, Any]:
    return {"peerId": identity.peer_id, "sandboxMode": mode, "freeSlots": 2, "languages": ["python"], "addrs": []}


def setup(**offer: Any) -> tuple[ClaimDesk, PeerDirectory, Clock, bytes]:
    clock = Clock()
    peers = PeerDirectory(stale_after=10, monotonic=clock)
    for who in (RUNNER_A, RUNNER_B):
        peers.observe(who.peer_id, heartbeat(who))
    peers.observe(NO_SANDBOX.peer_id, heartbeat(NO_SANDBOX, "none"))
    desk = ClaimDesk(peers, monotonic=clock)
    fields: dict[str, Any] = {"language": "python", "code": "print(1)", "limits": Limits(timeout_ms=1000), **offer}
    received = parse_offer(TaskOffer.create(OFFERER, **fields).sign(OFFERER))
    desk.post(received)
    return desk, peers, clock, received.offer.offer_id


def result_of(desk: ClaimDesk, offer_id: bytes, runner: NodeIdentity) -> bytes:
    posted = desk.get(offer_id)
    assert posted is not None
    return TaskResult(offer_id, posted.received.digest, runner.public_key, ExecResult(ok=True)).sign(runner)


def test_exactly_one_claim_is_granted_and_only_the_claimants_result_counts() -> None:
    async def main() -> None:
        desk, _, _, offer_id = setup()
        assert await desk.grant_claim(offer_id, RUNNER_A.peer_id) is None
        refused = await desk.grant_claim(offer_id, RUNNER_B.peer_id)
        assert refused is not None and refused.reason == Reason.CLAIM_REFUSED
        assert await desk.grant_claim(offer_id, RUNNER_A.peer_id) is None  # the same claim, retried
        wrong = await desk.accept_result(result_of(desk, offer_id, RUNNER_B), RUNNER_B.peer_id)
        assert wrong is not None and wrong.reason == Reason.CLAIM_REFUSED
        assert await desk.accept_result(result_of(desk, offer_id, RUNNER_A), RUNNER_A.peer_id) is None
        posted = desk.get(offer_id)
        assert posted is not None and posted.done.is_set() and len(posted.results) == 1

    trio.run(main)


def test_a_peer_reporting_sandbox_mode_none_is_refused_a_claim() -> None:
    async def main() -> None:
        desk, _, _, offer_id = setup()
        refused = await desk.grant_claim(offer_id, NO_SANDBOX.peer_id)
        assert refused is not None and refused.reason == Reason.SANDBOX_UNAVAILABLE
        unknown = await desk.grant_claim(offer_id, NodeIdentity.generate().peer_id)
        assert unknown is not None and unknown.reason == Reason.SANDBOX_UNAVAILABLE

    trio.run(main)


def test_a_claim_without_a_result_lapses_and_the_slot_reopens() -> None:
    async def main() -> None:
        desk, peers, clock, offer_id = setup()
        job = job_of(desk, offer_id)
        assert await desk.grant_claim(offer_id, RUNNER_A.peer_id) is None
        assert not desk.lapsed(job) and desk.claimed(job)
        clock.t += 1.0 + LEASE_MARGIN_S + 0.1
        assert desk.lapsed(job) and not desk.claimed(job)
        assert desk.strikes[RUNNER_A.peer_id] == 1  # it won and never delivered: invited last from now on
        assert not desk.lapsed(job) and desk.strikes[RUNNER_A.peer_id] == 1  # set aside: a lapse is reported once
        peers.observe(RUNNER_B.peer_id, heartbeat(RUNNER_B))  # keep B's heartbeat fresh
        assert await desk.grant_claim(offer_id, RUNNER_B.peer_id) is None

    trio.run(main)


def job_of(desk: ClaimDesk, offer_id: bytes) -> ClaimJob:
    posted = desk.get(offer_id)
    assert posted is not None
    return posted.job


def test_only_invitees_are_granted_and_a_non_invitee_is_told_so() -> None:
    async def main() -> None:
        desk, _, _, offer_id = setup(audience=Audience.claimed([RUNNER_B.peer_id]))
        refused = await desk.grant_claim(offer_id, RUNNER_A.peer_id)
        assert refused is not None and refused.reason == Reason.NOT_INVITED
        assert await desk.grant_claim(offer_id, RUNNER_B.peer_id) is None
        assert job_of(desk, offer_id).requests == 2 and job_of(desk, offer_id).refused == 1

    trio.run(main)


def test_a_claimant_whose_tiers_fall_short_of_the_minimum_is_refused() -> None:
    async def main() -> None:
        desk, _, _, offer_id = setup(min_isolation="gvisor")
        refused = await desk.grant_claim(offer_id, RUNNER_A.peer_id)  # its heartbeat says nothing: runc
        assert refused is not None and refused.reason == Reason.ISOLATION_INSUFFICIENT
        assert (
            await desk.grant_claim(offer_id, RUNNER_B.peer_id, {**heartbeat(RUNNER_B), "isolation": ["gvisor"]}) is None
        )

    trio.run(main)


def test_the_status_sent_with_a_claim_is_the_claimants_and_no_one_is_asked() -> None:
    async def main() -> None:
        asked: list[str] = []

        async def ask(peer: str) -> Any:
            asked.append(peer)
            return Rejection(Reason.UNREACHABLE, "not asked in this test")

        _, peers, clock, _ = setup()
        desk = ClaimDesk(peers, monotonic=clock, ask_status=ask)
        stranger = NodeIdentity.generate()
        posted = parse_offer(TaskOffer.create(OFFERER, language="python", code="1").sign(OFFERER))
        desk.post(posted)
        wrong = await desk.grant_claim(posted.offer.offer_id, stranger.peer_id, heartbeat(RUNNER_A))  # not its own
        assert wrong is not None and wrong.reason == Reason.SANDBOX_UNAVAILABLE
        assert await desk.grant_claim(posted.offer.offer_id, stranger.peer_id, heartbeat(stranger)) is None
        assert asked == [stranger.peer_id]  # only for the claim whose status named someone else

    trio.run(main)


def test_issues_of_one_job_share_its_single_grant_and_a_late_result_for_an_earlier_issue_counts() -> None:
    async def main() -> None:
        desk, _, _, first_id = setup()
        job = job_of(desk, first_id)
        second = parse_offer(
            TaskOffer.create(OFFERER, language="python", code="print(1)", limits=Limits(timeout_ms=1000)).sign(OFFERER)
        )
        desk.post(second, job)
        assert await desk.grant_claim(first_id, RUNNER_A.peer_id) is None
        taken = await desk.grant_claim(second.offer.offer_id, RUNNER_B.peer_id)
        assert taken is not None and taken.reason == Reason.CLAIM_REFUSED  # one run for the work, whatever the issue
        # A result must name the issue its claimant holds.
        misnamed = TaskResult(second.offer.offer_id, second.digest, RUNNER_A.public_key, ExecResult(ok=True)).sign(
            RUNNER_A
        )
        assert (await desk.accept_result(misnamed, RUNNER_A.peer_id)) is not None
        assert await desk.accept_result(result_of(desk, first_id, RUNNER_A), RUNNER_A.peer_id) is None
        assert job.done.is_set() and not desk.undelivered(job)

    trio.run(main)


def test_forged_and_stray_results_are_refused() -> None:
    async def main() -> None:
        desk, _, _, offer_id = setup()
        await desk.grant_claim(offer_id, RUNNER_A.peer_id)
        # Signed by B but sent over A's authenticated stream.
        forged = await desk.accept_result(result_of(desk, offer_id, RUNNER_B), RUNNER_A.peer_id)
        assert forged is not None and forged.reason == Reason.WRONG_EXECUTOR
        stray = TaskResult(b"\x09" * 16, b"\x00" * 32, RUNNER_A.public_key, ExecResult(ok=True)).sign(RUNNER_A)
        unknown = await desk.accept_result(stray, RUNNER_A.peer_id)
        assert unknown is not None and unknown.reason == Reason.UNKNOWN_OFFER
        garbage = await desk.accept_result(b"\x00garbage", RUNNER_A.peer_id)
        assert garbage is not None and garbage.reason == Reason.MALFORMED

    trio.run(main)


def test_heartbeats_are_validated_bounded_and_go_stale() -> None:
    clock = Clock()
    peers = PeerDirectory(stale_after=5, capacity=2, monotonic=clock)
    peers.observe(RUNNER_A.peer_id, heartbeat(RUNNER_B))  # names another peer than its signer
    peers.observe(RUNNER_A.peer_id, {**heartbeat(RUNNER_A), "sandboxMode": "vm"})
    peers.observe(RUNNER_A.peer_id, "not a map")
    assert peers.ignored == 3 and peers.sandbox_mode(RUNNER_A.peer_id) is None
    for who in (RUNNER_A, RUNNER_B, NO_SANDBOX):
        clock.t += 1
        peers.observe(who.peer_id, heartbeat(who))
    assert len(peers.fresh()) == 2 and peers.get(RUNNER_A.peer_id) is None
    clock.t += 6
    assert peers.sandbox_mode(NO_SANDBOX.peer_id) is None


def test_a_claimant_without_a_fresh_heartbeat_is_asked_directly() -> None:
    async def main() -> None:
        newcomer, liar, silent = NodeIdentity.generate(), NodeIdentity.generate(), NodeIdentity.generate()
        answers: dict[str, Any] = {
            newcomer.peer_id: heartbeat(newcomer),
            liar.peer_id: heartbeat(RUNNER_A),  # names another peer than the stream's: ignored
            silent.peer_id: Rejection(Reason.UNREACHABLE, "no answer"),
        }
        asked: list[str] = []

        async def ask(peer: str) -> Any:
            asked.append(peer)
            return answers[peer]

        _, peers, clock, _ = setup()
        desk = ClaimDesk(peers, monotonic=clock, ask_status=ask)
        offers = []
        for _ in range(3):
            received = parse_offer(TaskOffer.create(OFFERER, language="python", code="1").sign(OFFERER))
            desk.post(received)
            offers.append(received.offer.offer_id)
        assert await desk.grant_claim(offers[0], newcomer.peer_id) is None
        refused = [await desk.grant_claim(offers[i], who.peer_id) for i, who in ((1, liar), (2, silent))]
        assert all(r is not None and r.reason == Reason.SANDBOX_UNAVAILABLE for r in refused)
        assert await desk.grant_claim(offers[1], RUNNER_A.peer_id) is None  # fresh heartbeat: nobody is asked
        assert asked == [newcomer.peer_id, liar.peer_id, silent.peer_id]

    trio.run(main)


def test_replicas_need_distinct_claimants_and_the_job_completes_only_with_all_their_results() -> None:
    async def main() -> None:
        clock = Clock()
        peers = PeerDirectory(stale_after=10, monotonic=clock)
        for who in (RUNNER_A, RUNNER_B):
            peers.observe(who.peer_id, heartbeat(who))
        desk = ClaimDesk(peers, monotonic=clock)
        job = ClaimJob(redundancy=2)
        first, second = (
            parse_offer(TaskOffer.create(OFFERER, language="python", code=f"print({i})").sign(OFFERER)) for i in (1, 2)
        )
        desk.post(first, job)
        desk.post(second, job)
        assert await desk.grant_claim(first.offer.offer_id, RUNNER_A.peer_id) is None
        twice = await desk.grant_claim(second.offer.offer_id, RUNNER_A.peer_id)
        assert twice is not None and twice.reason == Reason.CLAIM_REFUSED  # one runner is one replica
        assert await desk.grant_claim(second.offer.offer_id, RUNNER_B.peer_id) is None
        assert await desk.accept_result(result_of(desk, first.offer.offer_id, RUNNER_A), RUNNER_A.peer_id) is None
        assert not job.complete and not job.done.is_set()
        assert await desk.accept_result(result_of(desk, second.offer.offer_id, RUNNER_B), RUNNER_B.peer_id) is None
        assert job.complete and job.done.is_set()

    trio.run(main)


def secp256k1_peer_id() -> str:
    """A real libp2p PeerID whose key is secp256k1 (its result could never be verified against an Ed25519 key)."""
    from libp2p.crypto.secp256k1 import create_new_key_pair
    from libp2p.peer.id import ID

    return ID.from_pubkey(create_new_key_pair().public_key).to_base58()


def test_a_secp256k1_claimant_is_refused_and_no_lapse_of_the_job_crashes_the_desk() -> None:
    """Issue 11: such a claimant used to be granted, and `public_key_of_peer_id` then raised in `lapsed` when its
    lease ran out, ending `edgecoder offer --gossip`. Here it has a fresh docker heartbeat and sends its own status,
    so only its key can refuse it: were the key check dropped it would be granted (the first assert fails), and
    were `_key_of` to let the ValueError through, `grant_claim` would raise. An Ed25519 claimant then wins and
    lapses beside it: the lapse, the strikes and the re-issue's bookkeeping all go through."""

    async def main() -> None:
        desk, peers, clock, offer_id = setup()
        job = job_of(desk, offer_id)
        secp = secp256k1_peer_id()
        status = {**heartbeat(RUNNER_A), "peerId": secp}
        peers.observe(secp, status)
        for sent in (status, None):  # with its status, and known from presence
            refused = await desk.grant_claim(offer_id, secp, sent)
            assert refused is not None and refused.reason == Reason.CLAIM_REFUSED
        assert job.requests == 2 and job.refused == 2 and not job.grants
        clock.t += 1.0 + LEASE_MARGIN_S + 0.1
        assert not desk.lapsed(job) and not desk.claimed(job) and desk.strikes[secp] == 0
        # An honest claimant's lease lapsing in the same job, with the secp256k1 claimant still asking.
        peers.observe(RUNNER_A.peer_id, heartbeat(RUNNER_A))
        assert await desk.grant_claim(offer_id, RUNNER_A.peer_id) is None
        clock.t += 1.0 + LEASE_MARGIN_S + 0.1
        again = await desk.grant_claim(offer_id, secp, status)
        assert again is not None and again.reason == Reason.CLAIM_REFUSED
        assert desk.undelivered(job) == [(RUNNER_A.peer_id, offer_id)]
        assert desk.lapsed(job) and desk.strikes[RUNNER_A.peer_id] == 1 and desk.strikes[secp] == 0
        assert not desk.claimed(job) and desk.undelivered(job) == [(RUNNER_A.peer_id, offer_id)]
        # Its result, signed by some Ed25519 key and sent over its stream, is refused as the wrong executor.
        forged = await desk.accept_result(result_of(desk, offer_id, RUNNER_B), secp)
        assert forged is not None and forged.reason == Reason.WRONG_EXECUTOR and not job.results

    trio.run(main)


def test_a_claimant_without_the_offers_runtime_is_refused() -> None:
    """Its own intake should have refused the offer; the offerer judges what the claimant says of itself now."""

    def with_runtimes(identity: NodeIdentity, digest: str, *names: str) -> dict[str, Any]:
        caps = Capabilities({n: digest for n in names}, cores=1, memory_mb=512, arch="x86_64")
        return {**heartbeat(identity), "capabilities": caps.to_json()}

    async def main() -> None:
        desk, _, _, offer_id = setup(needs=Needs("python-science", "cd" * 32))
        old = await desk.grant_claim(offer_id, RUNNER_A.peer_id)  # from before runtimes: python only
        assert old is not None and old.reason == Reason.RUNTIME_UNAVAILABLE
        other = await desk.grant_claim(offer_id, RUNNER_A.peer_id, with_runtimes(RUNNER_A, "ef" * 32, "python-science"))
        assert other is not None and other.reason == Reason.RUNTIME_UNAVAILABLE  # another package set
        assert (
            await desk.grant_claim(offer_id, RUNNER_B.peer_id, with_runtimes(RUNNER_B, "cd" * 32, "python-science"))
            is None
        )

    trio.run(main)
