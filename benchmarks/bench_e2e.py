"""Offer → verified result over a direct libp2p stream on loopback, against `docker run --rm` with the same task.

    .venv/bin/python benchmarks/bench_e2e.py [--offers 40]

The mesh path is the whole product path: the offerer signs an offer, opens a direct stream (Noise, yamux) to a
`sandbox_mode="docker"` node, whose intake verifies it, whose worker runs it in a warm pooled container, signs the
result and writes it back; the offerer verifies the signature and the offer digest. Measured in steady state
between offers (the pool refilled, the previous container removed), as `bench_executor.py` does.

The baseline runs the same trivial task through the docker CLI with the flags `executor/container_config.py` sets
(derived from it below, so they cannot drift). Only benchmarks shell out to the CLI; product code never does.
"""

from __future__ import annotations

import argparse
import logging
import time

import structlog
import trio
from cli_baseline import (  # benchmarks/ is the script's directory
    CODE,
    EXPECTED,
    INPUT,
    bench_cli,
    percentiles,
    print_figures,
)

from executor.contract import Limits
from executor.policy import ExecutorPolicy
from mesh.identity import NodeIdentity
from mesh.node import MeshNode, NodeConfig

TARGET_P50_MS = 60.0


def quiet_logs() -> None:
    logging.getLogger().setLevel(logging.ERROR)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


async def bench_mesh(offers: int) -> tuple[list[float], float]:
    """Seconds per offer (after the first), and the first offer's (it also dials and sets up the connection)."""
    loopback = ["/ip4/127.0.0.1/tcp/0"]
    runner_config = NodeConfig(identity=NodeIdentity.generate(), listen=loopback, sandbox_mode="docker")
    offerer_config = NodeConfig(identity=NodeIdentity.generate(), listen=loopback, sandbox_mode="none")
    samples: list[float] = []
    async with MeshNode.open(runner_config) as runner, MeshNode.open(offerer_config) as offerer:
        executor = runner.executor
        assert executor is not None
        first = 0.0
        for i in range(offers + 1):
            with trio.fail_after(30):
                # Steady state between offers, and under the intake's per-offerer rate (5/s): not what we measure.
                while executor.stats().pool_ready < executor.stats().pool_size or executor.stats().pending_removals:
                    await trio.sleep(0.01)
                await trio.sleep(0.2)
            raw = offerer.make_offer(
                to=runner.peer_id, language="python", code=CODE, input=INPUT, limits=Limits(timeout_ms=5000)
            )
            began = time.perf_counter()
            outcome = await offerer.offer_direct(runner.addrs[0], raw)
            elapsed = time.perf_counter() - began
            assert outcome.result is not None and outcome.ok, outcome
            assert outcome.result.result.stdout == EXPECTED, outcome.result.result
            if i == 0:
                first = elapsed
            else:
                samples.append(elapsed)
    return samples, first


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--offers", type=int, default=40)
    args = parser.parse_args()
    quiet_logs()  # a log line per offer on the terminal would be measured too
    mesh, first = trio.run(bench_mesh, args.offers)
    cli = bench_cli(ExecutorPolicy.from_env(), args.offers)
    figures = {"mesh, direct, warm pool": percentiles(mesh), "docker run --rm": percentiles(cli)}
    print(f"offer → verified result, trivial Python task, {args.offers} offers each (steady state)")
    print_figures(figures)
    mesh_p50 = figures["mesh, direct, warm pool"][0]
    print(f"first offer (dial, Noise and yamux set-up included): {first * 1000:.1f} ms")
    print(f"CLI / mesh p50: {figures['docker run --rm'][0] / mesh_p50:.1f}x")
    print(f"target: mesh p50 <= {TARGET_P50_MS:g} ms: {mesh_p50 <= TARGET_P50_MS}")


if __name__ == "__main__":
    main()
