"""GossipSub on loopback, 3 nodes in one process: offers reach other sinks, invalid ones stop at the first hop,
duplicates collapse, and a withdrawn node forwards offers but takes none. (Presence is tests/test_presence.py.)"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from tests.test_p2p_fakes import LOOPBACK, FakeDesk, RecordingSink, run_trio, wait_until
from transports.direct import DirectTransport
from transports.gossip import GossipTransport
from transports.p2p import P2PHost, open_host
from transports.wire.identity import NodeIdentity
from transports.wire.offers import TaskOffer, open_offer
from transports.wire.reasons import Reason, Rejected, Rejection


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

            node.gossip = GossipTransport(host, direct, validate=recording)
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


def test_a_node_that_does_not_participate_forwards_offers_but_takes_none_and_takes_them_again_once_it_does() -> None:
    """B cannot sandbox: it stays in the offers mesh and forwards offers (a seed or relay must), and hands none to
    its intake; once it participates, it takes them."""

    async def main() -> None:
        async with nodes([check_offer] * 3, participating=[True, False, True]) as (a, b, c):
            assert b.gossip.subscribed  # every node is in the offers mesh
            await link(a, b)
            await link(b, c)  # A and C are connected only through B
            first = a.offer(code="print('first')")
            assert await a.gossip.publish_offer(first) is None
            await wait_until(lambda: first in c.sink.raws(), what="offer at C, through B")
            assert b.sink.deliveries == [] and first in b.validated  # forwarded (validated first), not taken
            assert b.gossip.stats["offer_forwarded_not_taken"] >= 1

            b.sink.participating = True
            second = a.offer(code="print('second')")
            assert await a.gossip.publish_offer(second) is None
            await wait_until(lambda: second in b.sink.raws(), what="offer taken at B once it participates")

            b.sink.participating = False
            third = a.offer(code="print('third')")
            assert await a.gossip.publish_offer(third) is None
            await wait_until(lambda: third in c.sink.raws(), what="third offer at C")
            assert third not in b.sink.raws()

    run_trio(main, deadline=90)
