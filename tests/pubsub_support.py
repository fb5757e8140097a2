"""Gossip nodes built as the node builds them, with a chosen `PubsubTuning`, and a hostile GossipSub peer.

- `gossip_node` runs one host (`open_host`, with its defences and the given tuning), a `DirectTransport` and a
  `GossipTransport` validating offers as the intake does (codec, clock, signature), for tests and benchmarks.
- `GossipFlooder` is a real libp2p host running py-libp2p's own GossipSub, subscribed to the offers topic, so that
  a victim meshes it as an ordinary subscriber. Its flood does not go through its router (which would stop sending
  to a peer that pruned it): each message is built and pubsub-signed exactly as `Pubsub.publish` does, so that it
  passes strict signing, and is written straight to the victim's pubsub stream. The messages are distinct,
  well-formed offers whose Ed25519 signature has one byte flipped: the validator refuses them as `bad_signature`
  after decoding them and checking the signature, the expensive path (issue 11's invalid-gossip flood).
- `flood_invalid_gossip` is that flood as a benchmark attacker: at a fixed rate, redialling once a second when cut
  off (`fresh_keys`: with a new identity each time).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.validators import PUBSUB_SIGNING_PREFIX
from libp2p.tools.anyio_service import background_trio_service
from libp2p.utils import encode_varint_prefixed

from tests.test_p2p_fakes import LOOPBACK, FakeDesk, RecordingSink
from transports.direct import DirectTransport
from transports.gossip import MESHSUB_PROTOCOLS, OFFERS_TOPIC, GossipTransport
from transports.hardening import Defences, RefusalSink
from transports.p2p import P2PHost, open_host
from transports.pubsub import LEAN, PubsubTuning
from transports.wire.identity import NodeIdentity
from transports.wire.offers import Limits, TaskOffer, open_offer
from transports.wire.reasons import Rejected, Rejection

# About 1 KB of code, what a small real task is.
OFFER_CODE = (
    "import json, sys, statistics\n"
    "data = json.load(sys.stdin)\n"
    "xs = [float(x) for x in data['xs']]\n"
    "out = {'n': len(xs), 'sum': sum(xs), 'mean': statistics.fmean(xs) if xs else None,\n"
    "       'median': statistics.median(xs) if xs else None, 'max': max(xs, default=None),\n"
    "       'min': min(xs, default=None)}\n"
    "if any(x != x for x in xs):\n"
    "    print(json.dumps({'error': 'nan in input'}))\n"
    "    sys.exit(2)\n"
    "out['spread'] = (out['max'] - out['min']) if xs else None\n"
    "out['buckets'] = {str(b): sum(1 for x in xs if b <= x < b + 10) for b in range(0, 100, 10)}\n"
    "print(json.dumps(out, sort_keys=True))\n"
)


def check_offer(raw: bytes) -> Rejection | None:
    """What the intake's validator does: codec checks, the clock and the signature."""
    try:
        open_offer(raw)
    except Rejected as exc:
        return exc.rejection
    return None


def make_offer(
    identity: NodeIdentity, i: int, *, reply_to: tuple[str, ...] = (), input: Any = None, **options: Any
) -> bytes:
    """A signed ~1 KB offer, distinct for each `i`."""
    return TaskOffer.create(
        identity,
        language="python",
        code=OFFER_CODE,
        input={"xs": [i, 1, 2, 3]} if input is None else input,
        limits=Limits(timeout_ms=5000),
        reply_to=reply_to,
        **options,
    ).sign(identity)


def bad_signature_offers(identity: NodeIdentity, count: int, reply_to: tuple[str, ...] = ()) -> list[bytes]:
    """Distinct well-formed offers, each with the last byte of its signature flipped."""
    out = []
    for i in range(count):
        raw = bytearray(make_offer(identity, i, reply_to=reply_to, ttl_ms=600_000))
        raw[-1] ^= 0x01  # the envelope ends with the signature
        out.append(bytes(raw))
    return out


@dataclass
class GossipNode:
    identity: NodeIdentity
    host: P2PHost
    sink: RecordingSink
    direct: DirectTransport
    gossip: GossipTransport
    heard: list[bytes] = field(default_factory=list)  # valid offers this node received (taken or not)

    @property
    def addr(self) -> str:
        return self.host.addrs[0]


@asynccontextmanager
async def gossip_node(
    *,
    tuning: PubsubTuning = LEAN,
    validate: Callable[[bytes], Rejection | None] = check_offer,
    on_refusal: RefusalSink | None = None,
    defences: Defences | None = None,
) -> AsyncIterator[GossipNode]:
    identity = NodeIdentity.generate()
    async with AsyncExitStack() as stack:
        host = await stack.enter_async_context(
            open_host(identity, [LOOPBACK], tuning=tuning, on_refusal=on_refusal, defences=defences)
        )
        nursery = await stack.enter_async_context(trio.open_nursery())
        stack.callback(nursery.cancel_scope.cancel)
        sink = RecordingSink()
        sink.nursery = nursery
        direct = DirectTransport(host, FakeDesk())
        await nursery.start(direct.run, sink)

        gossip = GossipTransport(host, direct, validate=validate)
        node = GossipNode(identity, host, sink, direct, gossip)
        gossip.on_heard(lambda raw, sender: node.heard.append(raw))
        await nursery.start(gossip.run, sink)
        yield node


def pubsub_signed(pubsub: Pubsub, data: bytes, topic: str = OFFERS_TOPIC) -> rpc_pb2.Message:
    """A message built and signed as `Pubsub.publish` builds and signs one."""
    msg = rpc_pb2.Message(data=data, topicIDs=[topic], from_id=pubsub.my_id.to_bytes(), seqno=pubsub._next_seqno())
    key = pubsub.sign_key
    assert key is not None
    msg.signature = key.sign(PUBSUB_SIGNING_PREFIX.encode() + msg.SerializeToString())
    msg.key = pubsub.host.get_public_key().serialize()
    return msg


class GossipFlooder:
    """A hostile GossipSub peer (see the module docstring). Use as `async with GossipFlooder.open() as attacker`."""

    def __init__(self, host: P2PHost, pubsub: Pubsub, identity: NodeIdentity) -> None:
        self.host = host
        self.pubsub = pubsub
        self.identity = identity
        self.written: Counter[str] = Counter()  # messages written, per victim
        self.pool = bad_signature_offers(identity, 64, tuple(host.addrs))
        self._next = 0

    @classmethod
    @asynccontextmanager
    async def open(cls) -> AsyncIterator[GossipFlooder]:
        identity = NodeIdentity.generate()
        async with open_host(identity, [LOOPBACK]) as host:
            router = GossipSub(
                protocols=list(MESHSUB_PROTOCOLS),
                degree=6,
                degree_low=4,
                degree_high=12,
                heartbeat_interval=1,
                spam_protection_enabled=False,
                adaptive_gossip_enabled=False,
            )
            pubsub = Pubsub(host.host, router, strict_signing=True)
            async with background_trio_service(pubsub), background_trio_service(router):
                await pubsub.wait_until_ready()
                await pubsub.subscribe(OFFERS_TOPIC)
                yield cls(host, pubsub, identity)

    async def connect(self, addr: str, *, timeout: float = 5.0) -> bool:
        """Dial `addr` and wait until its pubsub stream is up; False when the victim refuses us."""
        victim = ID.from_base58(addr.rsplit("/p2p/", 1)[1])
        try:
            await self.host.connect(addr)
        except Exception:
            return False
        with trio.move_on_after(timeout):
            while victim not in self.pubsub.peers:
                if victim not in self.host.host.get_connected_peers():
                    return False
                await trio.sleep(0.01)
            return True
        return False

    def next_offer(self) -> bytes:
        """A bad-signature offer never sent before (the pool is refilled once used up): each one costs the victim
        a decode and a signature check, none is answered from its validation cache."""
        raw = self.pool[self._next % len(self.pool)]
        self._next += 1
        if self._next % len(self.pool) == 0:
            self.pool = bad_signature_offers(self.identity, len(self.pool), tuple(self.host.addrs))
        return raw

    async def write(self, victim: ID) -> bool:
        """One bad offer straight onto the victim's pubsub stream; False when that stream is gone."""
        stream = self.pubsub.peers.get(victim)
        if stream is None:
            return False
        rpc = rpc_pb2.RPC(publish=[pubsub_signed(self.pubsub, self.next_offer())])
        try:
            with trio.fail_after(1):
                await stream.write(encode_varint_prefixed(rpc.SerializeToString()))
        except (Exception, trio.TooSlowError):
            self.pubsub.peers.pop(victim, None)
            return False
        self.written[victim.to_base58()] += 1
        return True

    async def flood(self, victim: ID, *, rate: float, count: int | None = None) -> int:
        """Write at `rate` a second until the victim cuts us off (or `count` are written); how many were written."""
        interval = 1.0 / rate
        next_at = trio.current_time()
        written = 0
        while count is None or written < count:
            if not await self.write(victim):
                break
            written += 1
            next_at += interval
            await trio.sleep_until(next_at)
        return written


async def flood_invalid_gossip(
    addr: str, stats: Counter[str], *, rate: float = 247.0, fresh_keys: bool = False
) -> None:
    """The benchmark's attacker: bad-signature offers at `rate` a second to `addr` until cancelled; when cut off,
    dial again once a second (with a new identity when `fresh_keys`)."""
    victim = ID.from_base58(addr.rsplit("/p2p/", 1)[1])
    while True:
        async with GossipFlooder.open() as attacker:
            while True:
                if await attacker.connect(addr):
                    stats["sessions"] += 1
                    stats["invalid messages"] += await attacker.flood(victim, rate=rate)
                    stats["cut off"] += 1
                    if fresh_keys:
                        break
                else:
                    stats["dials refused"] += 1
                await trio.sleep(1.0)
