"""`python -m simulations scale --nodes 16,64,200 --json out.json`: the mesh measured like the field measures it.

Per size, a realistic cluster spread over worker processes (`simulations.worker`): most nodes are runners (so the
claims could grow with N if nothing bounded them), a fifth are `sandbox_mode=none` listeners, and two offerers live
in this process. The runners of one worker share one real Docker executor and gate (`NodeConfig.shared_sandbox`):
every offer runs in a real container. Per size it reports what a GossipSub deployment is judged by:

- delivery within 3 s: the share of (offer, node) pairs where the node heard the offer within 3 s of its publish;
- delivery latency p50/p99 (every node), and offer → verified result p50/p99;
- claim requests per offer, mean and max (`OfferOutcome.claim_requests`, over every issue of the work), and issues;
- duplicates per delivery: copies of an offer a node received, minus the one it needed (counted where pubsub takes
  each message in, `probes.ReceiveCounter`, whatever path the sender wrote it by); Ethereum's beacon chain sees
  about 3 at degree 8;
- idle CPU per node: every process's CPU over a window with no offers, over N; busy CPU per node while offers flow;
- duplicate runs (a piece of work run on more than one node, over all its issues): must be 0;
- with `--grief K`: K runners next to the offerers misbehave (half claim and sit on the claim, half die holding it);
  every offer must still get its verified result.

CPU is `time.process_time()` of every process (threads included): dockerd's and the containers' own CPU are not in it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import trio

from executor.contract import Limits
from mesh.node import MeshNode
from mesh.offerer import OfferOutcome
from simulations.cluster import DIALS_PER_NODE, Cluster, SimNode, open_cluster
from simulations.probes import DeliveryProbe, ReceiveCounter, SendCounter, digest_of
from simulations.progress import Progress
from simulations.report import Report
from simulations.scenario import Options
from simulations.stats import linear_fit, percentile, ratio
from simulations.worker import crowded_defences
from simulations.worker_client import WorkerProcess, open_workers
from simulations.workload import SHORT_TASK
from transports.gossip import OFFERS_TOPIC
from transports.wire.offers import parse_offer
from transports.wire.sealed import Payload

SIZES_FULL = (16, 64, 200)
SIZES_QUICK = (8, 16)
OFFERERS = 2
LISTENER_SHARE = 0.2
DELIVERY_WINDOW = 3.0
OFFER_LIMITS = Limits(timeout_ms=5000)
OFFER_TIMEOUT_S = 90.0  # the offerer's patience: room for a lapsed claim and a re-issue under load
# With griefers: a claim lapses 3 s past the offer's own 5 s timeout (the default margin is 15 s), so that a run
# shows several lapses and re-issues in a minute.
GRIEF_LEASE_MARGIN_S = 3.0
SETTLE_S = 5.0  # after the mesh formed: the first status exchanges and GRAFTs are done before the idle window
FORMED_TIMEOUT_S = 180.0
# Acceptance bounds (issue 13).
CLAIMS_MEAN_BOUND = 3.0
CLAIMS_MAX_BOUND = 8
IDLE_GROWTH_BOUND = 1.5


@dataclass(frozen=True)
class Plan:
    offers: int
    rate: float  # offers a second, over both offerers
    idle_window: float

    @classmethod
    def of(cls, options: Options) -> Plan:
        if options.quick:
            return cls(offers=options.offers or 6, rate=options.rate or 1.0, idle_window=4.0)
        # One presence refresh interval (30 s): every node pushes its status to every neighbour once in it.
        return cls(offers=options.offers or 20, rate=options.rate or 0.5, idle_window=30.0)


@dataclass
class Issue:
    work: int
    offer_id: bytes
    digest: bytes  # `digest_of`: what the delivery probe keys arrivals by
    message_id: bytes  # sha256 of the published bytes: what the receive counter keys copies by
    published: float


@dataclass
class Work:
    index: int
    offerer: str
    started: float = 0.0
    finished: float = 0.0
    outcome: OfferOutcome | None = None
    issues: list[Issue] = field(default_factory=list)


class IssueLog:
    """Every issue the offerers publish (the first and each re-issue), tied to its work by the digest of the work's
    input (a sealed offer carries the digest, not the input; a clear one's is computed the same way)."""

    def __init__(self) -> None:
        self.works: dict[bytes, Work] = {}

    def watch(self, node: MeshNode) -> None:
        pubsub = node.gossip.pubsub
        original = pubsub.publish

        async def publish(topic_id: Any, data: bytes) -> None:
            if topic_id == OFFERS_TOPIC:
                offer = parse_offer(data).offer
                key = offer.sealed.input_digest if offer.sealed is not None else offer.payload.terms(b"").input_digest
                work = self.works.get(key)
                if work is not None:
                    stamp = time.monotonic()
                    work.issues.append(
                        Issue(work.index, offer.offer_id, digest_of(data), hashlib.sha256(data).digest(), stamp)
                    )
            await original(topic_id, data)

        pubsub.publish = publish  # type: ignore[method-assign]


async def run(options: Options) -> tuple[Report, dict[str, Any]]:
    sizes = options.sizes or (SIZES_QUICK if options.quick else SIZES_FULL)
    plan = Plan.of(options)
    variant = (
        f"adaptive gossip {'on' if options.adaptive_gossip else 'off'}, "
        f"eclipse protection {'on' if options.eclipse_protection else 'off'}"
        + (f", {options.grief} griefing runners" if options.grief else "")
    )
    report = options.report("scale", f"The mesh at {', '.join(map(str, sizes))} nodes ({variant})")
    rows = []
    for size in sizes:
        rows.append(await _measure(size, options, plan, random.Random(options.seed * 1000 + size)))
    base_idle = rows[0]["idle_cpu_per_node"]
    for row in rows:
        row["idle_vs_smallest"] = ratio(row["idle_cpu_per_node"], base_idle)
    _write(report, rows, options, plan, variant)
    figures = {"rows": rows, "variant": variant, "plan": plan.__dict__, "load": os.getloadavg()}
    (report.out_dir / "calibration.json").write_text(json.dumps(rows, indent=1))
    if options.json is not None:
        options.json.write_text(json.dumps(figures, indent=1))
    return report, figures


async def _measure(size: int, options: Options, plan: Plan, rng: random.Random) -> dict[str, Any]:
    offerers = min(OFFERERS, size - 2)
    listeners = round(size * LISTENER_SHARE)
    runners = size - offerers - listeners
    griefers = min(options.grief, max(0, runners - 2))
    roles = ["runner"] * runners + ["listener"] * listeners
    rng.shuffle(roles)
    behaviours = ["honest"] * len(roles)
    runner_slots = [i for i, r in enumerate(roles) if r == "runner"]
    for k, i in enumerate(rng.sample(runner_slots, griefers)):
        behaviours[i] = "grief" if k % 2 == 0 else "die"
    worker_count = max(1, min(options.workers, len(roles)))
    node_options = {"adaptive_gossip": options.adaptive_gossip, "eclipse_protection": options.eclipse_protection}
    offerer_options: dict[str, Any] = {"claim_lease_margin_s": GRIEF_LEASE_MARGIN_S} if griefers else {}
    log = IssueLog()
    probe, receives, sends = DeliveryProbe(), ReceiveCounter(), SendCounter()
    async with (
        open_workers(worker_count) as workers,
        open_cluster(
            node_options={**node_options, "defences": crowded_defences()}, role_options={"offerer": offerer_options}
        ) as cluster,
    ):

        def instrument(_sim: SimNode, node: MeshNode) -> None:
            probe.watch(node)
            receives.watch(node)
            sends.watch(node)

        cluster.on_open.append(instrument)
        for worker in workers:
            await worker.request("configure", node_options=node_options, crowded=True)
        started = time.monotonic()
        addrs, grief_addrs = await _start_nodes(workers, roles, behaviours, rng)
        nodes: list[MeshNode] = []
        for _ in range(offerers):
            # With griefers, every offerer is their neighbour: they are invited first (free, first hand) until
            # their strikes put them last.
            others = rng.sample(addrs, min(DIALS_PER_NODE, len(addrs)))
            sim = await cluster.add("offerer", peers=list(dict.fromkeys(grief_addrs + others)))
            assert sim.node is not None
            log.watch(sim.node)
            probe.watch_publisher(sim.node)
            nodes.append(sim.node)
        formed = await _wait_formed(workers, cluster, timeout=FORMED_TIMEOUT_S)
        formed_s = time.monotonic() - started
        await trio.sleep(SETTLE_S)
        idle = await _cpu_window(workers, _sleep, plan.idle_window)
        hops = await _mesh_hops(workers, nodes)
        sends_before = await _sends(workers, sends)
        works: list[Work] = []
        busy = await _cpu_window(workers, _offer_all, nodes, log, works, plan, size)
        rpcs = await _sends(workers, sends) - sends_before
        merged = await _gather(workers, probe, receives)
    return _figures(size, formed, formed_s, griefers, works, merged, hops, idle, busy, rpcs, worker_count)


async def _sleep(seconds: float) -> None:
    await trio.sleep(seconds)


async def _start_nodes(
    workers: list[WorkerProcess], roles: list[str], behaviours: list[str], rng: random.Random
) -> tuple[list[str], list[str]]:
    """One node first, then one per worker at a time, in parallel: each dials DIALS_PER_NODE nodes started before
    its batch. Returns every address, and the misbehaving runners'."""
    addrs: list[str] = []
    grief_addrs: list[str] = []
    with Progress(f"start {len(roles)}", len(roles)) as bar:
        index = 0
        while index < len(roles):
            batch = 1 if index == 0 else len(workers)
            known = list(addrs)
            chosen = list(range(index, min(index + batch, len(roles))))

            async def one(i: int, known: list[str] = known) -> None:
                peers = rng.sample(known, min(DIALS_PER_NODE, len(known)))
                _, addr = await workers[i % len(workers)].add(roles[i], peers, behaviours[i])
                addrs.append(addr)
                if behaviours[i] != "honest":
                    grief_addrs.append(addr)
                bar.advance()

            async with trio.open_nursery() as nursery:
                for i in chosen:
                    nursery.start_soon(one, i)
            index += batch
    return addrs, grief_addrs


async def _wait_formed(workers: list[WorkerProcess], cluster: Cluster, *, timeout: float) -> bool:
    """Every node has offers-mesh peers; every offerer has the status of each of its neighbours and knows of a
    runner to invite."""
    with trio.move_on_after(timeout):
        while True:
            states = [await w.request("state") for w in workers]
            meshed = all(node["mesh"] for s in states for node in s["nodes"].values())
            if meshed and cluster.formed():
                return True
            await trio.sleep(0.5)
    return False


async def _mesh_hops(workers: list[WorkerProcess], offerers: list[MeshNode]) -> dict[str, dict[str, int]]:
    """Hops along the offers mesh from each offerer to every node, from one snapshot taken before the offers."""
    edges: dict[str, set[str]] = {}

    def link(a: str, b: str) -> None:
        edges.setdefault(a, set()).add(b)
        edges.setdefault(b, set()).add(a)

    for worker in workers:
        for peer, node in (await worker.request("state"))["nodes"].items():
            for other in node["mesh"]:
                link(peer, other)
    for node in offerers:
        for other in node.gossip.mesh_peers():
            link(node.peer_id, other)
    result = {}
    for node in offerers:
        hops = {node.peer_id: 0}
        frontier = [node.peer_id]
        while frontier:
            nxt = []
            for peer in frontier:
                for other in edges.get(peer, ()):
                    if other not in hops:
                        hops[other] = hops[peer] + 1
                        nxt.append(other)
            frontier = nxt
        result[node.peer_id] = hops
    return result


def work_input(index: int, size: int) -> dict[str, list[int]]:
    return {"xs": [index, size]}


async def _offer_all(offerers: list[MeshNode], log: IssueLog, works: list[Work], plan: Plan, size: int) -> None:
    async def one(work: Work, node: MeshNode) -> None:
        raw = node.make_offer(
            language="python", code=SHORT_TASK, input=work_input(work.index, size), limits=OFFER_LIMITS
        )
        work.started = time.monotonic()
        work.outcome = await node.offer_gossip(raw, timeout=OFFER_TIMEOUT_S)
        work.finished = time.monotonic()
        bar.advance(note=f"{sum(1 for w in works if w.outcome and w.outcome.ok)} ok")

    with Progress(f"scale {size}", plan.offers) as bar:
        async with trio.open_nursery() as nursery:
            for i in range(plan.offers):
                node = offerers[i % len(offerers)]
                work = Work(i, node.peer_id)
                works.append(work)
                log.works[Payload(SHORT_TASK, work_input(i, size)).terms(b"").input_digest] = work
                nursery.start_soon(one, work, node)
                await trio.sleep(1 / plan.rate)
            await trio.sleep(DELIVERY_WINDOW)  # the last offer's delivery window is part of the busy window


async def _cpu_window(workers: list[WorkerProcess], body: Any, *args: Any) -> dict[str, float]:
    """Run `body(*args)`; the CPU every process (the workers and this one) spent meanwhile, in cores, and the
    status pushes the workers' nodes sent."""

    async def snapshot() -> tuple[list[float], int]:
        cpu, pushes = [], 0
        for w in workers:
            cpu.append((await w.request("state"))["cpu_s"])
            pushes += (await w.request("presence"))["pushes"]
        return cpu, pushes

    (before, pushes_before), parent_before, wall_before = await snapshot(), time.process_time(), time.monotonic()
    await body(*args)
    (after, pushes_after), parent_after = await snapshot(), time.process_time()
    wall = time.monotonic() - wall_before
    per_process = [(b - a) / wall for a, b in zip(before, after, strict=True)] + [(parent_after - parent_before) / wall]
    return {
        "cores": sum(per_process),
        "max_process_cores": max(per_process),
        "wall_s": wall,
        "pushes_per_s": (pushes_after - pushes_before) / wall,
    }


async def _sends(workers: list[WorkerProcess], parent: SendCounter) -> int:
    total = parent.snapshot()["rpcs"]
    for w in workers:
        total += (await w.request("sends")).get("rpcs", 0)
    return total


@dataclass
class Merged:
    arrivals: dict[str, dict[str, float]]  # digest hex: peer: when heard
    copies: dict[str, list[int]]  # message id hex: copies per receiving node
    runs: dict[str, int]  # offer id hex: runs
    deaths: dict[str, float]
    griefed: int
    peers: set[str]
    heartbeats: list[float]  # each live node's router heartbeat interval at the end, s


async def _gather(workers: list[WorkerProcess], probe: DeliveryProbe, receives: ReceiveCounter) -> Merged:
    arrivals: dict[str, dict[str, float]] = {
        d.hex(): {p: a.at for p, a in seen.items() if a.transport == "gossip"} for d, seen in probe.arrivals.items()
    }
    copies: dict[str, list[int]] = {m.hex(): list(c.values()) for m, c in receives.copies.items()}
    runs: dict[str, int] = {}
    deaths: dict[str, float] = {}
    griefed = 0
    peers: set[str] = set()
    heartbeats: list[float] = []
    for w in workers:
        for digest, seen in (await w.request("arrivals")).items():
            arrivals.setdefault(digest, {}).update(seen)
        for mid, counts in (await w.request("receives")).items():
            copies.setdefault(mid, []).extend(counts)
        for offer_id, count in (await w.request("runs")).items():
            runs[offer_id] = runs.get(offer_id, 0) + count
        state = await w.request("state")
        deaths.update(state["deaths"])
        griefed += state["griefed"]
        peers |= set(state["nodes"]) | set(state["deaths"])
        heartbeats += [node["heartbeat_s"] for node in state["nodes"].values()]
    return Merged(arrivals, copies, runs, deaths, griefed, peers, heartbeats)


def _figures(
    size: int,
    formed: bool,
    formed_s: float,
    griefers: int,
    works: list[Work],
    merged: Merged,
    hops: dict[str, dict[str, int]],
    idle: dict[str, float],
    busy: dict[str, float],
    rpcs: int,
    worker_count: int,
) -> dict[str, Any]:
    offerer_ids = {w.offerer for w in works}
    everyone = merged.peers | offerer_ids
    expected = reached = 0
    latencies: list[float] = []
    hop_x: list[float] = []
    hop_y: list[float] = []
    for work in works:
        if not work.issues:
            continue
        first = work.issues[0]
        heard = merged.arrivals.get(first.digest.hex(), {})
        audience = {
            p for p in everyone - {work.offerer} if merged.deaths.get(p, math.inf) > first.published
        }  # the nodes alive when it was published
        expected += len(audience)
        for peer in audience & heard.keys():
            delay = heard[peer] - first.published
            latencies.append(delay)
            reached += delay <= DELIVERY_WINDOW
            if peer in hops.get(work.offerer, {}):
                hop_x.append(hops[work.offerer][peer])
                hop_y.append(delay)
    duplicates = [c - 1 for w in works for i in w.issues for c in merged.copies.get(i.message_id.hex(), [])]
    deliveries = len(duplicates)
    runs_per_work = [sum(merged.runs.get(i.offer_id.hex(), 0) for i in w.issues) for w in works]
    outcomes = [w.outcome for w in works if w.outcome is not None]
    done = [w for w in works if w.outcome is not None and w.outcome.ok]
    claims = [o.claim_requests for o in outcomes]
    issues = [o.issues for o in outcomes]
    per_hop, overhead = linear_fit(hop_x, hop_y)
    excess_cpu_ms = max(0.0, busy["cores"] - idle["cores"]) * busy["wall_s"] * 1000
    return {
        "nodes": size,
        "workers": worker_count,
        "griefers": griefers,
        "formed": formed,
        "formed_s": formed_s,
        "offers": len(works),
        "delivery_within_3s": ratio(reached, expected),
        "latency_p50": percentile(latencies, 50),
        "latency_p99": percentile(latencies, 99),
        "per_hop_s": per_hop,
        "publish_overhead_s": overhead,
        "max_hops": max(hop_x, default=0),
        "result_p50": percentile([w.finished - w.started for w in done], 50),
        "result_p99": percentile([w.finished - w.started for w in done], 99),
        "completion": ratio(len(done), len(works)),
        "lost": len(works) - len(done),
        "refusals": sorted(str(o.refusal.reason) for o in outcomes if o.refusal is not None),
        "claims_mean": ratio(sum(claims), len(claims)),
        "claims_max": max(claims, default=0),
        "issues_mean": ratio(sum(issues), len(issues)),
        "issues_max": max(issues, default=0),
        "duplicates_per_delivery": ratio(sum(duplicates), deliveries),
        "deliveries": deliveries,
        "copies": sum(duplicates) + deliveries,
        "duplicate_runs": sum(max(0, n - 1) for n in runs_per_work),
        "runs": sum(runs_per_work),
        "griefed_claims": merged.griefed,
        "deaths": len(merged.deaths),
        "router_heartbeat_max_s": max(merged.heartbeats, default=math.nan),
        "router_heartbeat_slow": sum(h > 1.0 for h in merged.heartbeats),
        "idle_cores": idle["cores"],
        "idle_cpu_per_node": idle["cores"] / size,
        "idle_pushes_per_node_s": idle["pushes_per_s"] / size,
        "busy_cores": busy["cores"],
        "busy_cpu_per_node": busy["cores"] / size,
        "busy_max_process_cores": busy["max_process_cores"],
        "busy_wall_s": busy["wall_s"],
        "rpcs": rpcs,
        "cpu_ms_per_copy": ratio(excess_cpu_ms, sum(duplicates) + deliveries),
        "cpu_ms_per_rpc": ratio(excess_cpu_ms, rpcs),
        "load": os.getloadavg()[0],
    }


def _write(report: Report, rows: list[dict[str, Any]], options: Options, plan: Plan, variant: str) -> None:
    def pct(x: float) -> str:
        return "n/a" if math.isnan(x) else f"{x * 100:.1f}%"

    def msec(x: float) -> str:
        return "n/a" if math.isnan(x) else f"{x * 1000:.0f} ms"

    report.text(
        f"{variant}. {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end. Per size: "
        f"{OFFERERS} offerers in the parent, {LISTENER_SHARE:.0%} listeners (`sandbox_mode=none`), the rest runners, "
        f"over up to {options.workers} worker processes; the runners of each worker share one Docker executor. "
        f"{plan.offers} gossip offers at {plan.rate:g}/s; idle CPU over {plan.idle_window:g} s without offers. CPU "
        "per node is every process's CPU over N, in % of one core."
    )
    report.table(
        [
            "nodes",
            "delivery ≤3 s",
            "p50 / p99",
            "result p50 / p99",
            "claims mean / max",
            "issues mean / max",
            "dups per delivery",
            "idle CPU /node",
            "busy CPU /node",
            "dup runs",
            "lost",
        ],
        [
            (
                r["nodes"],
                f"{r['delivery_within_3s']:.3f}",
                f"{msec(r['latency_p50'])} / {msec(r['latency_p99'])}",
                f"{msec(r['result_p50'])} / {msec(r['result_p99'])}",
                f"{r['claims_mean']:.2f} / {r['claims_max']}",
                f"{r['issues_mean']:.2f} / {r['issues_max']}",
                f"{r['duplicates_per_delivery']:.2f}",
                pct(r["idle_cpu_per_node"]),
                pct(r["busy_cpu_per_node"]),
                r["duplicate_runs"],
                r["lost"],
            )
            for r in rows
        ],
    )
    report.table(
        [
            "nodes",
            "formed s",
            "idle vs smallest",
            "pushes /node/s",
            "idle cores",
            "busy cores",
            "busiest process",
            "per hop (fit)",
            "CPU ms /copy",
            "CPU ms /RPC",
            "griefed / died",
            "router heartbeat max / nodes over 1 s",
        ],
        [
            (
                r["nodes"],
                f"{r['formed_s']:.0f}",
                f"{r['idle_vs_smallest']:.2f}x",
                f"{r['idle_pushes_per_node_s']:.3f}",
                f"{r['idle_cores']:.2f}",
                f"{r['busy_cores']:.2f}",
                f"{r['busy_max_process_cores']:.2f}",
                msec(r["per_hop_s"]),
                f"{r['cpu_ms_per_copy']:.2f}",
                f"{r['cpu_ms_per_rpc']:.2f}",
                f"{r['griefed_claims']} / {r['deaths']}",
                f"{r['router_heartbeat_max_s']:g} s / {r['router_heartbeat_slow']}",
            )
            for r in rows
        ],
    )
    xs = [r["nodes"] for r in rows]

    def delivery(ax: Any) -> None:
        ax.plot(xs, [r["delivery_within_3s"] for r in rows], "o-", label="delivery within 3 s (share of pairs)")
        ax.plot(xs, [r["busy_cores"] / (os.cpu_count() or 1) for r in rows], "s--", label="busy CPU, share of cores")
        ax.set_xlabel("nodes")
        ax.set_ylabel("share, 0 to 1")
        ax.set_ylim(0, 1.1)
        ax.legend()

    report.figure("scale_delivery.png", "Delivery within 3 s and busy CPU against nodes", delivery, counted_x=True)

    def claims(ax: Any) -> None:
        ax.plot(xs, [r["claims_mean"] for r in rows], "o-", label="mean")
        ax.plot(xs, [r["claims_max"] for r in rows], "s-", label="max")
        ax.axhline(CLAIMS_MEAN_BOUND, color="tab:blue", ls=":", label=f"bound on the mean ({CLAIMS_MEAN_BOUND:g})")
        ax.axhline(CLAIMS_MAX_BOUND, color="tab:orange", ls=":", label=f"bound on the max ({CLAIMS_MAX_BOUND})")
        ax.set_xlabel("nodes")
        ax.set_ylabel("claim requests per offer")
        ax.set_ylim(0, CLAIMS_MAX_BOUND + 2)
        ax.legend(fontsize=7)

    report.figure("scale_claims.png", "Claim requests reaching the offerer per offer, against nodes", claims)

    def idle(ax: Any) -> None:
        ax.plot(xs, [r["idle_cpu_per_node"] * 100 for r in rows], "o-", label="idle")
        ax.plot(xs, [r["busy_cpu_per_node"] * 100 for r in rows], "s-", label="busy")
        ax.set_xlabel("nodes")
        ax.set_ylabel("CPU per node, % of one core")
        ax.set_ylim(bottom=0)
        ax.legend()

    report.figure("scale_cpu_per_node.png", "CPU per node, idle and while offers flow, against nodes", idle)


def acceptance(rows: Iterable[dict[str, Any]]) -> list[str]:
    """What issue 13 asks of the largest size, as failures (empty: met)."""
    rows = list(rows)
    top, smallest = rows[-1], rows[0]
    failures = []
    if top["delivery_within_3s"] < 1.0:
        failures.append(f"delivery within 3 s is {top['delivery_within_3s']:.3f} at {top['nodes']} nodes")
    if not top["claims_mean"] <= CLAIMS_MEAN_BOUND or top["claims_max"] > CLAIMS_MAX_BOUND:
        failures.append(f"claims per offer {top['claims_mean']:.2f} mean / {top['claims_max']} max")
    if top["duplicate_runs"]:
        failures.append(f"{top['duplicate_runs']} duplicate runs")
    if top["idle_cpu_per_node"] > IDLE_GROWTH_BOUND * smallest["idle_cpu_per_node"]:
        failures.append(f"idle CPU per node {top['idle_vs_smallest']:.2f}x the figure at {smallest['nodes']} nodes")
    return failures
