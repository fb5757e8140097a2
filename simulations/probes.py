"""Instrumentation of real nodes from the harness side: nothing in mesh/ or transports/ knows it is measured.

Two probes, both installed by wrapping bound methods on one node's own objects (instance attributes, so other nodes
in the same process are untouched):

- `DeliveryProbe` wraps `node.intake.deliver` (the one entry of every transport) to stamp when each offer first
  reached each node, and the offerers' `pubsub.publish` to stamp when it left. Arrival is stamped before the
  intake's checks, so a node that then refuses the offer (a listener without a sandbox, a rate limit) still counts
  as reached: delivery is gossip's job, admission the intake's.
- `ExecProbe` wraps a runner's `executor.run_code` to record, for every run the node hands its executor, whether
  the gate was open when it started and whether any code actually executed (an exit code) or Docker failed it.
- `SendCounter` wraps `pubsub.write_msg`, the one call through which libp2p's pubsub writes every RPC to a peer
  stream (queued publishes, control messages, IWANT answers), and classifies what each RPC carries.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from mesh.node import MeshNode
from mesh.offers import parse_offer
from mesh.reasons import Rejected
from transports.base import Delivery, Verdict
from transports.gossip import OFFERS_TOPIC

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
        pubsub = node.gossip.pubsub
        original = pubsub.write_msg

        async def write_msg(stream: Any, rpc_msg: Any) -> bool:
            self._count(rpc_msg)
            return bool(await original(stream, rpc_msg))

        pubsub.write_msg = write_msg  # type: ignore[method-assign]

    def _count(self, rpc: Any) -> None:
        c = self.counts
        c["rpcs"] += 1
        c["bytes"] += rpc.ByteSize()
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

    def snapshot(self) -> Counter[str]:
        return Counter(self.counts)


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
