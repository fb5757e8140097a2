"""Where one process stops scaling: gossip delivery over growing clusters of listeners (no Docker at all).

Every node of the cluster shares one Python process and so one core; this scenario finds the size past which that
core, not the protocol, decides the figures. Its per-hop latency and message costs calibrate `simulations.model`.
"""

from __future__ import annotations

import json
import time
from typing import Any

from simulations.cluster import lineup
from simulations.progress import Progress
from simulations.report import Report
from simulations.scenario import Options, offerers, started
from simulations.workload import drive_offers, summarize

OFFERS_PER_SIZE = 10


async def run(options: Options) -> tuple[Report, dict[str, Any]]:
    top = options.n(quick=8, full=24)
    sizes = sorted({s for s in (4, 6, 8, 10, 12, 16, 20, 24, 32) if s <= top} | {top})
    report = options.report("scaling", f"Gossip delivery against cluster size ({sizes[0]}–{sizes[-1]} nodes)")
    rows: list[dict[str, Any]] = []
    for size in sizes:
        roles = lineup(("listener", size - 1), ("offerer", 1))
        async with started(roles, seed=options.seed, formed_timeout=30) as (cluster, instruments, formed):
            before = instruments.sends.snapshot()
            cpu0, wall0 = time.process_time(), time.monotonic()
            with Progress(f"scaling {size}", OFFERS_PER_SIZE) as bar:
                records = await drive_offers(
                    cluster, offerers(cluster), count=OFFERS_PER_SIZE, rate=2.0, timeout=3, progress=bar
                )
            cpu = (time.process_time() - cpu0) / (time.monotonic() - wall0)
            sends = instruments.sends.snapshot()
            sends.subtract(before)
            figures = summarize(instruments, records, sends)
        rows.append(
            {
                "nodes": size,
                "formed": formed,
                "delivery_ratio": figures["delivery_ratio"],
                "latency_p50": figures["latency_p50"],
                "latency_p99": figures["latency_p99"],
                "per_hop_s": figures["per_hop_s"],
                "amplification": figures["amplification"],
                "control_per_delivery": figures["control_per_delivery"],
                "heartbeat_copies_per_node_s": sends["heartbeat_copies"] / size / OFFERS_PER_SIZE * 2.0,
                "cpu_share": cpu,
            }
        )
    report.table(
        ["nodes", "formed", "delivery", "p50 ms", "p99 ms", "per hop ms", "amplification", "hb copies/node/s", "CPU"],
        [
            (
                r["nodes"],
                r["formed"],
                r["delivery_ratio"],
                r["latency_p50"] * 1000,
                r["latency_p99"] * 1000,
                r["per_hop_s"] * 1000,
                r["amplification"],
                r["heartbeat_copies_per_node_s"],
                f"{r['cpu_share']:.0%}",
            )
            for r in rows
        ],
    )
    xs = [r["nodes"] for r in rows]
    report.figure(
        "delivery_vs_nodes.png",
        "Delivery ratio within 3 s against nodes in one process",
        lambda ax: (
            ax.plot(xs, [r["delivery_ratio"] for r in rows], "o-"),
            ax.set_xlabel("nodes"),
            ax.set_ylabel("share of offers delivered to every node within 3 s"),
            ax.set_ylim(0, 1.05),
        ),
        counted_x=True,
    )
    report.figure(
        "latency_vs_nodes.png",
        "Delivery latency p50 and p99 against nodes in one process, ms",
        lambda ax: (
            ax.plot(xs, [r["latency_p50"] * 1000 for r in rows], "o-", label="p50"),
            ax.plot(xs, [r["latency_p99"] * 1000 for r in rows], "s-", label="p99"),
            ax.set_xlabel("nodes"),
            ax.set_ylabel("offer to node latency, ms"),
            ax.legend(),
        ),
        counted_x=True,
    )
    (report.out_dir / "calibration.json").write_text(json.dumps(rows, indent=1))
    return report, {"rows": rows}
