"""The lean pubsub path does what it says, on real hosts (LEAN against STOCK in the same test): fewer peer records,
IDONTWANTs only for large offers, queued RPCs in one write, yamux credit every half window; and its pieces hold
their properties (buffered reads are reads, the address cache expires, the delivery history is trimmed, bans reach
pubsub). The CPU it saves is measured by benchmarks/bench_pubsub.py, not here."""

from __future__ import annotations

import hashlib
import struct
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.stream_muxer.yamux.yamux import TYPE_WINDOW_UPDATE, YAMUX_HEADER_FORMAT
from libp2p.utils import encode_varint_prefixed
from libp2p.utils.varint import read_varint_prefixed_bytes_limited

from simulations.probes import SendCounter
from tests.pubsub_support import GossipNode, gossip_node, make_offer
from tests.test_p2p_fakes import run_trio, wait_until
from transports.gossip import MESHSUB_PROTOCOLS, OFFERS_TOPIC, message_id
from transports.pubsub import (
    LEAN,
    STOCK,
    BufferedNoiseTransport,
    CachedAddrsHost,
    Holders,
    LeanPubsub,
    PubsubTuning,
)
from transports.pubsub.reads import BufferedRawConnection, BufferedReader
from transports.pubsub.router import LeanGossipSub, trim_delivery_history
from transports.pubsub.tuning import IDONTWANT_THRESHOLD
from transports.wire.identity import NodeIdentity

# -- the pieces ---------------------------------------------------------------------------------------------------


class Chunked:
    """A stream that returns its bytes in the given chunk sizes (each at most what was asked for), then EOF."""

    def __init__(self, data: bytes, chunks: list[int]) -> None:
        self.data = data
        self.chunks = chunks
        self.reads = 0
        self.muxed_conn = "forwarded"

    async def read(self, n: int | None = None) -> bytes:
        self.reads += 1
        size = self.chunks[(self.reads - 1) % len(self.chunks)] if self.chunks else len(self.data)
        take = min(size, len(self.data) if n is None or n < 0 else n)
        out, self.data = self.data[:take], self.data[take:]
        return out


@settings(max_examples=200, deadline=None)
@given(
    messages=st.lists(st.binary(max_size=300), max_size=20),
    chunks=st.lists(st.integers(1, 70_000), max_size=5),
    wrapper=st.sampled_from([BufferedReader, BufferedRawConnection]),
)
def test_buffered_reads_give_back_exactly_the_messages_however_the_bytes_arrive(
    messages: list[bytes], chunks: list[int], wrapper: type
) -> None:
    wire = b"".join(encode_varint_prefixed(m) for m in messages)

    async def main() -> None:
        inner = Chunked(wire, chunks)
        reader = wrapper(inner)
        got = [await read_varint_prefixed_bytes_limited(reader, 1 << 20) for _ in messages]
        assert got == messages
        assert await reader.read(10) == b""  # EOF passes through
        assert reader.muxed_conn == "forwarded"  # everything but read is the stream's
        if not chunks:  # the stream hands over all it has at once: one read served every message, then EOF
            assert inner.reads == (2 if wire else 1)

    trio.run(main)


@given(n=st.integers(0, 100), ask=st.integers(1, 100))
def test_a_buffered_read_returns_at_most_what_was_asked(n: int, ask: int) -> None:
    async def main() -> None:
        reader = BufferedReader(Chunked(b"z" * n, []))
        total = b""
        while chunk := await reader.read(ask):
            assert 0 < len(chunk) <= ask
            total += chunk
        assert total == b"z" * n

    trio.run(main)


def test_the_address_cache_serves_one_computation_per_ttl_and_forwards_the_rest() -> None:
    class Host:
        calls = 0

        def get_addrs(self) -> list[str]:
            Host.calls += 1
            return [f"/ip4/127.0.0.1/tcp/{Host.calls}"]

        def get_id(self) -> str:
            return "me"

    now = [0.0]
    cached = CachedAddrsHost(Host(), ttl=1.0, clock=lambda: now[0])  # type: ignore[arg-type]
    assert cached.get_addrs() == cached.get_addrs() == ["/ip4/127.0.0.1/tcp/1"]
    now[0] = 0.99
    assert cached.get_addrs() == ["/ip4/127.0.0.1/tcp/1"]
    now[0] = 1.0
    assert cached.get_addrs() == ["/ip4/127.0.0.1/tcp/2"]  # a changed address is seen within the ttl
    assert cached.get_id() == "me" and Host.calls == 2
    cached.get_addrs().append("mutated")
    assert cached.get_addrs() == ["/ip4/127.0.0.1/tcp/2"]  # callers get a copy


@given(times=st.lists(st.floats(0, 1000, allow_nan=False), max_size=50), keep=st.floats(0, 500))
def test_trimming_the_delivery_history_keeps_exactly_the_recent_entries(times: list[float], keep: float) -> None:
    router = GossipSub(protocols=[], degree=6, degree_low=4, degree_high=12)
    router.recent_message_deliveries[OFFERS_TOPIC] = sorted(times)
    left = trim_delivery_history(router, keep=keep, now=1000.0)
    assert router.recent_message_deliveries[OFFERS_TOPIC] == [t for t in sorted(times) if t > 1000.0 - keep]
    assert left == len(router.recent_message_deliveries[OFFERS_TOPIC])


def test_the_router_trims_its_delivery_history_at_every_heartbeat_cleanup() -> None:
    router = LeanGossipSub(LEAN, protocols=list(MESHSUB_PROTOCOLS), degree=6, degree_low=4, degree_high=12)
    router.recent_message_deliveries[OFFERS_TOPIC].extend([0.0] * 500)  # long expired
    router._periodic_security_cleanup()  # what GossipSub.heartbeat calls each time (pinned)
    assert router.recent_message_deliveries[OFFERS_TOPIC] == []


class _OfflineNetwork:
    def register_notifee(self, notifee: Any) -> None: ...


class _OfflineHost:
    """Just enough of a libp2p host to build a `LeanPubsub` that is never run: its bookkeeping, without I/O."""

    def get_network(self) -> _OfflineNetwork:
        return _OfflineNetwork()

    def set_stream_handler(self, protocol: Any, handler: Any) -> None: ...

    def get_private_key(self) -> Any:
        return None


def test_a_banned_peer_is_blacklisted_for_pubsub_and_nobody_else_is() -> None:
    banned = ID(NodeIdentity.generate().libp2p_keypair().public_key.serialize())
    other = ID(NodeIdentity.generate().libp2p_keypair().public_key.serialize())

    router = GossipSub(protocols=[], degree=6, degree_low=4, degree_high=12)
    pubsub = LeanPubsub(_OfflineHost(), router, banned=lambda peer: peer == banned)  # type: ignore[arg-type]
    assert pubsub.is_peer_blacklisted(banned) and not pubsub.is_peer_blacklisted(other)


# -- on real hosts ------------------------------------------------------------------------------------------------


@asynccontextmanager
async def linked(tuning: PubsubTuning) -> AsyncIterator[tuple[GossipNode, GossipNode, SendCounter]]:
    """Two nodes of `tuning`, connected and meshed: the sender, the receiver, and what the sender sends."""
    async with gossip_node(tuning=tuning) as a, gossip_node(tuning=tuning) as b:
        counter = SendCounter()
        counter.watch_pubsub(a.gossip.pubsub)  # before the peer connects, so that its sender is watched
        await a.host.connect(b.addr)
        await wait_until(lambda: a.host.peer_id in b.gossip.mesh_peers(), what="mesh at b")
        await wait_until(lambda: b.host.peer_id in a.gossip.mesh_peers(), what="mesh at a")
        yield a, b, counter


def large_offer(identity: NodeIdentity) -> bytes:
    raw = make_offer(identity, 0, input={"xs": list(range(1000, 1000 + IDONTWANT_THRESHOLD // 3))})
    assert len(raw) > IDONTWANT_THRESHOLD
    return raw


async def publish_and_wait(a: GossipNode, b: GossipNode, offers: list[bytes]) -> None:
    for raw in offers:
        assert await a.gossip.publish_offer(raw) is None
    await wait_until(lambda: set(offers) <= set(b.heard), what="offers at b")


def test_our_record_goes_once_per_stream_and_idontwant_only_for_large_offers_while_stock_sends_both_for_each() -> None:
    async def main() -> None:
        figures: dict[str, Counter[str]] = {}
        for name, tuning in (("lean", LEAN), ("stock", STOCK)):
            async with linked(tuning) as (a, b, counter):
                before = counter.snapshot()
                small = [make_offer(a.identity, i) for i in range(10)]
                await publish_and_wait(a, b, small)
                # B forwards to nobody (A sent them): IDONTWANTs come from A, the publisher, to B.
                large = large_offer(a.identity)
                await publish_and_wait(a, b, [large])
                sent = counter.snapshot()
                sent.subtract(before)
                figures[name] = sent
        lean, stock = figures["lean"], figures["stock"]
        assert lean["offer_copies"] == stock["offer_copies"] == 11
        assert lean["records"] == 0 and stock["records"] >= 11  # every RPC carries it upstream
        assert lean["idontwant_ids"] == 1  # the large offer only
        assert stock["idontwant_ids"] >= 11

    run_trio(main)


def test_rpcs_queued_for_one_peer_leave_in_one_write_with_coalescing_and_in_one_write_each_without() -> None:
    async def main() -> None:
        writes: dict[str, int] = {}
        for name, tuning in (("lean", LEAN), ("stock", STOCK)):
            async with linked(tuning) as (a, b, counter):
                stream = a.gossip.pubsub.peers[ID.from_base58(b.host.peer_id)]
                count = [0]
                write = stream.write
                # The first write waits until every publish is queued: what is queued meanwhile is what a sender
                # may coalesce, whatever checkpoints the publish path has (a router heartbeat taking a lock under
                # load once let the sender run between publishes).
                all_queued = trio.Event()

                async def counted(
                    data: bytes, write: Any = write, count: list[int] = count, gate: trio.Event = all_queued
                ) -> None:
                    count[0] += 1
                    await gate.wait()
                    await write(data)

                stream.write = counted  # type: ignore[method-assign]
                # 12, not more: upstream queues an IDONTWANT with each, and the per-peer queue holds 32 RPCs.
                offers = [make_offer(a.identity, i) for i in range(12)]
                for raw in offers:
                    await a.gossip.pubsub.publish(OFFERS_TOPIC, raw)
                await trio.sleep(0.05)  # the sender takes the first and waits in its write
                all_queued.set()
                await wait_until(lambda: counter.snapshot()["offer_copies"] >= 12, what="12 offers sent")
                await trio.sleep(0.2)  # let the writes finish
                writes[name] = count[0]
        assert writes["lean"] <= 2, writes
        assert writes["stock"] >= 12, writes

    run_trio(main)


def test_the_receiver_returns_yamux_credit_every_half_window_instead_of_after_each_read() -> None:
    async def main() -> None:
        updates: dict[str, int] = {}
        for name, tuning in (("lean", LEAN), ("stock", STOCK)):
            async with linked(tuning) as (a, b, _):
                conn = b.host.host.get_network().get_connections(ID.from_base58(a.host.peer_id))[0].muxed_conn
                # The pubsub stream a writes the offers on: credit for it comes back under its id. (Other streams of
                # the connection, presence pushes say, may return credit of their own meanwhile.)
                pubsub_stream: Any = a.gossip.pubsub.peers[ID.from_base58(b.host.peer_id)]
                sid = pubsub_stream.muxed_stream.stream_id
                seen = Counter[int]()
                write_frame = conn._write_frame  # type: ignore[attr-defined]

                async def counting(
                    data: bytes, write_frame: Any = write_frame, seen: Counter[int] = seen, sid: int = sid
                ) -> None:
                    _, kind, _, stream_id, _ = struct.unpack(YAMUX_HEADER_FORMAT, data[:12])
                    if stream_id == sid:
                        seen[kind] += 1
                    await write_frame(data)

                conn._write_frame = counting  # type: ignore[attr-defined]
                await publish_and_wait(a, b, [make_offer(a.identity, i) for i in range(40)])  # ~40 KB
                updates[name] = seen[TYPE_WINDOW_UPDATE]
        assert updates["lean"] == 0, updates  # under half a window read: nothing to return yet
        assert updates["stock"] >= 40, updates

    run_trio(main)


def test_a_lean_host_speaks_noise_through_the_buffered_transport_and_a_stock_one_does_not() -> None:
    async def main() -> None:
        for tuning, expected in ((LEAN, True), (STOCK, False)):
            async with gossip_node(tuning=tuning) as node:
                upgrader: Any = node.host.host.get_network().upgrader  # type: ignore[attr-defined]
                transports = list(upgrader.security_multistream.transports.values())
                assert [isinstance(t, BufferedNoiseTransport) for t in transports] == [expected]
                assert isinstance(node.gossip.pubsub, LeanPubsub) is expected

    run_trio(main)


# -- duplicates: dropped before pubsub's task, and never sent back to the peer that sent them ----------------------


@settings(max_examples=200, deadline=None)
@given(
    adds=st.lists(st.tuples(st.integers(-1, 40), st.integers(0, 9)), max_size=300),
    max_ids=st.integers(1, 16),
    max_peers=st.integers(1, 5),
)
def test_holders_remember_who_sent_each_of_the_newest_ids_within_their_bounds_until_the_peer_goes(
    adds: list[tuple[int, int]], max_ids: int, max_peers: int
) -> None:
    peers = [ID(bytes([0, 1, p])) for p in range(10)]
    holders = Holders(max_ids=max_ids, max_peers=max_peers)
    model: dict[bytes, list[ID]] = {}  # insertion-ordered: the oldest id first
    for i, p in adds:
        if i < 0:  # the peer is gone
            holders.forget(peers[p])
            for held in model.values():
                if peers[p] in held:
                    held.remove(peers[p])
            continue
        mid = bytes([i])
        holders.add(mid, peers[p])
        if mid not in model:
            model[mid] = [peers[p]]
            if len(model) > max_ids:
                del model[next(iter(model))]
        elif peers[p] not in model[mid] and len(model[mid]) < max_peers:
            model[mid].append(peers[p])
    assert len(holders) == len(model) <= max_ids
    for i in range(41):
        mid = bytes([i])
        assert set(holders.of(mid)) == set(model.get(mid, []))
        assert len(holders.of(mid)) <= max_peers


def _offer_message(identity: NodeIdentity, i: int) -> rpc_pb2.Message:
    return rpc_pb2.Message(data=make_offer(identity, i), topicIDs=[OFFERS_TOPIC], seqno=i.to_bytes(8, "big"))


def test_the_sender_leaves_out_what_the_peer_sent_us_and_writes_nothing_when_that_is_all() -> None:
    holder, other = (ID(NodeIdentity.generate().libp2p_keypair().public_key.serialize()) for _ in range(2))
    router = GossipSub(protocols=[], degree=6, degree_low=4, degree_high=12)
    pubsub = LeanPubsub(_OfflineHost(), router, msg_id_constructor=message_id)  # type: ignore[arg-type]
    identity = NodeIdentity.generate()
    held, fresh = _offer_message(identity, 1), _offer_message(identity, 2)
    assert pubsub.holders is not None
    pubsub.holders.add(message_id(held), holder)

    def encoded(peer: ID, *msgs: rpc_pb2.Message) -> list[rpc_pb2.RPC]:
        parts: list[bytes] = []
        size = pubsub._encode_into(parts, peer, rpc_pb2.RPC(publish=list(msgs)))
        assert size == sum(len(p) for p in parts)
        out = []
        for part in parts:
            rpc = rpc_pb2.RPC()
            rpc.ParseFromString(part[_varint_len(part) :])  # each part is one varint-prefixed RPC
            out.append(rpc)
        return out

    assert [list(r.publish) for r in encoded(holder, held, fresh)] == [[fresh]]
    assert encoded(holder, held) == []  # all of it held: nothing is written
    assert [list(r.publish) for r in encoded(other, held, fresh)] == [[held, fresh]]
    assert pubsub.held_skipped == 2


def _varint_len(data: bytes) -> int:
    n = 0
    while data[n] & 0x80:
        n += 1
    return n + 1


@asynccontextmanager
async def line(tuning: PubsubTuning) -> AsyncIterator[tuple[GossipNode, GossipNode, GossipNode]]:
    """a - b - c, meshed: b is the only path between a and c."""
    async with gossip_node(tuning=tuning) as a, gossip_node(tuning=tuning) as b, gossip_node(tuning=tuning) as c:
        await a.host.connect(b.addr)
        await c.host.connect(b.addr)
        await wait_until(
            lambda: all(y.host.peer_id in x.gossip.mesh_peers() for x, y in ((a, b), (b, a), (c, b), (b, c))),
            what="the mesh a - b - c",
        )
        yield a, b, c


def test_a_copy_of_an_offer_already_forwarded_is_dropped_before_push_msg_and_its_sender_noted() -> None:
    async def pushes_of_one_offer_and_a_copy(tuning: PubsubTuning) -> int:
        async with line(tuning) as (a, b, c):
            raw = make_offer(a.identity, 0)
            mid = hashlib.sha256(raw).digest()
            pubsub: Any = b.gossip.pubsub
            push = pubsub.push_msg
            pushes = 0

            async def counted(forwarder: ID, msg: rpc_pb2.Message) -> None:
                nonlocal pushes
                if bytes(msg.data) == raw:
                    pushes += 1
                await push(forwarder, msg)

            pubsub.push_msg = counted
            assert await a.gossip.publish_offer(raw) is None
            await wait_until(lambda: raw in c.heard, what="the offer at c, through b")
            # c sends b the very message b forwarded to it: a copy b has seen.
            copy = c.gossip.router.mcache.get(mid)
            assert copy is not None
            stream = c.gossip.pubsub.peers[ID.from_base58(b.host.peer_id)]
            await stream.write(encode_varint_prefixed(rpc_pb2.RPC(publish=[copy]).SerializeToString()))
            if isinstance(pubsub, LeanPubsub):
                await wait_until(lambda: pubsub.duplicates_dropped >= 1, what="the copy dropped at b")
                assert pubsub.holders is not None
                assert ID.from_base58(c.host.peer_id) in pubsub.holders.of(mid)
                pubsub._handle_dead_peer(ID.from_base58(c.host.peer_id))  # what pubsub does when c goes
                assert ID.from_base58(c.host.peer_id) not in pubsub.holders.of(mid)
            else:
                await wait_until(lambda: pushes >= 2, what="the copy at b's push_msg")
            assert b.heard == [raw]  # delivered once either way
            return pushes

    async def main() -> None:
        assert await pushes_of_one_offer_and_a_copy(LEAN) == 1
        assert await pushes_of_one_offer_and_a_copy(STOCK) == 2

    run_trio(main)


def test_a_new_offer_is_not_forwarded_to_a_peer_known_to_have_it() -> None:
    async def main() -> None:
        async with line(LEAN) as (a, b, c):
            c_id = ID.from_base58(c.host.peer_id)
            held, fresh = make_offer(a.identity, 1), make_offer(a.identity, 2)
            pubsub = b.gossip.pubsub
            assert isinstance(pubsub, LeanPubsub) and pubsub.holders is not None
            # As if c's copy of `held` had reached b first (they race in a real mesh; here it is made so).
            pubsub.holders.add(hashlib.sha256(held).digest(), c_id)
            sent: list[tuple[ID, bytes]] = []
            send_rpc = b.gossip.router.send_rpc

            def recorded(peer_id: ID, rpc: rpc_pb2.RPC, priority: bool = False) -> None:
                sent.extend((peer_id, bytes(m.data)) for m in rpc.publish)
                send_rpc(peer_id, rpc, priority)

            b.gossip.router.send_rpc = recorded  # type: ignore[method-assign]
            for raw in (held, fresh):
                assert await a.gossip.publish_offer(raw) is None
            # b forwards an offer in the same step as it validates it, before it delivers it.
            await wait_until(lambda: {held, fresh} <= set(b.heard), what="both offers at b")
            assert (c_id, fresh) in sent
            assert [peer for peer, data in sent if data == held] == []  # a sent it, c has it: nobody is left
            await wait_until(lambda: fresh in c.heard, what="the fresh offer at c")

    run_trio(main)
