"""GossipSub on loopback, 3 nodes in one process: offers reach other sinks, invalid ones stop at the first hop,
duplicates collapse, heartbeats are authenticated, and a withdrawn node hears no offers but is still heard."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from mesh.identity import NodeIdentity
from mesh.offers import TaskOffer, open_offer
from mesh.reasons import Reason, Rejected, Rejection
from tests.test_p2p_fakes import LOOPBACK, FakeDesk, RecordingSink, run_trio, wait_until
from transports.direct import DirectTransport
from transports.gossip import HEARTBEAT_TOPIC, OFFERS_TOPIC, GossipTransport
from transports.p2p import P2PHost, open_host


def check_offer(raw: bytes) -> Rejection | None:
    """What the intake's validator does: codec checks and the signature."""
    try:
        open_offer(raw)
    except Rejected as exc:
        return exc.rejection
    return None


def accept_anything(raw: bytes) -> Rejection | None:
    return None


@dataclass
class Node:
    identity: NodeIdentity
    host: P2PHost
    sink: RecordingSink
    desk: FakeDesk
    direct: DirectTransport
    gossip: GossipTransport
    sandbox_mode: str
    validated: list[bytes] = field(default_factory=list)
    heartbeats: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    spoof_peer_id: str | None = None

    def heard_from(self, other: Node) -> list[dict[str, Any]]:
        return [beat for sender, beat in self.heartbeats if sender == other.host.peer_id]

    def offer(self, code: str = "print(1)") -> bytes:
        return TaskOffer.create(self.identity, language="python", code=code, reply_to=tuple(self.host.addrs)).sign(
            self.identity
        )


@asynccontextmanager
async def nodes(
    validators: list[Callable[[bytes], Rejection | None]],
    *,
    sandbox_modes: list[str] | None = None,
    participating: list[bool] | None = None,
) -> AsyncIterator[list[Node]]:
    count = len(validators)
    modes = sandbox_modes or ["docker"] * count
    joined = participating or [True] * count
    async with AsyncExitStack() as stack:
        identities = [NodeIdentity.generate() for _ in range(count)]
        hosts = [await stack.enter_async_context(open_host(i, [LOOPBACK])) for i in identities]
        # The nursery sits inside every host: gossip tasks end before the hosts under them close.
        nursery = await stack.enter_async_context(trio.open_nursery())
        stack.callback(nursery.cancel_scope.cancel)
        made: list[Node] = []
        for identity, host, validate, mode, takes_offers in zip(
            identities, hosts, validators, modes, joined, strict=True
        ):
            sink, desk = RecordingSink(participating=takes_offers), FakeDesk()
            sink.nursery = nursery
            direct = DirectTransport(host, desk)
            await nursery.start(direct.run, sink)
            node = Node(identity, host, sink, desk, direct, None, mode)  # type: ignore[arg-type]

            def recording(raw: bytes, node: Node = node, validate: Any = validate) -> Rejection | None:
                node.validated.append(raw)
                result: Rejection | None = validate(raw)
                return result

            def beat(node: Node = node) -> dict[str, Any]:
                peer_id = node.spoof_peer_id or node.host.peer_id
                return {"peerId": peer_id, "sandboxMode": node.sandbox_mode, "freeSlots": 1, "languages": ["python"]}

            def on_heartbeat(sender: str, data: dict[str, Any], node: Node = node) -> None:
                node.heartbeats.append((sender, data))

            node.gossip = GossipTransport(
                host,
                direct,
                validate=recording,
                heartbeat=beat,
                on_heartbeat=on_heartbeat,
                heartbeat_interval=0.2,
            )
            await nursery.start(node.gossip.run, sink)
            made.append(node)
        yield made


async def link(a: Node, b: Node) -> None:
    """Connect a to b and wait until each is in the other's offers mesh (when both take offers)."""
    await a.host.connect(b.host.addrs[0])
    if a.gossip.subscribed and b.gossip.subscribed:
        await wait_until(
            lambda: b.host.peer_id in a.gossip.mesh_peers() and a.host.peer_id in b.gossip.mesh_peers(),
            what="offers mesh to form",
        )


def test_a_valid_offer_reaches_every_other_sink_and_claim_and_reply_reach_the_offerer() -> None:
    async def main() -> None:
        async with nodes([check_offer] * 3) as (a, b, c):
            await link(a, b)
            await link(b, c)  # line A-B-C: C hears A only through B
            offer = a.offer()
            published = time.perf_counter()
            assert await a.gossip.publish_offer(offer) is None
            await wait_until(lambda: len(c.sink.deliveries) == 1, what="delivery at C")
            await wait_until(lambda: len(b.sink.deliveries) == 1, what="delivery at B")
            one_hop = (b.sink.delivered_at[0] - published) * 1000
            two_hops = (c.sink.delivered_at[0] - published) * 1000
            print(f"\ngossip delivery: one hop {one_hop:.1f} ms, two hops {two_hops:.1f} ms")
            assert a.sink.deliveries == []  # our own offer is not delivered to us

            delivery = c.sink.deliveries[0]
            assert (delivery.raw, delivery.transport, delivery.sender) == (offer, "gossip", a.host.peer_id)
            # C is not connected to A: the claim dials A at the offer's replyTo address.
            assert await delivery.claim() is True
            await delivery.reply(b"signed result")
            assert a.desk.claims == [(open_offer(offer).offer.offer_id, c.host.peer_id)]
            assert a.desk.results == [(b"signed result", c.host.peer_id)]
            a.desk.claim_answer = Rejection(Reason.CLAIM_REFUSED, "taken")
            assert await b.sink.deliveries[0].claim() is False

    run_trio(main)


def test_an_invalid_offer_is_not_forwarded_past_the_first_hop() -> None:
    async def main() -> None:
        # A forwards anything (a careless or hostile publisher), B validates, C would accept anything: if C never
        # even sees the bad offer, B did not forward it.
        async with nodes([accept_anything, check_offer, accept_anything]) as (a, b, c):
            await link(a, b)
            await link(b, c)
            good = a.offer()
            bad = bytearray(a.offer(code="print('tampered')"))
            bad[-1] ^= 1  # last byte of the signature
            assert await a.gossip.publish_offer(bytes(bad)) is None
            assert await a.gossip.publish_offer(good) is None
            # Published after the bad one: once C has the good offer, the bad one would have arrived before it.
            await wait_until(lambda: good in c.sink.raws(), what="good offer at C")
            assert bytes(bad) in b.validated
            assert b.gossip.stats["offer_rejected:bad_signature"] == 1
            assert bytes(bad) not in b.sink.raws()
            assert bytes(bad) not in c.validated and bytes(bad) not in c.sink.raws()

    run_trio(main)


def test_a_duplicate_offer_collapses_to_one_delivery_per_node() -> None:
    async def main() -> None:
        async with nodes([check_offer] * 3) as (a, b, c):
            await link(a, b)
            await link(b, c)
            await link(a, c)  # a triangle: every node hears each offer on two paths
            offer = a.offer()
            for _ in range(3):
                assert await a.gossip.publish_offer(offer) is None
            assert await c.gossip.publish_offer(offer) is None  # the same bytes from another publisher
            sentinel = a.offer(code="print(2)")
            assert await a.gossip.publish_offer(sentinel) is None
            await wait_until(lambda: sentinel in b.sink.raws() and sentinel in c.sink.raws(), what="sentinel")
            assert b.sink.raws().count(offer) == 1
            assert c.sink.raws().count(offer) == 1
            assert a.sink.raws().count(offer) == 0

    run_trio(main)


def test_heartbeats_are_seen_with_their_sandbox_mode_and_spoofed_ones_are_dropped() -> None:
    async def main() -> None:
        async with nodes([check_offer] * 3, sandbox_modes=["docker", "none", "docker"]) as (a, b, c):
            # C claims to be A in its heartbeat body. Its own validator would refuse to publish that, so C plays a
            # hostile node that has removed it.
            c.spoof_peer_id = a.host.peer_id
            c.gossip.pubsub.remove_topic_validator(HEARTBEAT_TOPIC)
            await link(a, b)
            await link(b, c)
            await wait_until(lambda: bool(c.heard_from(a)) and bool(a.heard_from(b)), what="heartbeats")
            assert c.heard_from(a)[-1]["sandboxMode"] == "docker"  # two hops, through B
            assert a.heard_from(b)[-1]["sandboxMode"] == "none"
            await wait_until(lambda: b.gossip.stats["heartbeat_wrong_peer"] >= 2, what="spoofed heartbeats refused")
            # (C's genuine heartbeats from before the spoofing may still be heard: libp2p replays recent messages
            # to a new peer.) No heartbeat reached anyone under a peerId other than its authenticated sender's.
            assert all(beat["peerId"] == sender for sender, beat in a.heartbeats + b.heartbeats)

    run_trio(main)


def test_a_withdrawn_node_hears_no_offers_is_still_heard_and_can_rejoin() -> None:
    async def main() -> None:
        async with nodes([check_offer] * 3, participating=[True, False, True]) as (a, b, c):
            assert not b.gossip.subscribed  # a node that is not participating never subscribes
            await link(a, c)
            await a.host.connect(b.host.addrs[0])
            await c.host.connect(b.host.addrs[0])
            first = a.offer(code="print('first')")
            assert await a.gossip.publish_offer(first) is None
            await wait_until(lambda: first in c.sink.raws(), what="offer at C")
            await wait_until(lambda: bool(a.heard_from(b)), what="B's heartbeat at A")
            assert b.sink.deliveries == [] and first not in b.validated

            b.sink.participating = True
            await b.gossip.rejoin()
            assert b.gossip.subscribed
            await wait_until(lambda: b.host.peer_id in a.gossip.mesh_peers(), what="B back in A's mesh")
            second = a.offer(code="print('second')")
            assert await a.gossip.publish_offer(second) is None
            await wait_until(lambda: second in b.sink.raws(), what="offer at B after rejoin")

            await b.gossip.withdraw()
            assert not b.gossip.subscribed
            await wait_until(lambda: b.host.peer_id not in a.gossip.mesh_peers(), what="B out of A's mesh")
            seen = len(a.heard_from(b))
            third = a.offer(code="print('third')")
            assert await a.gossip.publish_offer(third) is None
            await wait_until(lambda: third in c.sink.raws(), what="third offer at C")
            await wait_until(lambda: len(a.heard_from(b)) > seen, what="B still heard after withdrawing")
            assert third not in b.sink.raws()
            assert OFFERS_TOPIC not in b.gossip.pubsub.topic_ids

    run_trio(main, deadline=90)
