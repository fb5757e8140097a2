"""Sealed against clear gossip offers at 16 nodes, 100 KB offers: bytes on the wire per offer, offer-to-result p50.

    .venv/bin/python benchmarks/bench_sealed.py [--offers 15] [--nodes 16]

`--nodes` real nodes on loopback in this process, half of them runners sharing one real Docker executor and gate
(`NodeConfig.shared_sandbox`), the rest `SANDBOX_MODE=none` relays; each dials three random earlier ones. The
offerer is one more node, connected to node 1. Each offer is about 100 KB of code and input (a 50 KB comment in the
code, a 50 KB string in the input); the program prints the input's length. Offers alternate between the two forms
(clear: the node's `seal_gossip` off; sealed: the default), one at a time, after one unmeasured warm-up of each.

- gossip bytes per offer: the data of every pubsub message each mesh node received from a peer while the offer was
  out, duplicates included (what GossipSub's flood costs the mesh; protobuf framing and libp2p's signature, the
  same ~150 bytes per message in both forms, are not counted);
- payload bytes: a sealed offer's payload, sealed, which crosses one link once, in the grant;
- offer-to-result: from the call to `offer_gossip` to the verified result.

Target (issue 24): at least 10x fewer bytes per gossip offer sealed (gossip and payload together), and a p50 no
worse than the clear form's. Both run on one Python thread here: the p50s compare the two forms, they are not
bench_e2e's figure.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import structlog
import trio
from verdict import Verdict as BenchVerdict  # benchmarks/ is the script's directory

from executor.contract import Limits
from executor.policy import ExecutorPolicy
from mesh.gate import SandboxGate
from mesh.node import MeshNode, NodeConfig, SharedSandbox
from transports.wire.identity import NodeIdentity

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
BYTES_TARGET = 10.0
CODE = "import json, sys\nprint(len(json.load(sys.stdin)['blob']))\n# " + "c" * 50_000 + "\n"
INPUT = {"blob": "i" * 50_000}
EXPECTED = "50000\n"


def quiet_logs() -> None:
    logging.getLogger().setLevel(logging.ERROR)
    logging.disable(logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


class WireCount:
    """The data bytes of every pubsub message the mesh's nodes receive from peers."""

    def __init__(self) -> None:
        self.bytes = 0

    def watch(self, node: MeshNode) -> None:
        pubsub: Any = node.gossip.pubsub
        push = pubsub.push_msg

        async def counting(forwarder: Any, msg: Any) -> None:
            self.bytes += len(msg.data)
            await push(forwarder, msg)

        pubsub.push_msg = counting


@contextlib.asynccontextmanager
async def mesh(nodes: int) -> AsyncIterator[tuple[list[MeshNode], MeshNode]]:
    from executor.runner import Executor

    policy = ExecutorPolicy(pool_size=2, max_concurrent=2)
    async with trio.open_nursery() as nursery, contextlib.AsyncExitStack() as stack:
        executor = await stack.enter_async_context(Executor.open(policy, node_label="bench-sealed"))
        gate = SandboxGate("docker", executor, interval=3600)
        await nursery.start(gate.run)
        shared = SharedSandbox(executor, gate)
        rng = random.Random(1)
        started: list[MeshNode] = []
        for i in range(nodes):
            peers = rng.sample([n.addrs[0] for n in started], min(3, len(started)))
            config = NodeConfig(
                identity=NodeIdentity.generate(),
                listen=LOOPBACK,
                peers=peers,
                sandbox_mode="docker" if i % 2 == 0 else "none",
                executor_policy=policy,
                shared_sandbox=shared if i % 2 == 0 else None,
                mdns=False,
            )
            started.append(await stack.enter_async_context(MeshNode.open(config)))
        offerer_config = NodeConfig(
            identity=NodeIdentity.generate(), listen=LOOPBACK, peers=[started[1].addrs[0]], sandbox_mode="none"
        )
        offerer = await stack.enter_async_context(MeshNode.open(offerer_config))
        try:
            yield started, offerer
        finally:
            await stack.aclose()  # the nodes and the executor, before the gate's nursery
            nursery.cancel_scope.cancel()


async def bench(offers: int, nodes: int) -> dict[str, dict[str, list[float]]]:
    figures: dict[str, dict[str, list[float]]] = {
        form: {"seconds": [], "gossip": [], "payload": []} for form in ("clear", "sealed")
    }
    figures["mesh"] = {"unparseable_rpcs": []}
    async with mesh(nodes) as (started, offerer):
        count = WireCount()
        for node in started:
            count.watch(node)
        payload_bytes = [0]
        grant = offerer.desk.grant_sealed_claim

        async def counting_grant(*args: Any) -> Any:
            granted = await grant(*args)
            if isinstance(granted, bytes):
                payload_bytes[0] += len(granted)
            return granted

        offerer.desk.grant_sealed_claim = counting_grant  # type: ignore[method-assign,assignment]
        assert await offerer.wait_for_runner(timeout=30), "the offerer never learned of a runner"
        for i in range(offers + 1):
            for form in ("clear", "sealed"):
                offerer.offerer.seal_gossip = form == "sealed"
                await trio.sleep(0.3)  # the warm pool refilled, and under the intake's per-offerer rate
                raw = offerer.make_offer(language="python", code=CODE, input=INPUT, limits=Limits(timeout_ms=5000))
                count.bytes, payload_bytes[0] = 0, 0
                began = time.perf_counter()
                outcome = await offerer.offer_gossip(raw, timeout=60)
                elapsed = time.perf_counter() - began
                assert outcome.result is not None and outcome.result.result.stdout == EXPECTED, outcome
                await trio.sleep(1.0)  # the flood's last copies arrive
                if i == 0:
                    continue
                figures[form]["seconds"].append(elapsed)
                figures[form]["gossip"].append(count.bytes)
                figures[form]["payload"].append(payload_bytes[0])
        figures["mesh"]["unparseable_rpcs"].append(sum(n.gossip.stats["pubsub_rpc_unparseable"] for n in started))
    return figures


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--offers", type=int, default=15)
    parser.add_argument("--nodes", type=int, default=16)
    args = parser.parse_args()
    quiet_logs()
    figures = trio.run(bench, args.offers, args.nodes)
    offer_kb = (len(CODE) + len(INPUT["blob"])) / 1000
    print(f"gossip offers at {args.nodes} nodes, ~{offer_kb:.0f} KB of code and input, {args.offers} offers per form")
    rows = {}
    mesh_figures = figures.pop("mesh")
    for form, f in figures.items():
        gossip, payload = statistics.median(f["gossip"]), statistics.median(f["payload"])
        p50 = statistics.median(f["seconds"]) * 1000
        rows[form] = (gossip + payload, p50)
        print(
            f"  {form:<6} gossip bytes per offer {gossip:>10,.0f}   payload bytes (one link) {payload:>8,.0f}   "
            f"offer-to-result p50 {p50:7.1f} ms"
        )
    print(f"pubsub RPCs the mesh could not parse: {mesh_figures['unparseable_rpcs'][0]:.0f}")
    ratio = rows["clear"][0] / rows["sealed"][0]
    print(f"bytes per offer, clear / sealed: {ratio:.1f}x")
    # Every result was checked as it came (a wrong or missing one stops the benchmark with exit 1).
    verdict = BenchVerdict()
    unparseable = mesh_figures["unparseable_rpcs"][0]
    verdict.require(unparseable == 0, f"the mesh could not parse {unparseable:.0f} pubsub RPCs: offers arrived corrupt")
    verdict.target("bytes per offer, clear / sealed", ratio, at_least=BYTES_TARGET, unit="x")
    verdict.target("sealed p50 / clear p50", rows["sealed"][1] / rows["clear"][1], at_most=1.0, unit="x")
    return verdict.finish()


if __name__ == "__main__":
    sys.exit(main())
