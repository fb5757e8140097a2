"""Driving offers through a cluster and turning what the probes saw into the report's figures."""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from executor.contract import Limits
from mesh.node import MeshNode
from mesh.offerer import OfferOutcome
from simulations.cluster import Cluster, SimNode
from simulations.probes import DeliveryProbe, ExecProbe, SendCounter, mesh_hops
from simulations.progress import Progress
from simulations.stats import linear_fit, percentile, ratio
from transports.wire.offers import parse_offer

SHORT_TASK = "import json, sys\nprint(sum(json.load(sys.stdin)['xs']))\n"


@dataclass
class OfferRecord:
    raw: bytes
    offer_id: bytes
    offerer: str
    expected: set[str]  # subscribed to offers when it was published
    hops: dict[str, int] = field(default_factory=dict)
    started: float = 0.0
    finished: float | None = None
    outcome: OfferOutcome | None = None


@dataclass
class Instruments:
    """Everything a scenario measures, attached to every node the cluster opens (restarts included)."""

    probe: DeliveryProbe = field(default_factory=DeliveryProbe)
    sends: SendCounter = field(default_factory=SendCounter)
    execs: ExecProbe = field(default_factory=ExecProbe)
    # Every incarnation's `node.ran`: a restarted node is a new MeshNode, and its predecessor's runs still count.
    ran_lists: list[deque[bytes]] = field(default_factory=list)

    def attach(self, cluster: Cluster) -> None:
        cluster.on_open.append(self._on_open)

    def _on_open(self, sim: SimNode, node: MeshNode) -> None:
        self.probe.watch(node)
        self.sends.watch(node)
        self.probe.watch_publisher(node)
        self.execs.watch(node)
        self.ran_lists.append(node.ran)

    def runs_of(self, offer_id: bytes) -> int:
        return sum(ran.count(offer_id) for ran in self.ran_lists)


def subscribed_peers(cluster: Cluster, but: MeshNode) -> set[str]:
    return {n.peer_id for n in cluster.live() if n.gossip.subscribed and n is not but}


async def drive_offers(
    cluster: Cluster,
    offerers: list[MeshNode],
    *,
    count: int,
    rate: float,
    timeout: float,
    progress: Progress,
    during: Callable[[int], Any] | None = None,
) -> list[OfferRecord]:
    """`count` gossip offers at `rate` a second, round robin over `offerers`, each awaited to its result.

    `during(i)`, when given, is awaited before offer `i` is published: scenarios kill nodes or cut Docker there.
    """
    records: list[OfferRecord] = []

    async def one(record: OfferRecord, node: MeshNode) -> None:
        record.started = time.monotonic()
        record.outcome = await node.offer_gossip(record.raw, timeout=timeout)
        record.finished = time.monotonic()
        progress.advance(note=f"{sum(1 for r in records if r.outcome and r.outcome.ok)} ok")

    async with trio.open_nursery() as nursery:
        for i in range(count):
            if during is not None:
                await during(i)
            node = offerers[i % len(offerers)]
            raw = node.make_offer(
                language="python", code=SHORT_TASK, input={"xs": [i, 1, 2]}, limits=Limits(timeout_ms=5000)
            )
            record = OfferRecord(raw, parse_offer(raw).offer.offer_id, node.peer_id, subscribed_peers(cluster, node))
            records.append(record)
            nursery.start_soon(one, record, node)
            await trio.sleep(1 / rate)
            # The fanout the publisher used exists once it published: take the hop snapshot now.
            record.hops = mesh_hops(cluster.live(), node)
    return records


def summarize(instruments: Instruments, records: list[OfferRecord], sends: Counter[str]) -> dict[str, Any]:
    """The report's figures. Delivery counts only nodes that were subscribed at publish time."""
    probe = instruments.probe
    expected = reached = 0
    latencies: list[float] = []
    hop_x: list[float] = []
    hop_y: list[float] = []
    all_reached = 0
    for record in records:
        arrivals = probe.latencies(record.raw)
        all_reached += len(arrivals)
        expected += len(record.expected)
        reached += len(record.expected & arrivals.keys())
        latencies += arrivals.values()
        for peer, seconds in arrivals.items():
            if peer in record.hops:
                hop_x.append(record.hops[peer])
                hop_y.append(seconds)
    runs = [instruments.runs_of(r.offer_id) for r in records]
    done = [r for r in records if r.outcome is not None and r.outcome.ok and r.finished is not None]
    result_latencies = [r.finished - r.started for r in done if r.finished is not None]
    per_hop, overhead = linear_fit(hop_x, hop_y)
    control = sends["ihave"] + sends["iwant_offer_ids"] + sends["idontwant_offer_ids"]
    return {
        "offers": len(records),
        "delivery_ratio": ratio(reached, expected),
        "deliveries": all_reached,
        "latency_p50": percentile(latencies, 50),
        "latency_p99": percentile(latencies, 99),
        "latencies": latencies,
        "hops": list(zip(hop_x, hop_y, strict=True)),
        "per_hop_s": per_hop,
        "publish_overhead_s": overhead,
        "offer_copies": sends["offer_copies"],
        "amplification": ratio(sends["offer_copies"], all_reached),
        "control_per_delivery": ratio(control, all_reached),
        "rpcs": sends["rpcs"],
        "heartbeat_copies": sends["heartbeat_copies"],
        "duplicate_runs": sum(max(0, n - 1) for n in runs),
        "runs": sum(runs),
        "completion_rate": ratio(len(done), len(records)),
        "result_p50": percentile(result_latencies, 50),
        "result_p99": percentile(result_latencies, 99),
        "result_latencies": result_latencies,
        "refusals": Counter(
            str(r.outcome.refusal.reason) for r in records if r.outcome is not None and r.outcome.refusal is not None
        ),
    }


def headline_rows(figures: dict[str, Any]) -> list[tuple[str, Any]]:
    def msec(key: str) -> str:
        value = figures[key]
        return "n/a" if value is None or math.isnan(value) else f"{value * 1000:.1f} ms"

    return [
        ("offers", figures["offers"]),
        ("delivery ratio (subscribed nodes reached)", f"{figures['delivery_ratio']:.3f}"),
        ("offer → every node latency p50 / p99", f"{msec('latency_p50')} / {msec('latency_p99')}"),
        ("per-hop latency (fit) / fixed overhead", f"{msec('per_hop_s')} / {msec('publish_overhead_s')}"),
        ("amplification (offer copies sent per delivery)", f"{figures['amplification']:.2f}x"),
        ("control ids (IHAVE/IWANT/IDONTWANT) per delivery", f"{figures['control_per_delivery']:.2f}"),
        ("duplicate runs (claim conflicts)", figures["duplicate_runs"]),
        ("completion rate", f"{figures['completion_rate']:.3f}"),
        ("offer → verified result p50 / p99", f"{msec('result_p50')} / {msec('result_p99')}"),
        ("refusals", dict(figures["refusals"]) or "none"),
    ]
