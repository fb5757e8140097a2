"""Large pubsub RPCs on real hosts: two written at once to one stream both arrive whole, and an RPC that is not
protobuf costs its sender a strike and the stream, never the node.

Yamux takes its write lock per frame (64 KiB at most), and upstream writes to a peer's stream from two places (the
pubsub's sender task, and the router's flush of pending and recent messages): two RPCs longer than a frame written
at once interleaved their frames, and the peer read a corrupt RPC, whose protobuf error then tore down the swarm.
That happened with 100 KB clear offers at 16 nodes (benchmarks/bench_sealed.py).
"""

from __future__ import annotations

import trio
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2
from libp2p.utils import encode_varint_prefixed

from tests.pubsub_support import gossip_node, make_offer, pubsub_signed
from tests.test_p2p_fakes import LOOPBACK, run_trio, wait_until
from transports.gossip import MESHSUB_PROTOCOLS
from transports.p2p import open_host
from transports.wire.identity import NodeIdentity


def test_two_rpcs_each_over_a_yamux_frame_written_at_once_to_one_stream_both_arrive_whole() -> None:
    async def main() -> None:
        async with gossip_node() as a, gossip_node() as b:
            await a.host.connect(b.addr)
            await wait_until(lambda: a.host.peer_id in b.gossip.mesh_peers(), what="mesh at b")
            await wait_until(lambda: b.host.peer_id in a.gossip.mesh_peers(), what="mesh at a")
            pubsub = a.gossip.pubsub
            stream = pubsub.peers[ID.from_base58(b.host.peer_id)]
            # Two offers of ~150 KB: each RPC spans three yamux frames.
            offers = [make_offer(a.identity, i, input={"blob": str(i) * 150_000}) for i in range(2)]
            rpcs = [rpc_pb2.RPC(publish=[pubsub_signed(pubsub, raw)]) for raw in offers]
            async with trio.open_nursery() as nursery:
                for rpc in rpcs:
                    nursery.start_soon(pubsub.write_msg, stream, rpc)
            await wait_until(lambda: set(offers) <= set(b.heard), what="both large offers at b")
            assert b.gossip.stats["pubsub_rpc_unparseable"] == 0

    run_trio(main)


def test_an_rpc_that_is_not_protobuf_costs_the_stream_and_a_strike_and_the_node_keeps_serving() -> None:
    async def main() -> None:
        async with gossip_node() as a, gossip_node() as b:
            async with open_host(NodeIdentity.generate(), [LOOPBACK]) as rogue:
                peer = await rogue.ensure_connected(b.addr)
                stream = await rogue.open_stream(peer, MESHSUB_PROTOCOLS[0])
                await stream.write(encode_varint_prefixed(b"\xff\xff\xff\xff not protobuf"))
                await wait_until(lambda: b.gossip.stats["pubsub_rpc_unparseable"] == 1, what="the refusal")
                assert b.host.penalties.strikes(rogue.peer_id) > 0
            await a.host.connect(b.addr)
            await wait_until(lambda: a.host.peer_id in b.gossip.mesh_peers(), what="mesh at b")
            offer = make_offer(a.identity, 7)
            assert await a.gossip.publish_offer(offer) is None
            await wait_until(lambda: offer in b.heard, what="an offer after the garbage")

    run_trio(main)
