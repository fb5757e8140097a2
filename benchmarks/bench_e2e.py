"""Offer → verified result on loopback, direct and by gossip, with the CPU each side spends per offer.

    .venv/bin/python benchmarks/bench_e2e.py [--offers 40] [--nodes 16]

The mesh is a separate process (`--serve-mesh`, started by this script): `--nodes` real nodes on loopback, half of
them runners sharing one real Docker executor and gate (`NodeConfig.shared_sandbox`), the rest `SANDBOX_MODE=none`
nodes that only relay; each node dials three earlier ones. The offerer is a node in this process, connected to one
mesh node. So the two CPU figures are separate processes': the offerer's (this process) and the whole mesh's (the
other; dockerd's own CPU is in neither).

- direct: the offerer signs an offer addressed to one runner and sends it on a direct stream; the runner's intake
  verifies it, a warm pooled container runs it, the signed result comes back and is verified;
- gossip: the offerer invites runners it knows of (its neighbour's status and the runners that one reports),
  publishes, the first invitee to claim runs it, and the result comes back over the control stream.

Each offer is measured in steady state (the warm pool refilled), after one unmeasured warm-up offer per path. The
`docker run --rm` baseline runs the same trivial task with every flag of our containers (`cli_baseline`).
Targets (issue 17): direct p50 <= 30 ms on a quiet machine; gossip p50 <= 60 ms at 16 nodes.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import logging
import os
import random
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import structlog
import trio
from cli_baseline import CODE, EXPECTED, INPUT, bench_cli, percentiles, print_figures  # benchmarks/ is on sys.path

from executor.contract import Limits
from executor.policy import ExecutorPolicy
from mesh.identity import NodeIdentity
from mesh.node import MeshNode, NodeConfig

DIRECT_TARGET_MS = 30.0
GOSSIP_TARGET_MS = 60.0
LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
# A file name: the mesh process profiles the gossip offers (cProfile) and writes its stats there at the end.
PROFILE_ENV = "EDGECODER_BENCH_PROFILE"


def quiet_logs() -> None:
    logging.getLogger().setLevel(logging.ERROR)
    logging.disable(logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


# -- the mesh process ----------------------------------------------------------------------------------------------


async def serve_mesh(nodes: int) -> None:
    """Start the mesh, print `{"addr": ..., "runners": [...]}`, answer `cpu` and `ready` lines, stop at EOF."""
    from executor.runner import Executor
    from mesh.gate import SandboxGate
    from mesh.node import SharedSandbox

    policy = ExecutorPolicy(pool_size=2, max_concurrent=2)
    profiler = cProfile.Profile() if os.environ.get(PROFILE_ENV) else None
    rng = random.Random(1)
    async with trio.open_nursery() as nursery, contextlib.AsyncExitStack() as stack:
        executor = await stack.enter_async_context(Executor.open(policy, node_label="bench-e2e"))
        gate = SandboxGate("docker", executor, interval=3600)
        await nursery.start(gate.run)
        shared = SharedSandbox(executor, gate)
        started: list[MeshNode] = []
        for i in range(nodes):
            peers = [n.addrs[0] for n in rng.sample(started, min(3, len(started)))]
            config = NodeConfig(
                identity=NodeIdentity.generate(),
                listen=LOOPBACK,
                peers=peers,
                sandbox_mode="docker" if i % 2 == 0 else "none",
                executor_policy=policy,
                shared_sandbox=shared,
                mdns=False,
            )
            started.append(await stack.enter_async_context(MeshNode.open(config)))
        runners = [n for n in started if n.config.sandbox_mode == "docker"]
        print(json.dumps({"addr": started[1].addrs[0], "runners": [n.addrs[0] for n in runners]}), flush=True)
        stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
        buffer = b""
        profiling = profiling_now = False
        while chunk := await stdin.receive_some(4096):
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line == b"cpu":
                    answer: Any = time.process_time()
                    if profiler is not None and profiling:  # the profile covers what the CPU figure covers
                        profiling_now = not profiling_now
                        if profiling_now:
                            profiler.enable()
                        else:
                            profiler.disable()
                elif line == b"profile":  # the gossip path begins (PROFILE_ENV)
                    answer = profiling = profiler is not None
                else:  # "ready": the warm pool is full and nothing is being removed
                    stats = executor.stats()
                    answer = stats.pool_ready >= stats.pool_size and not stats.pending_removals
                print(json.dumps(answer), flush=True)
        if profiler is not None:
            profiler.dump_stats(os.environ[PROFILE_ENV])
        nursery.cancel_scope.cancel()


# -- the offerer (this process) ------------------------------------------------------------------------------------


class Mesh:
    def __init__(self, process: trio.Process, lines: Any) -> None:
        self.process = process
        self.lines = lines

    async def ask(self, what: str) -> Any:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(what.encode() + b"\n")
        return json.loads(await self.lines.next())


class _Lines:
    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.buffer = b""

    async def next(self) -> str:
        while b"\n" not in self.buffer:
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise RuntimeError("the mesh process ended")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()


@contextlib.asynccontextmanager
async def mesh_process(nodes: int) -> AsyncIterator[tuple[Mesh, dict[str, Any]]]:
    process = await trio.lowlevel.open_process(
        [sys.executable, __file__, "--serve-mesh", str(nodes)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        lines = _Lines(process.stdout)
        with trio.fail_after(120):
            info = json.loads(await lines.next())
        yield Mesh(process, lines), info
    finally:
        if process.stdin is not None:
            await process.stdin.aclose()
        with trio.move_on_after(20):
            await process.wait()
        if process.returncode is None:
            process.kill()


async def steady(mesh: Mesh) -> None:
    with trio.fail_after(30):
        while not await mesh.ask("ready"):
            await trio.sleep(0.01)
    await trio.sleep(0.25)  # and under the intake's per-offerer rate (5/s): not what we measure


async def bench(offers: int, nodes: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    async with mesh_process(nodes) as (mesh, info):
        config = NodeConfig(
            identity=NodeIdentity.generate(), listen=LOOPBACK, peers=[info["addr"]], sandbox_mode="none"
        )
        async with MeshNode.open(config) as offerer:
            assert await offerer.wait_for_runner(timeout=30), "the offerer never learned of a runner"
            direct_to = info["runners"][0]
            for path in ("direct", "gossip"):
                samples: list[float] = []
                cpu_offerer = cpu_mesh = 0.0
                claims: list[int] = []
                if path == "gossip":
                    await mesh.ask("profile")
                for i in range(offers + 1):
                    await steady(mesh)
                    peer = direct_to if path == "direct" else None
                    raw = offerer.make_offer(
                        to=peer, language="python", code=CODE, input=INPUT, limits=Limits(timeout_ms=5000)
                    )
                    mesh_before, own_before = await mesh.ask("cpu"), time.process_time()
                    began = time.perf_counter()
                    if peer is not None:
                        outcome = await offerer.offer_direct(peer, raw)
                    else:
                        outcome = await offerer.offer_gossip(raw, timeout=30)
                    elapsed = time.perf_counter() - began
                    own, mesh_cpu = time.process_time() - own_before, await mesh.ask("cpu") - mesh_before
                    assert outcome.result is not None and outcome.result.result.stdout == EXPECTED, outcome
                    if i == 0:
                        continue  # warm-up: the first stream or control stream, the first container
                    samples.append(elapsed)
                    cpu_offerer += own
                    cpu_mesh += mesh_cpu
                    claims.append(outcome.claim_requests)
                figures[path] = {
                    "p50_p95": percentiles(samples),
                    "cpu_offerer_ms": cpu_offerer * 1000 / offers,
                    "cpu_mesh_ms": cpu_mesh * 1000 / offers,
                    "claims_mean": sum(claims) / len(claims) if claims else 0.0,
                }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--offers", type=int, default=40)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--serve-mesh", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    quiet_logs()  # a log line per offer on the terminal would be measured too
    if args.serve_mesh is not None:
        trio.run(serve_mesh, args.serve_mesh)
        return
    figures = trio.run(bench, args.offers, args.nodes)
    cli = percentiles(bench_cli(ExecutorPolicy.from_env(), args.offers))
    print(f"offer → verified result, trivial Python task, {args.offers} offers per path, mesh of {args.nodes} nodes")
    print_figures(
        {
            "mesh, direct offer": figures["direct"]["p50_p95"],
            f"mesh, gossip offer ({args.nodes} nodes)": figures["gossip"]["p50_p95"],
            "docker run --rm": cli,
        }
    )
    for path in ("direct", "gossip"):
        f = figures[path]
        print(
            f"{path:<7} CPU per offer: offerer {f['cpu_offerer_ms']:.1f} ms, mesh process {f['cpu_mesh_ms']:.1f} ms"
            + (f"; claim requests per offer {f['claims_mean']:.1f}" if path == "gossip" else "")
        )
    direct_p50, gossip_p50 = figures["direct"]["p50_p95"][0], figures["gossip"]["p50_p95"][0]
    print(f"docker run --rm / direct p50: {cli[0] / direct_p50:.1f}x")
    print(f"target: direct p50 <= {DIRECT_TARGET_MS:g} ms: {direct_p50 <= DIRECT_TARGET_MS}")
    print(f"target: gossip p50 <= {GOSSIP_TARGET_MS:g} ms at {args.nodes} nodes: {gossip_p50 <= GOSSIP_TARGET_MS}")


if __name__ == "__main__":
    main()
