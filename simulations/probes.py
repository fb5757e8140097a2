"""Instrumentation of real nodes from the harness side: nothing in mesh/ or transports/ knows it is measured.

Two probes, both installed by wrapping bound methods on one node's own objects (instance attributes, so other nodes
in the same process are untouched):

- `DeliveryProbe` wraps `node.intake.deliver` (the one entry of every transport) to stamp when each offer first
  reached each node, and the offerers' `pubsub.publish` to stamp when it left. Arrival is stamped before the
  intake's checks, so a node that then refuses the offer (a listener without a sandbox, a rate limit) still counts
  as reached: delivery is gossip's job, admission the intake's.
- `ExecProbe` wraps a runner's `executor.run_code` to record, for every run the node hands its executor, whether
  the gate was open when it started and whether any code actually executed (an exit code) or Docker failed it.
- `SendCounter` counts every RPC pubsub sends, and classifies what each carries. Queued RPCs (publishes, control
  messages, IWANT answers, subscriptions) are counted as the per-peer sender takes them from its queue (it wraps the
  queue's `pop` when pubsub starts a sender): py-libp2p's sender writes each with `write_msg`. Ours
  (`transports.pubsub.service.LeanPubsub`) coalesces them into one write and never calls it, and leaves out the
  messages the peer sent us: its RPCs are counted as it encodes them (`_encode_into`), after that trim. The few
  RPCs the router writes straight to a stream (`write_msg` outside a sender: messages held for a peer still being
  identified, recent messages replayed to a new subscriber) are counted there.
- `ReceiveCounter` wraps `pubsub._is_subscribed_to_msg`, which pubsub's reader asks for every message that arrives
  in an RPC from a peer (eager pushes and IWANT answers alike), before anything else (our own publishes never pass
  there): it counts every copy of every offer each node receives, duplicates included, whichever way the sender
  wrote them. (`push_msg` no longer sees every copy: `LeanPubsub` drops copies of forwarded messages before it.)
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from mesh.node import MeshNode
from transports.base import Delivery, Verdict
from transports.gossip import OFFERS_TOPIC
from transports.wire.offers import parse_offer
from transports.wire.reasons import Rejected

# Offer message ids are sha256 digests (content-addressed, see transports/gossip.py); other topics' are from+seqno.
OFFER_MSG_ID_SIZE = 32


def digest_of(raw: bytes) -> bytes:
    """The key an offer is measured under: its offerer and id, so that the issue an offerer actually publishes
    (re-signed with its invitees) is the offer the scenario made; the sha256 of bytes that do not parse."""
    try:
        offer = parse_offer(raw).offer
    except Rejected:
        return hashlib.sha256(raw).digest()
    return hashlib.sha256(offer.offerer + offer.offer_id).digest()


@dataclass
class Arrival:
    at: float
    transport: str
    verdict: str  # "admitted" or the rejection reason


@dataclass
class DeliveryProbe:
    clock: Callable[[], float] = time.monotonic
    published: dict[bytes, float] = field(default_factory=dict)
    arrivals: dict[bytes, dict[str, Arrival]] = field(default_factory=lambda: defaultdict(dict))

    def watch(self, node: MeshNode) -> None:
        """Gossip arrivals are stamped when the node's gossip receives the offer (every node forwards offers, takes
        them or not), and get the intake's verdict if it takes them; other transports' at the intake."""
        original: Callable[[Delivery], Awaitable[Verdict]] = node.intake.deliver
        peer_id = node.peer_id

        def heard(raw: bytes, _sender: str) -> None:
            self.arrivals[digest_of(raw)].setdefault(peer_id, Arrival(self.clock(), "gossip", "heard"))

        async def deliver(delivery: Delivery) -> Verdict:
            stamped = self.clock()
            verdict = await original(delivery)
            seen = self.arrivals[digest_of(delivery.raw)]
            reason = getattr(verdict, "reason", None)
            outcome = "admitted" if reason is None else str(reason)
            earlier = seen.get(peer_id)
            if earlier is None:
                seen[peer_id] = Arrival(stamped, delivery.transport, outcome)
            elif earlier.verdict == "heard":
                seen[peer_id] = Arrival(earlier.at, earlier.transport, outcome)
            return verdict

        node.gossip.on_heard(heard)
        node.intake.deliver = deliver  # type: ignore[method-assign]

    def watch_publisher(self, node: MeshNode) -> None:
        pubsub = node.gossip.pubsub
        original = pubsub.publish

        async def publish(topic_id: Any, data: bytes) -> None:
            if topic_id == OFFERS_TOPIC:
                self.published.setdefault(digest_of(data), self.clock())
            await original(topic_id, data)

        pubsub.publish = publish  # type: ignore[method-assign]

    def reached(self, raw: bytes, transport: str = "gossip") -> dict[str, Arrival]:
        return {p: a for p, a in self.arrivals.get(digest_of(raw), {}).items() if a.transport == transport}

    def latencies(self, raw: bytes) -> dict[str, float]:
        """Seconds from publish to first arrival, per reached node."""
        start = self.published.get(digest_of(raw))
        if start is None:
            return {}
        return {p: a.at - start for p, a in self.reached(raw).items()}


@dataclass(frozen=True)
class ExecAttempt:
    peer: str
    started: float
    participating: bool  # the node's gate when the worker handed the offer to its executor
    executed: bool  # the code ran in a container (an exit code), rather than Docker failing or refusing it
    error_kind: str | None


@dataclass
class ExecProbe:
    clock: Callable[[], float] = time.monotonic
    attempts: list[ExecAttempt] = field(default_factory=list)

    def watch(self, node: MeshNode) -> None:
        executor = node.executor
        if executor is None:
            return
        original = executor.run_code
        peer_id = node.peer_id

        async def run_code(request: Any, **options: Any) -> Any:
            started, participating = self.clock(), node.gate.participating
            result = await original(request, **options)
            kind = None if result.error_kind is None else str(result.error_kind)
            self.attempts.append(ExecAttempt(peer_id, started, participating, result.exit_code is not None, kind))
            return result

        executor.run_code = run_code  # type: ignore[method-assign]

    def executed_while_withdrawn(self) -> list[ExecAttempt]:
        return [a for a in self.attempts if a.executed and not a.participating]


@dataclass
class SendCounter:
    """RPCs written to peers, and the messages inside them, summed over every watched node."""

    counts: Counter[str] = field(default_factory=Counter)

    def watch(self, node: MeshNode) -> None:
        self.watch_pubsub(node.gossip.pubsub)

    def watch_pubsub(self, pubsub: Any) -> None:
        senders: set[Any] = set()  # the sender tasks: their write_msg calls are counted at the queue
        start_sender = pubsub.handle_sending_messages
        write = pubsub.write_msg
        # Our coalescing sender encodes each RPC it pops with `_encode_into`, which leaves out what the peer sent us
        # (`skip_holders`): what it encodes is what goes on the wire, so that is what is counted.
        encode = getattr(pubsub, "_encode_into", None) if getattr(pubsub, "coalesce_writes", False) else None
        if encode is not None:

            def counted_encode(parts: list[bytes], peer_id: Any, rpc: Any) -> int:
                size = int(encode(parts, peer_id, rpc))
                if size:
                    self._count(rpc)
                return size

            pubsub._encode_into = counted_encode

        async def handle_sending_messages(peer_id: Any, stream: Any, queue: Any) -> None:
            pop = queue.pop

            async def counted_pop() -> Any:
                rpc = await pop()  # no checkpoint added: the sender drains a full queue as before
                if rpc is not None:
                    self._count(rpc)
                return rpc

            if encode is None:
                queue.pop = counted_pop
            task = trio.lowlevel.current_task()
            senders.add(task)
            try:
                await start_sender(peer_id, stream, queue)
            finally:
                senders.discard(task)

        async def write_msg(stream: Any, rpc_msg: Any) -> bool:
            if trio.lowlevel.current_task() not in senders:
                self._count(rpc_msg)
            return bool(await write(stream, rpc_msg))

        pubsub.handle_sending_messages = handle_sending_messages
        pubsub.write_msg = write_msg

    def _count(self, rpc: Any) -> None:
        c = self.counts
        c["rpcs"] += 1
        c["bytes"] += rpc.ByteSize()
        if rpc.senderRecord:
            c["records"] += 1
        for msg in rpc.publish:
            if OFFERS_TOPIC in msg.topicIDs:
                c["offer_copies"] += 1
            else:
                c["other_copies"] += 1
        if rpc.subscriptions:
            c["subscription_changes"] += len(rpc.subscriptions)
        if rpc.HasField("control"):
            control = rpc.control
            c["ihave"] += sum(1 for x in control.ihave if x.topicID == OFFERS_TOPIC)
            c["graft"] += len(control.graft)
            c["prune"] += len(control.prune)
            # IWANT and IDONTWANT carry no topic; an offer's message id is recognisable by its size.
            c["iwant_offer_ids"] += sum(
                1 for x in control.iwant for mid in x.messageIDs if len(mid) == OFFER_MSG_ID_SIZE
            )
            c["idontwant_offer_ids"] += sum(
                1 for x in control.idontwant for mid in x.messageIDs if len(mid) == OFFER_MSG_ID_SIZE
            )
            c["idontwant_ids"] += sum(len(x.messageIDs) for x in control.idontwant)

    def snapshot(self) -> Counter[str]:
        return Counter(self.counts)


@dataclass
class ReceiveCounter:
    """Copies of each offer received, per node: `copies[sha256 of the offer's bytes][peer id]` (its message id:
    cheaper than parsing each copy, and each issue of an offer is its own message)."""

    copies: dict[bytes, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))

    def watch(self, node: MeshNode) -> None:
        pubsub = node.gossip.pubsub
        original = pubsub._is_subscribed_to_msg
        peer_id = node.peer_id

        def subscribed(msg: Any) -> bool:
            if OFFERS_TOPIC in msg.topicIDs:
                self.copies[hashlib.sha256(msg.data).digest()][peer_id] += 1
            return bool(original(msg))

        pubsub._is_subscribed_to_msg = subscribed  # type: ignore[method-assign]


def mesh_hops(nodes: list[MeshNode], publisher: MeshNode) -> dict[str, int]:
    """Hops from `publisher` to every node along the offers topic's GossipSub mesh (its fanout for the first hop).

    A snapshot: the mesh changes at every heartbeat, so this is taken just before an offer is published.
    """
    edges: dict[str, set[str]] = defaultdict(set)
    for node in nodes:
        for peer in node.gossip.mesh_peers():
            edges[node.peer_id].add(peer)
            edges[peer].add(node.peer_id)
    router = publisher.gossip.router
    first = {p.to_base58() for p in router.fanout.get(OFFERS_TOPIC, set()) | router.mesh.get(OFFERS_TOPIC, set())}
    hops = {publisher.peer_id: 0}
    frontier = sorted(first)
    for peer in frontier:
        hops[peer] = 1
    depth = 1
    while frontier:
        depth += 1
        nxt = []
        for peer in frontier:
            for other in edges[peer]:
                if other not in hops:
                    hops[other] = depth
                    nxt.append(other)
        frontier = nxt
    return hops
