"""Gossip delivery over growing clusters whose nodes are spread over several OS processes (`simulations.worker`).

`scaling` keeps every node in one process, so one event loop on one core decides where it stops. Here the listeners
live in worker processes and only the offerer stays in this one, so the limit is the machine's cores: the figure
that matters is total CPU (all processes) against the cores there are.
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any

import trio

from mesh.node import MeshNode
from simulations.cluster import DIALS_PER_NODE, open_cluster
from simulations.probes import DeliveryProbe, digest_of
from simulations.progress import Progress
from simulations.report import Report
from simulations.scenario import Options
from simulations.stats import percentile, ratio
from simulations.worker_client import WorkerProcess, open_workers
from simulations.workload import SHORT_TASK

OFFERS_PER_SIZE = 10
OFFER_RATE = 2.0
DELIVERY_WINDOW = 3.0  # seconds after its publish within which an arrival counts, as in `scaling`
IDLE_WINDOW = 10.0  # two heartbeat intervals with no offers: what the mesh costs at rest (quick: 2 s)


async def run(options: Options) -> tuple[Report, dict[str, Any]]:
    top = options.n(quick=10, full=40)
    sizes = sorted({s for s in (8, 16, 24, 32, 40, 48) if s <= top} | {top})
    workers = options.workers
    idle_window = 2.0 if options.quick else IDLE_WINDOW
    report = options.report(
        "scaling-procs", f"Gossip delivery against cluster size, nodes spread over {workers} worker processes"
    )
    rows = []
    for size in sizes:
        rows.append(await _measure(size, workers, idle_window, random.Random(options.seed)))
    report.text(
        f"{workers} worker processes host the listeners (round robin); the offerer is in the parent. {os.cpu_count()} "
        f"cores. Idle CPU is measured over {idle_window:g} s without offers (heartbeats only); busy CPU while "
        f"{OFFERS_PER_SIZE} offers are published at {OFFER_RATE:g}/s. CPU is summed over every process, in cores."
    )
    report.table(
        [
            "nodes",
            "formed s",
            "delivery",
            "p50 ms",
            "p99 ms",
            "idle CPU",
            "idle msgs/s",
            "CPU ms/msg",
            "busy CPU",
            "max one process",
        ],
        [
            (
                r["nodes"],
                r["formed_s"],
                r["delivery_ratio"],
                r["latency_p50"] * 1000,
                r["latency_p99"] * 1000,
                f"{r['idle_cores']:.2f}",
                f"{r['idle_messages_per_s']:.0f}",
                f"{r['idle_cpu_ms_per_message']:.2f}",
                f"{r['busy_cores']:.2f}",
                f"{r['max_process_cores']:.2f}",
            )
            for r in rows
        ],
    )
    xs = [r["nodes"] for r in rows]

    def draw(ax: Any) -> None:
        ax.plot(xs, [r["delivery_ratio"] for r in rows], "o-", label="delivery ratio within 3 s")
        ax.plot(xs, [r["busy_cores"] / (os.cpu_count() or 1) for r in rows], "s--", label="CPU, share of all cores")
        ax.set_xlabel("nodes")
        ax.set_ylabel("share, 0 to 1")
        ax.set_ylim(0, 1.1)
        ax.legend()

    # Read by `simulations.model` for the CPU each received message costs.
    (report.out_dir / "calibration.json").write_text(json.dumps(rows, indent=1))
    report.figure(
        "procs_delivery_cpu.png", f"Delivery and CPU against nodes, {workers} worker processes", draw, counted_x=True
    )
    return report, {"rows": rows}


async def _measure(size: int, worker_count: int, idle_window: float, rng: random.Random) -> dict[str, Any]:
    async with open_workers(worker_count) as workers, open_cluster() as cluster:
        addrs: list[str] = []
        for i in range(size - 1):
            _, addr = await workers[i % worker_count].add(
                "listener", rng.sample(addrs, min(DIALS_PER_NODE, len(addrs)))
            )
            addrs.append(addr)
        sim = await cluster.add("offerer", peers=rng.sample(addrs, min(DIALS_PER_NODE, len(addrs))))
        offerer = sim.node
        assert offerer is not None
        probe = DeliveryProbe()
        probe.watch_publisher(offerer)
        started = time.monotonic()
        formed = await _wait_formed(workers, offerer, size - 1, timeout=60)
        formed_s = time.monotonic() - started if formed else float("nan")

        idle = await _cpu_window(workers, trio.sleep, idle_window)
        raws: list[bytes] = []

        async def publish() -> None:
            with Progress(f"procs {size}", OFFERS_PER_SIZE) as bar:
                for i in range(OFFERS_PER_SIZE):
                    raw = offerer.make_offer(language="python", code=SHORT_TASK, input={"xs": [i, size]})
                    raws.append(raw)
                    await offerer.gossip.publish_offer(raw)
                    bar.advance()
                    await trio.sleep(1 / OFFER_RATE)
                await trio.sleep(DELIVERY_WINDOW)

        busy = await _cpu_window(workers, publish)
        arrivals: dict[str, dict[str, float]] = {}
        for worker in workers:
            for digest, seen in (await worker.request("arrivals")).items():
                arrivals.setdefault(digest, {}).update(seen)
    latencies: list[float] = []
    reached = 0
    for raw in raws:
        start = probe.published[digest_of(raw)]
        delays = [at - start for at in arrivals.get(digest_of(raw).hex(), {}).values()]
        latencies += delays
        reached += sum(1 for d in delays if d <= DELIVERY_WINDOW)
    return {
        "nodes": size,
        "workers": worker_count,
        "formed": formed,
        "formed_s": formed_s,
        "delivery_ratio": ratio(reached, len(raws) * (size - 1)),
        "latency_p50": percentile(latencies, 50),
        "latency_p99": percentile(latencies, 99),
        "idle_cores": idle["cores"],
        "busy_cores": busy["cores"],
        "max_process_cores": busy["max_process_cores"],
        "idle_messages_per_s": idle["messages_per_s"],
        "idle_cpu_ms_per_message": idle["cpu_ms_per_message"],
    }


async def _wait_formed(workers: list[WorkerProcess], offerer: MeshNode, listeners: int, *, timeout: float) -> bool:
    """Every listener has offers-mesh peers and the offerer has the status of each of its neighbours (presence
    is between neighbours: nobody hears of everyone)."""
    with trio.move_on_after(timeout):
        while True:
            states = [await w.request("state") for w in workers]
            meshed = all(node["mesh"] for s in states for node in s["nodes"].values())
            neighbours = set(offerer.p2p.connected_peers())
            if meshed and neighbours and neighbours <= {h.peer_id for h in offerer.peers.fresh()}:
                return True
            await trio.sleep(0.5)
    return False


async def _cpu_window(workers: list[WorkerProcess], body: Any, *args: Any) -> dict[str, float]:
    """Run `body(*args)` and return the CPU it coincided with, in cores (every worker's and this process's), and
    the pubsub messages the workers' nodes sent meanwhile: each one sent is one received, so CPU per message
    received is about their ratio (the parent's single offerer adds a little to the CPU, none to the count)."""

    async def cpu_of_workers() -> list[float]:
        return [(await w.request("state"))["cpu_s"] for w in workers]

    async def messages_sent() -> int:
        total = 0
        for w in workers:
            sends = await w.request("sends")
            total += sends.get("offer_copies", 0) + sends.get("heartbeat_copies", 0)
        return total

    sent_before = await messages_sent()
    before, parent_before, wall_before = await cpu_of_workers(), time.process_time(), time.monotonic()
    await body(*args)
    after, parent_after, wall = await cpu_of_workers(), time.process_time(), time.monotonic() - wall_before
    messages = await messages_sent() - sent_before
    per_process = [(b - a) / wall for a, b in zip(before, after, strict=True)] + [(parent_after - parent_before) / wall]
    cores = sum(per_process)
    return {
        "cores": cores,
        "max_process_cores": max(per_process),
        "messages_per_s": messages / wall,
        "cpu_ms_per_message": ratio(cores * wall * 1000, messages),
    }
