"""An internet-scale model (1,000 to 100,000 nodes), calibrated with what the real-node runs measured.

Calibration, read from the committed results (`simulations/results/`), with built-in fallbacks when a file is absent:

- per-hop delay and duplicates per delivery: `scale.json` (`python -m simulations scale --nodes 16,64,200`), its fit
  of delivery delay against hops along the offers mesh, at the least loaded size that delivered everything;
- claim requests per offer, mean and max: `scale.json` again (offerer-driven invitations, `mesh.invitations`);
- idle CPU per node: `scale.json`'s idle window (presence to neighbours, the router's heartbeat, the node's loops);
- CPU per pubsub message received: `bench_pubsub.json` (`benchmarks/bench_pubsub.py`, our lean path, median);
- link loss: 5 % on every link, as the swarm's namespace test runs it (`tests/test_netns_mesh.py`).

Assumed, not measured here: a 40 ms wide-area one-way delay per hop, and that a lost segment costs TCP's minimum
retransmission timeout (200 ms on Linux), doubling for each further loss of the same segment.

The offers mesh is a random graph of degree D=6 (the router's `degree`); each node's delivery time is its shortest
path from the publisher (gossip's eager push follows every path, so the first copy takes the fastest). The node's
other costs do not depend on N by design, and the model says so from the measurements rather than assuming it:

- presence goes to a node's neighbours only (`transports.presence`: a push per neighbour per refresh and on change),
  so a node's presence cost follows its neighbour count, which the connection manager bounds, never N;
- claims: an offerer invites `INVITEES` runners per issue and at most `MAX_INVITED` over an offer's issues, so the
  claim requests reaching it do not grow with N either.

What does grow with N is the offer broadcast itself: every node receives every offer (1 + duplicates) times. At a
fixed offer rate per node, the network's offer rate, and so each node's gossip CPU, grows as N; and libp2p's
per-topic forward limit caps the network's offer rate whatever the CPU. The model shows both.

It ignores NAT, relays and discovery, churn during a publish, and IHAVE/IWANT repair (a copy lost for good is
repaired by gossip; here TCP retransmits every loss, which is what happens on a live connection).
"""

from __future__ import annotations

import heapq
import json
import math
import random
import statistics
from pathlib import Path
from typing import Any

from mesh.invitations import INVITEES
from mesh.offerer import MAX_INVITED
from simulations.progress import Progress
from simulations.report import Report
from simulations.scenario import Options
from simulations.stats import percentile
from transports.gossip import FORWARD_LIMIT_PER_TOPIC

RESULTS = Path(__file__).parent / "results"
DEGREE = 6
SIZES_FULL = (1_000, 3_000, 10_000, 30_000, 100_000)
SIZES_QUICK = (1_000, 10_000)
WAN_ONE_WAY_S = 0.040  # an assumption: a typical continental one-way delay, added to every hop
LINK_LOSS = 0.05  # the swarm's namespace test: 5 % packet loss on every link
TCP_RTO_MIN_S = 0.200  # Linux's minimum retransmission timeout: what one lost segment costs a hop
# A fixed offer rate per node, to show what the broadcast costs as N grows: one offer per node per hour.
OFFERS_PER_NODE_HOUR = 1.0
# Fallbacks when a result file is absent: what the committed ones held on 2026-12-01 (the 16-node size of the scale
# sweep, and the benchmark's lean path).
DEFAULTS: dict[str, float] = {
    "per_hop_s": 0.015,
    "duplicates_per_delivery": 3.9,
    "claims_mean": 2.0,
    "claims_max": 2.0,
    "idle_cpu_per_node": 0.0039,
    "cpu_ms_per_message": 0.515,
}


def calibration(results: Path = RESULTS) -> dict[str, Any]:
    """The model's inputs, each with where it came from."""
    cal: dict[str, Any] = dict(DEFAULTS)
    sources = dict.fromkeys(DEFAULTS, "built-in default")
    scale = results / "scale.json"
    if scale.exists():
        rows = [r for r in json.loads(scale.read_text())["rows"] if r["delivery_within_3s"] >= 0.999]
        hops = [r for r in rows if math.isfinite(r["per_hop_s"]) and r["per_hop_s"] > 0]
        if hops:
            least_loaded = min(hops, key=lambda r: r["nodes"])
            cal["per_hop_s"] = least_loaded["per_hop_s"]
            sources["per_hop_s"] = f"scale.json, fit at {least_loaded['nodes']} nodes"
        if rows:
            cal["duplicates_per_delivery"] = statistics.mean(r["duplicates_per_delivery"] for r in rows)
            cal["claims_mean"] = max(r["claims_mean"] for r in rows)
            cal["claims_max"] = max(r["claims_max"] for r in rows)
            cal["idle_cpu_per_node"] = max(r["idle_cpu_per_node"] for r in rows)
            sizes = ", ".join(str(r["nodes"]) for r in rows)
            sources["duplicates_per_delivery"] = f"scale.json, mean over {sizes} nodes"
            for key in ("claims_mean", "claims_max", "idle_cpu_per_node"):
                sources[key] = f"scale.json, the largest over {sizes} nodes"
        cal["measured"] = [
            {k: r[k] for k in ("nodes", "latency_p50", "latency_p99", "claims_mean", "claims_max", "idle_cpu_per_node")}
            for r in rows
        ]
    bench = results / "bench_pubsub.json"
    if bench.exists():
        lean = [r["cpu_ms_per_received"] for r in json.loads(bench.read_text()).get("lean", [])]
        if lean:
            cal["cpu_ms_per_message"] = statistics.median(lean)
            sources["cpu_ms_per_message"] = f"bench_pubsub.json, lean path, median of {len(lean)}"
    cal.setdefault("measured", [])
    # Runs with misbehaving runners (`--grief K`): their lapses and re-issues are what raise the claims.
    cal["griefed"] = [
        {k: r[k] for k in ("nodes", "griefers", "claims_mean", "claims_max")}
        for path in sorted(results.glob("scale-grief*.json"))
        for r in json.loads(path.read_text())["rows"]
    ]
    cal["sources"] = sources
    return cal


def random_mesh(n: int, rng: random.Random) -> list[list[int]]:
    """A random graph where every node has about DEGREE links (a configuration model, duplicates dropped)."""
    edges: list[set[int]] = [set() for _ in range(n)]
    for a in (i for i in range(n) for _ in range(DEGREE // 2)):
        b = rng.randrange(n)
        if a != b:
            edges[a].add(b)
            edges[b].add(a)
    return [list(e) for e in edges]


def link_delay(hop: float, wan: float, loss: float, rng: random.Random) -> float:
    """One link's delay for one message: the wide-area delay, the measured per-hop cost (exponential around it), and
    a retransmission timeout for every time the segment is lost (doubling, as TCP backs off)."""
    delay = wan + rng.expovariate(1 / hop)
    rto = TCP_RTO_MIN_S
    while loss and rng.random() < loss:
        delay += rto
        rto *= 2
    return delay


def delivery_times(mesh: list[list[int]], hop: float, wan: float, loss: float, rng: random.Random) -> list[float]:
    """Dijkstra from node 0; each link's delay is drawn once (`link_delay`)."""
    n = len(mesh)
    best = [math.inf] * n
    best[0] = 0.0
    heap = [(0.0, 0)]
    while heap:
        t, u = heapq.heappop(heap)
        if t > best[u]:
            continue
        for v in mesh[u]:
            arrival = t + link_delay(hop, wan, loss, rng)
            if arrival < best[v]:
                best[v] = arrival
                heapq.heappush(heap, (arrival, v))
    return best[1:]


def costs(n: int, cal: dict[str, Any]) -> dict[str, float]:
    """A node's CPU, in cores, at N nodes: idle (N-independent, measured) and the offer broadcast at a fixed rate
    per node (every offer received 1 + duplicates times)."""
    network_rate = n * OFFERS_PER_NODE_HOUR / 3600  # offers a second, network-wide
    copies = 1 + cal["duplicates_per_delivery"]
    return {
        "network_offers_per_s": network_rate,
        "idle_cores": cal["idle_cpu_per_node"],
        "offer_cores": network_rate * copies * cal["cpu_ms_per_message"] / 1000,
        # Each forwarding neighbour sends every offer once: past this network rate libp2p drops offers silently.
        "over_forward_limit": network_rate > FORWARD_LIMIT_PER_TOPIC,
    }


async def run(options: Options) -> tuple[Report, dict[str, Any]]:
    sizes = SIZES_QUICK if options.quick else SIZES_FULL
    cal = calibration()
    rng = random.Random(options.seed)
    report = options.report("model", "Internet-scale model (calibrated with the real-node runs)")
    rows = []
    with Progress("model", len(sizes)) as bar:
        for n in sizes:
            mesh = random_mesh(n, rng)
            hop = cal["per_hop_s"]
            clean = [t for t in delivery_times(mesh, hop, WAN_ONE_WAY_S, 0.0, rng) if math.isfinite(t)]
            lossy = [t for t in delivery_times(mesh, hop, WAN_ONE_WAY_S, LINK_LOSS, rng) if math.isfinite(t)]
            rows.append(
                {
                    "nodes": n,
                    "delivery_ratio": len(clean) / (n - 1),
                    "p50": percentile(clean, 50),
                    "p99": percentile(clean, 99),
                    "p50_loss": percentile(lossy, 50),
                    "p99_loss": percentile(lossy, 99),
                    "within_3s_loss": sum(t <= 3.0 for t in lossy) / (n - 1),
                    "claims_mean": cal["claims_mean"],
                    "claims_max": cal["claims_max"],
                    **costs(n, cal),
                }
            )
            bar.advance(note=f"{n} nodes")
    _write(report, rows, cal)
    return report, {"rows": rows, "calibration": cal}


def _write(report: Report, rows: list[dict[str, Any]], cal: dict[str, Any]) -> None:
    src = cal["sources"]
    report.text(
        "Calibration: "
        f"per-hop delay {cal['per_hop_s'] * 1000:.1f} ms ({src['per_hop_s']}); "
        f"{cal['duplicates_per_delivery']:.2f} duplicates per delivery ({src['duplicates_per_delivery']}); "
        f"{cal['cpu_ms_per_message']:.2f} ms of CPU per pubsub message received ({src['cpu_ms_per_message']}); "
        f"claim requests per offer {cal['claims_mean']:.2f} mean, {cal['claims_max']:g} max "
        f"({src['claims_mean']}); idle CPU per node {cal['idle_cpu_per_node'] * 100:.2f}% of a core "
        f"({src['idle_cpu_per_node']}). Assumed: {WAN_ONE_WAY_S * 1000:.0f} ms wide-area one-way delay per hop; "
        f"{LINK_LOSS:.0%} loss on every link, each loss costing at least {TCP_RTO_MIN_S * 1000:.0f} ms; mesh degree "
        f"{DEGREE}; {OFFERS_PER_NODE_HOUR:g} offer per node per hour for the broadcast's cost."
    )
    report.table(
        [
            "nodes",
            "delivery",
            "p50 / p99",
            f"p50 / p99, {LINK_LOSS:.0%} loss",
            f"within 3 s, {LINK_LOSS:.0%} loss",
            "claims per offer mean / max",
            "idle CPU /node",
            "offers /s, network",
            "offer CPU /node",
            "past forward limit",
        ],
        [
            (
                r["nodes"],
                f"{r['delivery_ratio']:.3f}",
                f"{r['p50'] * 1000:.0f} / {r['p99'] * 1000:.0f} ms",
                f"{r['p50_loss'] * 1000:.0f} / {r['p99_loss'] * 1000:.0f} ms",
                f"{r['within_3s_loss']:.3f}",
                f"{r['claims_mean']:.2f} / {r['claims_max']:g}",
                f"{r['idle_cores'] * 100:.2f}%",
                f"{r['network_offers_per_s']:.2f}",
                f"{r['offer_cores'] * 100:.2f}%",
                r["over_forward_limit"],
            )
            for r in rows
        ],
    )
    limit_n = FORWARD_LIMIT_PER_TOPIC * 3600 / OFFERS_PER_NODE_HOUR
    report.text(
        "Delivery latency grows with log N (about log_5 N hops). Claims and presence do not grow with N: an offer "
        f"invites {INVITEES} runners per issue and at most {MAX_INVITED} in all, and a node's status goes to its "
        "neighbours only, so both are the measured figures at every size. The offer broadcast is what grows: every "
        "node receives every offer, so at a fixed rate per node the network's offer rate and each node's gossip CPU "
        f"grow as N, and past {FORWARD_LIMIT_PER_TOPIC:g} offers a second network-wide (about {limit_n:,.0f} nodes at "
        f"{OFFERS_PER_NODE_HOUR:g} offer per node per hour) libp2p's per-topic forward limit drops offers silently."
    )
    xs = [r["nodes"] for r in rows]
    measured = cal["measured"]

    def latency(ax: Any) -> None:
        ax.semilogx(xs, [r["p50"] * 1000 for r in rows], "o-", label="p50, no loss")
        ax.semilogx(xs, [r["p99"] * 1000 for r in rows], "s-", label="p99, no loss")
        ax.semilogx(xs, [r["p50_loss"] * 1000 for r in rows], "o--", label=f"p50, {LINK_LOSS:.0%} loss")
        ax.semilogx(xs, [r["p99_loss"] * 1000 for r in rows], "s--", label=f"p99, {LINK_LOSS:.0%} loss")
        ax.set_xlabel("nodes (log scale)")
        ax.set_ylabel("offer to every node, ms")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)

    report.figure("model_latency.png", "Model: offer delivery latency against nodes, ms (wide area)", latency)

    def cpu(ax: Any) -> None:
        ax.loglog(xs, [r["idle_cores"] * 100 for r in rows], "o-", label="idle (presence to neighbours, measured)")
        ax.loglog(
            xs,
            [r["offer_cores"] * 100 for r in rows],
            "s-",
            label=f"offer gossip at {OFFERS_PER_NODE_HOUR:g} offer/node/hour",
        )
        if measured:
            ax.loglog(
                [m["nodes"] for m in measured],
                [m["idle_cpu_per_node"] * 100 for m in measured],
                "k^",
                label="idle, measured (scale)",
            )
        ax.set_xlabel("nodes (log scale)")
        ax.set_ylabel("CPU per node, % of one core")
        ax.legend(fontsize=7)

    report.figure("model_cpu.png", "Model: CPU per node against nodes, % of one core", cpu)

    def claims(ax: Any) -> None:
        every = [m["nodes"] for m in measured] + xs
        ax.semilogx(every, [cal["claims_mean"]] * len(every), "-", label="mean (largest measured)")
        ax.semilogx(every, [cal["claims_max"]] * len(every), "--", label="max (largest measured)")
        ax.axhline(MAX_INVITED, color="tab:red", ls=":", label=f"bound: {MAX_INVITED} invitees per offer")
        if measured:
            ax.semilogx([m["nodes"] for m in measured], [m["claims_mean"] for m in measured], "k^", label="measured")
        for g in cal["griefed"]:
            ax.semilogx([g["nodes"]] * 2, [g["claims_mean"], g["claims_max"]], "rv", ms=5)
            ax.annotate(f"{g['griefers']} griefers: mean, max", (g["nodes"], g["claims_max"]), fontsize=7)
        ax.set_xlabel("nodes (log scale)")
        ax.set_ylabel("claim requests per offer")
        ax.set_ylim(0, MAX_INVITED + 2)
        ax.legend(fontsize=7)

    report.figure("model_claims.png", "Model: claim requests reaching the offerer per offer, against nodes", claims)
