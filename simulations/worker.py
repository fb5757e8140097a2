"""`python -m simulations.worker`: one OS process hosting some of a cluster's nodes, driven by JSON lines.

Why: py-libp2p spends about 3 ms of CPU per message received, so one process (one event loop, one core) saturates
near a dozen nodes. Spreading the nodes over several processes lets the whole machine's cores carry them.

Protocol: one JSON object per line on stdin, one answer per line on stdout, in order.

- `{"op": "configure", "node_options": {...}, "crowded": bool}` → `{}`: `NodeConfig` fields (JSON values) for the
  nodes added from now on; `crowded`: hundreds of nodes share 127.0.0.1, so the per-source admission limits of
  `transports.hardening` (meant for one address, one operator) are raised
- `{"op": "add", "role": "listener" | "runner", "peers": [addr, ...], "behaviour": "honest" | "grief" | "die"}` →
  `{"peer_id", "addr"}`. Runners of one worker share ONE real Docker executor and sandbox gate
  (`NodeConfig.shared_sandbox`), opened with the first runner: real runs, without one canary loop and one warm
  pool per node. A `grief` runner claims what it is invited to and then never runs it nor answers; a `die` runner
  is killed as soon as it holds its first claim
- `{"op": "state"}` → per node: offers-mesh peers, fresh statuses known; this process's CPU seconds; deaths
- `{"op": "arrivals"}` → `{offer digest hex: {peer_id: monotonic seconds}}` (gossip arrivals; CLOCK_MONOTONIC is
  one clock for every process on the machine, so the parent compares it with its own publish stamps)
- `{"op": "receives"}` → `{message id hex: [copies received by each node that received any]}`
- `{"op": "runs"}` → `{offer id hex: runs}` over every node and incarnation of this worker
- `{"op": "sends"}` → RPC counters summed over this process's nodes (see `probes.SendCounter`)
- `{"op": "presence"}` → status pushes and pulls sent, summed over this process's nodes

The worker exits when stdin closes. Logs go to stderr: stdout is the control channel only.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter, deque
from typing import Any

import trio

from executor.policy import ExecutorPolicy
from mesh.gate import SandboxGate
from mesh.intake import Job
from mesh.node import MeshNode, NodeConfig, SharedSandbox
from simulations.cluster import Cluster, SimNode
from simulations.probes import DeliveryProbe, ReceiveCounter, SendCounter
from simulations.scenario import quiet_logs
from transports.hardening import AdmissionLimits, Defences

BEHAVIOURS = ("honest", "grief", "die")
# One warm container and two runs at once for all the runners of one worker process.
SHARED_POLICY = ExecutorPolicy(pool_size=1, max_concurrent=2, max_waiting=32)
# The shared gate checks Docker once at start; a periodic canary for a simulation's lifetime measures dockerd.
SHARED_GATE_INTERVAL = 3600.0


def crowded_defences() -> Defences:
    """Defences for many nodes behind 127.0.0.1: one source address stands for hundreds of operators here, so
    per-source admission (16 connections, 10/s) would refuse honest neighbours. Everything else as by default."""
    return Defences(admission=AdmissionLimits(max_per_source=4096, source_rate=10_000.0, source_burst=10_000.0))


class Worker:
    def __init__(self, cluster: Cluster, services: trio.Nursery) -> None:
        self.cluster = cluster
        # Outlives the cluster's own nursery: the shared sandbox closes after the last node that used it.
        self._nursery = services
        self.probe = DeliveryProbe()
        self.sends = SendCounter()
        self.receives = ReceiveCounter()
        self.ran_lists: list[deque[bytes]] = []
        self.behaviours: dict[int, str] = {}
        self.deaths: dict[str, float] = {}  # peer id: when a `die` runner was killed
        self.griefed = 0  # claims a `grief` runner won and sits on
        self._shared: SharedSandbox | None = None
        cluster.on_open.append(self._instrument)

    def _instrument(self, sim: SimNode, node: MeshNode) -> None:
        self.probe.watch(node)
        self.sends.watch(node)
        self.receives.watch(node)
        self.ran_lists.append(node.ran)
        behaviour = self.behaviours.get(sim.index, "honest")
        if behaviour != "honest":
            self._misbehave(sim, node, behaviour)

    def _misbehave(self, sim: SimNode, node: MeshNode, behaviour: str) -> None:
        """`node._run` is called only once the offerer granted the claim: sit on it, or die holding it."""

        async def run(job: Job) -> Any:
            if behaviour == "grief":
                self.griefed += 1
            else:
                self.deaths[sim.peer_id] = time.monotonic()
                self._nursery.start_soon(self.cluster.kill, sim)
            await trio.sleep_forever()

        node._run = run  # type: ignore[method-assign]

    async def _shared_sandbox(self) -> SharedSandbox:
        if self._shared is None:
            shared: SharedSandbox = await self._nursery.start(self._run_shared_sandbox)
            self._shared = shared
        return self._shared

    async def _run_shared_sandbox(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        from executor.runner import Executor

        async with Executor.open(SHARED_POLICY, node_label=f"sim-worker-{os.getpid()}") as executor:
            gate = SandboxGate("docker", executor, interval=SHARED_GATE_INTERVAL)
            async with trio.open_nursery() as nursery:
                await nursery.start(gate.run)  # its first check is done: the runners start participating
                task_status.started(SharedSandbox(executor, gate))

    async def handle(self, request: dict[str, Any]) -> Any:
        op = request["op"]
        if op == "configure":
            options = dict(request.get("node_options", {}))
            unknown = set(options) - set(NodeConfig.__dataclass_fields__)
            if unknown:
                raise ValueError(f"not NodeConfig fields: {sorted(unknown)}")
            if request.get("crowded"):
                options["defences"] = crowded_defences()
            self.cluster.node_options.update(options)
            return {}
        if op == "add":
            role, behaviour = request["role"], request.get("behaviour", "honest")
            if behaviour not in BEHAVIOURS or (behaviour != "honest" and role != "runner"):
                raise ValueError(f"bad behaviour {behaviour!r} for a {role}")
            if role == "runner":
                self.cluster.role_options["runner"] = {"shared_sandbox": await self._shared_sandbox()}
            self.behaviours[len(self.cluster.nodes)] = behaviour  # the index `add` gives the new node
            sim = await self.cluster.add(role, peers=list(request["peers"]))
            return {"peer_id": sim.peer_id, "addr": sim.addr}
        if op == "state":
            nodes = {
                n.peer_id: {
                    "mesh": n.gossip.mesh_peers(),
                    "fresh": len(n.peers.fresh()),
                    # py-libp2p's adaptive gossip changes it (to 30-60 s when it judges the mesh unhealthy).
                    "heartbeat_s": n.gossip.router.heartbeat_interval,
                }
                for n in self.cluster.live()
            }
            return {"nodes": nodes, "cpu_s": time.process_time(), "deaths": self.deaths, "griefed": self.griefed}
        if op == "arrivals":
            return {
                digest.hex(): {peer: a.at for peer, a in seen.items() if a.transport == "gossip"}
                for digest, seen in self.probe.arrivals.items()
            }
        if op == "receives":
            return {mid.hex(): list(per_node.values()) for mid, per_node in self.receives.copies.items()}
        if op == "runs":
            runs: Counter[str] = Counter()
            for ran in self.ran_lists:
                runs.update(offer_id.hex() for offer_id in ran)
            return dict(runs)
        if op == "sends":
            return dict(self.sends.snapshot())
        if op == "presence":
            live = self.cluster.live()
            return {"pushes": sum(n.presence.pushes for n in live), "pulls": sum(n.presence.pulls for n in live)}
        raise ValueError(f"unknown op {op!r}")


async def serve(requests: trio.abc.ReceiveStream, answers: trio.abc.SendStream) -> None:
    async with trio.open_nursery() as services:
        async with trio.open_nursery() as nodes:
            worker = Worker(Cluster(nodes), services)
            buffer = b""
            while chunk := await requests.receive_some(65536):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    answer: dict[str, Any] = {}
                    try:
                        request = json.loads(line)
                        answer["id"] = request.pop("id", None)  # echoed: the parent pairs answers by it
                        answer["ok"] = await worker.handle(request)
                    except Exception as exc:  # a bad request is answered, not fatal: the parent reports it
                        answer["error"] = repr(exc)
                    await answers.send_all(json.dumps(answer).encode() + b"\n")
            nodes.cancel_scope.cancel()  # stdin closed: the parent is done with us
        services.cancel_scope.cancel()  # then the shared sandbox, once no node uses it


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
