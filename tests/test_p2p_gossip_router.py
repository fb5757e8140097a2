"""The GossipSub router as we run it, and the py-libp2p 0.8.1 behaviour each override answers.

- One message id everywhere: the message cache (what IHAVE advertises, what IWANT is served from) is keyed by
  `message_id`, like the seen cache. Upstream keys it by `from + seqno`; a test pins that, so the day upstream changes
  it we look at `MessageIdCache` again.
- No adaptive gossip: the heartbeat stays at 1 s past the point where upstream's adaptation stretches it to 30 s or
  more (and a test shows that it still does, upstream, so the guard keeps meaning something).
- meshsub 1.2/1.1/1.0 only, as a peer sees it in multistream-select and in identify.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
import trio
from libp2p.abc import INetStream
from libp2p.identity.identify.identify import ID as IDENTIFY_PROTOCOL
from libp2p.identity.identify.identify import parse_identify_response
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.mcache import MessageCache
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.tools.anyio_service import background_trio_service
from libp2p.utils import encode_varint_prefixed, read_varint_prefixed_bytes

from tests.test_p2p_fakes import LOOPBACK, run_trio, wait_until
from tests.test_p2p_gossip import check_offer, link, nodes
from transports.gossip import (
    MESHSUB_PROTOCOLS,
    OFFERS_TOPIC,
    MessageIdCache,
    message_id,
)
from transports.p2p import DialError, P2PHost, open_host
from transports.wire.identity import NodeIdentity

UNSPECIFIED_MESHSUB = ("/meshsub/1.3.0", "/meshsub/1.4.0", "/meshsub/2.0.0")

# Any topic but the offers topic gets the libp2p default id (from || seqno).
OTHER_TOPIC = "edgecoder/other/1"


def pubsub_message(topic: str, data: bytes, *, sender: bytes = b"\x00\x24peer", seqno: int = 1) -> rpc_pb2.Message:
    return rpc_pb2.Message(from_id=sender, seqno=seqno.to_bytes(8, "big"), data=data, topicIDs=[topic])


# -- one message id -----------------------------------------------------------------------------------------------


def test_message_ids_are_sha256_of_the_data_for_offers_and_from_seqno_for_heartbeats() -> None:
    offer = pubsub_message(OFFERS_TOPIC, b"an offer", sender=b"\x00\x24alice", seqno=7)
    same_bytes_other_sender = pubsub_message(OFFERS_TOPIC, b"an offer", sender=b"\x00\x24bob", seqno=9)
    assert message_id(offer) == hashlib.sha256(b"an offer").digest() == message_id(same_bytes_other_sender)
    beat = pubsub_message(OTHER_TOPIC, b"same body", sender=b"\x00\x24alice", seqno=7)
    next_beat = pubsub_message(OTHER_TOPIC, b"same body", sender=b"\x00\x24alice", seqno=8)
    assert message_id(beat) == b"\x00\x24alice" + (7).to_bytes(8, "big")
    assert message_id(beat) != message_id(next_beat)  # identical heartbeats are still two heartbeats


def test_upstream_message_cache_still_keys_by_from_and_seqno() -> None:
    # Why `MessageIdCache` exists. When this fails, upstream has changed its cache: check whether it now honours the
    # pubsub's `msg_id_constructor` (then drop the subclass) or has moved its layout (then fix `put`).
    cache = MessageCache(window_size=3, history_size=5)
    msg = pubsub_message(OFFERS_TOPIC, b"offer", sender=b"\x00\x24alice", seqno=3)
    cache.put(msg)
    assert cache.window(OFFERS_TOPIC) == [b"\x00\x24alice" + (3).to_bytes(8, "big")]
    assert cache.get(hashlib.sha256(b"offer").digest()) is None


def test_our_cache_is_keyed_by_message_id_and_ages_through_upstreams_own_window_and_shift() -> None:
    cache = MessageIdCache(window_size=3, history_size=5, message_id=message_id)
    offer = pubsub_message(OFFERS_TOPIC, b"offer", sender=b"\x00\x24alice", seqno=3)
    digest = hashlib.sha256(b"offer").digest()
    cache.put(offer)
    cache.put(pubsub_message(OFFERS_TOPIC, b"offer", sender=b"\x00\x24bob", seqno=4))  # the same offer, relayed
    beat = pubsub_message(OTHER_TOPIC, b"beat", sender=b"\x00\x24alice", seqno=5)
    cache.put(beat)
    # upstream's `window`, `get` and `shift` read what our `put` wrote
    assert cache.window(OFFERS_TOPIC) == [digest]
    assert cache.window(OTHER_TOPIC) == [b"\x00\x24alice" + (5).to_bytes(8, "big")]
    assert cache.get(digest) is offer
    assert cache.get(b"\x00\x24alice" + (3).to_bytes(8, "big")) is None
    for _ in range(3):
        cache.shift()
    assert cache.window(OFFERS_TOPIC) == []  # out of the gossip window ...
    assert cache.get(digest) is offer  # ... still served to IWANT until the history ends
    for _ in range(2):
        cache.shift()
    assert cache.get(digest) is None


def test_the_router_binds_its_cache_to_the_pubsubs_own_message_id() -> None:
    async def main() -> None:
        async with nodes([check_offer]) as (a,):
            router = a.gossip.router
            assert isinstance(router.mcache, MessageIdCache)
            assert router.mcache.message_id == a.gossip.pubsub.get_message_id
            assert a.gossip.pubsub.get_message_id(pubsub_message(OFFERS_TOPIC, b"x")) == hashlib.sha256(b"x").digest()

    run_trio(main)


class RawMeshsubPeer:
    """A bare GossipSub peer on a real host: it records every RPC our node sends it and sends RPCs of its own.

    It speaks the wire protocol and nothing else (no mesh, no validation), which is what lets a test send one exact
    IWANT and see exactly what comes back."""

    def __init__(self, host: P2PHost) -> None:
        self.host = host
        self.received: list[rpc_pb2.RPC] = []
        self.outbound: INetStream | None = None
        for protocol in MESHSUB_PROTOCOLS:
            host.set_handler(protocol, self._read)

    async def _read(self, stream: INetStream) -> None:
        try:
            while True:
                rpc = rpc_pb2.RPC()
                rpc.ParseFromString(await read_varint_prefixed_bytes(stream))
                self.received.append(rpc)
        except Exception:  # the stream ended: the test is over
            return

    async def send(self, peer: str, rpc: rpc_pb2.RPC) -> None:
        if self.outbound is None:
            self.outbound = await self.host.open_stream(peer, MESHSUB_PROTOCOLS[0])
        await self.outbound.write(encode_varint_prefixed(rpc.SerializeToString()))

    def published(self) -> list[bytes]:
        return [bytes(msg.data) for rpc in self.received for msg in rpc.publish]


def test_an_iwant_is_answered_for_an_offers_sha256_and_not_for_from_seqno() -> None:
    async def main() -> None:
        async with nodes([check_offer]) as (a,), open_host(NodeIdentity.generate(), [LOOPBACK]) as host:
            raw = RawMeshsubPeer(host)
            await host.connect(a.host.addrs[0])
            await wait_until(lambda: ID.from_base58(host.peer_id) in a.gossip.pubsub.peers, what="raw peer registered")
            first, second = a.offer(code="print(1)"), a.offer(code="print(2)")
            for offer in (first, second):
                assert await a.gossip.publish_offer(offer) is None
            digests = [hashlib.sha256(o).digest() for o in (first, second)]
            # what our IHAVE advertises (newest heartbeat's slot first)
            assert sorted(a.gossip.router.mcache.window(OFFERS_TOPIC)) == sorted(digests)
            cached = a.gossip.router.mcache.get(digests[0])
            assert cached is not None
            assert raw.published() == []  # not subscribed: nothing was pushed to the raw peer
            # In order, in one RPC: the upstream id of `first`, its sha256, and `second`'s sha256 as a sentinel. Our
            # node answers IWANTs in order, so once `second` is back every earlier answer is too.
            control = rpc_pb2.ControlMessage(
                iwant=[
                    rpc_pb2.ControlIWant(messageIDs=[bytes(cached.from_id) + bytes(cached.seqno)]),
                    rpc_pb2.ControlIWant(messageIDs=[digests[0]]),
                    rpc_pb2.ControlIWant(messageIDs=[digests[1]]),
                ]
            )
            await raw.send(a.host.peer_id, rpc_pb2.RPC(control=control))
            await wait_until(lambda: second in raw.published(), what="the IWANTed offers")
            assert raw.published() == [first, second]

    run_trio(main)


# -- no adaptive gossip -------------------------------------------------------------------------------------------


async def heartbeats(router: GossipSub, count: int, *, timeout: float = 10.0) -> None:
    """Until `count` heartbeats have run: each one shifts the message cache, whose newest slot is then a new list."""
    newest = router.mcache.history[0]
    await wait_until(
        lambda: any(slot is newest for slot in router.mcache.history[count:]),
        timeout=timeout,
        what=f"{count} heartbeats",
    )


def test_the_heartbeat_stays_at_one_second_past_the_point_where_adaptive_gossip_would_stretch_it() -> None:
    async def main() -> None:
        async with nodes([check_offer] * 2) as (a, b):
            await link(a, b)  # one mesh peer where the degree is 6: what upstream's adaptation calls unhealthy
            router = a.gossip.router
            assert router.adaptive_gossip_enabled is False
            assert router.heartbeat_interval == router.heartbeat_interval_base == 1
            # Upstream re-judges health in the first heartbeat 30 s after this stamp: make that the next one.
            router.last_health_update = 0
            await heartbeats(router, 3)  # at a stretched 30 s this would time out
            assert router.heartbeat_interval == 1

    run_trio(main, deadline=30)


@asynccontextmanager
async def upstream_pubsub(count: int) -> AsyncIterator[list[tuple[P2PHost, GossipSub]]]:
    """`count` hosts running stock GossipSub (upstream defaults bar the interval), all subscribed to one topic."""
    async with AsyncExitStack() as stack:
        made = []
        for _ in range(count):
            host = await stack.enter_async_context(open_host(NodeIdentity.generate(), [LOOPBACK]))
            router = GossipSub(
                protocols=list(MESHSUB_PROTOCOLS), degree=6, degree_low=4, degree_high=12, heartbeat_interval=1
            )
            pubsub = Pubsub(host.host, router)
            await stack.enter_async_context(background_trio_service(pubsub))
            await stack.enter_async_context(background_trio_service(router))
            await pubsub.wait_until_ready()
            await pubsub.subscribe("t")
            made.append((host, router))
        yield made


def test_upstream_adaptive_gossip_is_on_by_default_and_still_stretches_a_small_meshs_heartbeat() -> None:
    # What the override above guards against. When this fails upstream has changed the adaptation (or renamed
    # what the test above watches): check whether `adaptive_gossip_enabled=False` is still needed, and still enough.
    assert inspect.signature(GossipSub.__init__).parameters["adaptive_gossip_enabled"].default is True

    async def main() -> None:
        async with upstream_pubsub(2) as [(a, router), (b, _)]:
            await a.connect(b.addrs[0])
            await wait_until(lambda: bool(router.mesh.get("t")), what="a mesh")
            router.last_health_update = 0
            await wait_until(lambda: router.last_health_update != 0, what="the health check")
            assert router.heartbeat_interval >= 30

    run_trio(main)


# -- meshsub 1.2 / 1.1 / 1.0 --------------------------------------------------------------------------------------


def test_a_peer_is_offered_meshsub_1_2_1_1_and_1_0_and_refused_the_unspecified_versions() -> None:
    async def main() -> None:
        async with nodes([check_offer]) as (a,), open_host(NodeIdentity.generate(), [LOOPBACK]) as peer:
            assert tuple(a.gossip.router.get_protocols()) == MESHSUB_PROTOCOLS
            await peer.connect(a.host.addrs[0])
            # identify, as a peer reads it off the wire
            stream = await peer.open_stream(a.host.peer_id, IDENTIFY_PROTOCOL)
            response = b""
            with trio.fail_after(5), contextlib.suppress(StreamEOF):  # the answer ends with the stream
                while True:
                    response += await stream.read()
            advertised = [p for p in parse_identify_response(response).protocols if p.startswith("/meshsub/")]
            assert advertised == [str(p) for p in MESHSUB_PROTOCOLS]
            # multistream-select, one version at a time
            for version in UNSPECIFIED_MESHSUB:
                with pytest.raises(DialError, match="failed"):
                    await peer.open_stream(a.host.peer_id, version)
            # Each offered version from a peer of its own: a pubsub peer opens one stream, and our node takes its end
            # as that peer's pubsub stream.
            for version in MESHSUB_PROTOCOLS:
                async with open_host(NodeIdentity.generate(), [LOOPBACK]) as other:
                    await other.connect(a.host.addrs[0])
                    stream = await other.open_stream(a.host.peer_id, version)
                    assert stream.get_protocol() == version

    run_trio(main)
