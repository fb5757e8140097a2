"""What every scenario shares: its options, the cluster it starts, and the standard plots of its report."""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from mesh.node import MeshNode
from simulations.cluster import Cluster, Role, open_cluster
from simulations.report import Report
from simulations.workload import Instruments, headline_rows

DEFAULT_OUT = Path(__file__).parent / "out"


@dataclass(frozen=True)
class Options:
    quick: bool = False
    nodes: int | None = None  # total nodes; each scenario has its own default
    out: Path = DEFAULT_OUT
    seed: int = 1
    workers: int = 4  # worker processes of `scaling-procs` and `scale` (more than cores: each loop also queues)
    # `scale` only: the sizes to sweep (`--nodes 16,64,200`), where to write its figures as JSON, how many runners
    # misbehave, offers and their rate (0: the scenario's own), and py-libp2p's GossipSub v2 features.
    sizes: tuple[int, ...] = ()
    json: Path | None = None
    grief: int = 0
    offers: int = 0
    rate: float = 0.0
    adaptive_gossip: bool = False
    eclipse_protection: bool = True
    isolation: str = "runc"  # the tiers runner nodes offer (the hostile scenario): runc, gvisor or runc,gvisor

    def n(self, quick: int, full: int) -> int:
        return self.nodes if self.nodes is not None else (quick if self.quick else full)

    def report(self, name: str, title: str) -> Report:
        return Report(name, self.out / name, title)


def quiet_logs() -> None:
    """The nodes log every gate change and libp2p every closed stream; a progress bar cannot be read through that."""
    logging.getLogger().setLevel(logging.ERROR)
    # py-libp2p sets its own logger to WARNING; with no handler configured, Python's last-resort handler then prints
    # each of its warnings bare on stderr (a "GRAFT flood detected" per mesh churn, dozens at 200 nodes).
    logging.getLogger("libp2p").setLevel(logging.ERROR)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


@asynccontextmanager
async def started(
    roles: list[Role], *, seed: int, formed_timeout: float = 60.0, **cluster_options: Any
) -> AsyncIterator[tuple[Cluster, Instruments, bool]]:
    """A cluster with `roles` started in order (runners first, so the others can dial them), instrumented."""
    async with open_cluster(seed=seed, **cluster_options) as cluster:
        instruments = Instruments()
        instruments.attach(cluster)
        for role in roles:
            await cluster.add(role)
        formed = await cluster.wait_formed(timeout=formed_timeout)
        yield cluster, instruments, formed


def offerers(cluster: Cluster) -> list[MeshNode]:
    return cluster.live("offerer")


def standard_sections(report: Report, figures: dict[str, Any]) -> None:
    report.table(["figure", "value"], headline_rows(figures))
    latencies = [x * 1000 for x in figures["latencies"]]
    if latencies:
        report.figure(
            "delivery_latency.png",
            "Offer → node delivery latency (every node reached by every offer), ms",
            lambda ax: (
                ax.hist(latencies, bins=30, color="tab:blue"),
                ax.set_xlabel("offer to node delivery latency, ms"),
                ax.set_ylabel("deliveries"),
            ),
            counted_y=True,
        )
    hops = figures["hops"]
    if hops:
        fit = figures["per_hop_s"], figures["publish_overhead_s"]

        def draw(ax: Any) -> None:
            ax.scatter([h for h, _ in hops], [s * 1000 for _, s in hops], s=8, alpha=0.5)
            if not math.isnan(fit[0]):
                xs = sorted({h for h, _ in hops})
                ax.plot(xs, [(fit[1] + fit[0] * x) * 1000 for x in xs], color="tab:red", label="least-squares fit")
                ax.legend()
            ax.set_xlabel("GossipSub mesh hops from the publisher")
            ax.set_ylabel("delivery latency, ms")

        report.figure(
            "latency_by_hops.png", "Delivery latency against mesh distance: the per-hop cost", draw, counted_x=True
        )
    results = [x * 1000 for x in figures["result_latencies"]]
    if results:
        report.figure(
            "result_latency.png",
            "Offer → verified result latency (claim, Docker run, signed result back), ms",
            lambda ax: (
                ax.hist(results, bins=20, color="tab:green"),
                ax.set_xlabel("offer to verified result, ms"),
                ax.set_ylabel("offers"),
            ),
            counted_y=True,
        )
