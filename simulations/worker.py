"""`python -m simulations.worker`: one OS process hosting some of a cluster's nodes, driven by JSON lines.

Why: py-libp2p spends about 3 ms of CPU per message received, so one process (one event loop, one core) saturates
near a dozen nodes. Spreading the nodes over several processes lets the whole machine's cores carry them.

Protocol: one JSON object per line on stdin, one answer per line on stdout, in order.

- `{"op": "add", "role": "listener", "peers": [addr, ...]}` → `{"peer_id", "addr"}`
- `{"op": "state"}` → per node: offers-mesh peers, fresh heartbeats seen; and this process's CPU seconds
- `{"op": "arrivals"}` → `{offer digest hex: {peer_id: monotonic seconds}}` (gossip arrivals; CLOCK_MONOTONIC is
  one clock for every process on the machine, so the parent compares it with its own publish stamps)
- `{"op": "sends"}` → RPC counters summed over this process's nodes (see `probes.SendCounter`)

The worker exits when stdin closes. Logs go to stderr: stdout is the control channel only.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import trio

from mesh.node import MeshNode
from simulations.cluster import Cluster, SimNode
from simulations.probes import DeliveryProbe, SendCounter
from simulations.scenario import quiet_logs


class Worker:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.probe = DeliveryProbe()
        self.sends = SendCounter()
        cluster.on_open.append(self._instrument)

    def _instrument(self, sim: SimNode, node: MeshNode) -> None:
        self.probe.watch(node)
        self.sends.watch(node)

    async def handle(self, request: dict[str, Any]) -> Any:
        op = request["op"]
        if op == "add":
            sim = await self.cluster.add(request["role"], peers=list(request["peers"]))
            return {"peer_id": sim.peer_id, "addr": sim.addr}
        if op == "state":
            nodes = {
                n.peer_id: {"mesh": n.gossip.mesh_peers(), "fresh": len(n.peers.fresh())} for n in self.cluster.live()
            }
            return {"nodes": nodes, "cpu_s": time.process_time()}
        if op == "arrivals":
            return {
                digest.hex(): {peer: a.at for peer, a in seen.items() if a.transport == "gossip"}
                for digest, seen in self.probe.arrivals.items()
            }
        if op == "sends":
            return dict(self.sends.snapshot())
        raise ValueError(f"unknown op {op!r}")


async def serve(requests: trio.abc.ReceiveStream, answers: trio.abc.SendStream) -> None:
    async with trio.open_nursery() as nursery:
        worker = Worker(Cluster(nursery))
        buffer = b""
        while chunk := await requests.receive_some(65536):
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                try:
                    answer = {"ok": await worker.handle(json.loads(line))}
                except Exception as exc:  # a bad request is answered, not fatal: the parent reports it
                    answer = {"error": repr(exc)}
                await answers.send_all(json.dumps(answer).encode() + b"\n")
        nursery.cancel_scope.cancel()  # stdin closed: the parent is done with us


def main() -> None:
    quiet_logs()
    # Anything that prints (libp2p, structlog's default logger) must not corrupt the control channel: keep the
    # real stdout for answers only and point fd 1 at stderr.
    control = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    async def run() -> None:
        async with trio.lowlevel.FdStream(os.dup(0)) as requests, trio.lowlevel.FdStream(control) as answers:
            await serve(requests, answers)

    trio.run(run)


if __name__ == "__main__":
    main()
