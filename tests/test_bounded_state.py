"""Issue 10's unbounded state, bounded: the node's history of runs and the offerer's claim desk (no Docker)."""

from __future__ import annotations

import trio

from mesh.claims import ClaimDesk
from mesh.node import RAN_HISTORY, MeshNode, NodeConfig
from mesh.peers import PeerDirectory
from transports.wire.identity import NodeIdentity
from transports.wire.offers import TaskOffer, parse_offer
from transports.wire.reasons import Reason

OFFERER = NodeIdentity.generate()


def posted_offer() -> bytes:
    return TaskOffer.create(OFFERER, language="python", code="print(1)").sign(OFFERER)


def test_the_claim_desk_keeps_at_most_its_capacity_of_posted_offers_forgetting_the_oldest() -> None:
    async def main() -> None:
        desk = ClaimDesk(PeerDirectory(stale_after=10), capacity=3)
        ids = []
        for _ in range(5):
            received = parse_offer(posted_offer())
            desk.post(received)
            ids.append(received.offer.offer_id)
        assert len(desk) == 3
        assert [desk.get(i) is not None for i in ids] == [False, False, True, True, True]
        gone = await desk.grant_claim(ids[0], NodeIdentity.generate().peer_id)
        assert gone is not None and gone.reason == Reason.UNKNOWN_OFFER  # a typed answer, not a lookup error
        desk.withdraw(ids[4])
        desk.withdraw(ids[4])  # twice is harmless
        assert len(desk) == 2 and desk.get(ids[4]) is None

    trio.run(main)


def test_a_gossip_offer_that_ends_withdraws_its_issues_from_the_desk() -> None:
    """`offer_gossip` posts each issue, and whatever the outcome (here: nobody runs it, a timeout) withdraws them all:
    without the withdrawal every offer an offerer ever made would stay on its desk until the capacity evicted it."""

    async def main() -> None:
        async with MeshNode.open(NodeConfig(identity=NodeIdentity.generate(), sandbox_mode="none")) as node:
            for _ in range(3):
                outcome = await node.offer_gossip(node.make_offer(language="python", code="print(1)"), timeout=0.5)
                assert outcome.refusal is not None and outcome.refusal.reason == Reason.TIMEOUT
                assert outcome.issues >= 1
                assert len(node.desk) == 0

    trio.run(main)


def test_the_nodes_history_of_runs_keeps_only_the_newest_ran_history_ids() -> None:
    """`MeshNode.ran` is what `_run` appends each run offer id to; were it a list or a deque without a bound (as it
    once was), the maxlen check fails and the length grows past RAN_HISTORY."""

    async def main() -> None:
        async with MeshNode.open(NodeConfig(identity=NodeIdentity.generate(), sandbox_mode="none")) as node:
            assert node.ran.maxlen == RAN_HISTORY
            ids = [i.to_bytes(16, "big") for i in range(RAN_HISTORY + 5)]
            for offer_id in ids:
                node.ran.append(offer_id)
            assert len(node.ran) == RAN_HISTORY and node.ran[0] == ids[5] and node.ran[-1] == ids[-1]

    trio.run(main)
