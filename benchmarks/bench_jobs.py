"""Jobs people can follow and stop (issue 23), measured side by side in one run on real nodes and real Docker.

    .venv/bin/python benchmarks/bench_jobs.py [--runs 10]

One runner node (`sandbox_mode="docker"`, a one-container warm pool) and one offerer node share this process, on
loopback; every offer is the whole product path (sign, direct stream over Noise and yamux, intake, a warm container,
the signed result, its verification). The pool is refilled between runs, so each is measured in steady state.

- cancel: a program prints a line and sleeps; once its line has reached the runner, the offerer sends its signed
  cancel. Measured: cancel sent -> signed `aborted` answer (the container is dead by then: Docker is asked), and
  cancel sent -> the container gone from Docker.
- follow: a program prints a line, sleeps 300 ms, prints another and ends. Measured: offer -> first streamed chunk,
  against offer -> verified result.
- stream cost: `print(6)`, offer -> verified result with and without `follow` (target: the stream costs at most
  10% of the p50).

Retries after a runner dies are not measured: the offerer does not re-offer yet (docs/jobs.md, "Not yet").
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

import docker
import docker.errors
import structlog
import trio
from cli_baseline import percentiles, print_figures  # benchmarks/ is on sys.path
from verdict import Verdict

from executor.contract import ErrorKind, Limits
from executor.policy import ExecutorPolicy
from mesh.node import MeshNode, NodeConfig
from transports.wire.identity import NodeIdentity
from transports.wire.offers import parse_offer

TALKER = "import time\nprint('started', flush=True)\ntime.sleep(60)\n"
TWO_LINES = "import time\nprint('one', flush=True)\ntime.sleep(0.3)\nprint('two')\n"
QUICK = "print(6)\n"


def quiet() -> None:
    logging.disable(logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))


async def steady(node: MeshNode) -> None:
    assert node.executor is not None
    while (stats := node.executor.stats()).pool_ready < stats.pool_size or stats.pending_removals:
        await trio.sleep(0.02)


def gone(api: docker.APIClient, container_id: str) -> bool:
    try:
        api.inspect_container(container_id)
        return False
    except docker.errors.NotFound:
        return True


def running(api: docker.APIClient, container_id: str) -> bool:
    try:
        return bool(api.inspect_container(container_id)["State"]["Running"])
    except docker.errors.NotFound:
        return False


async def bench(runs: int) -> dict[str, Any]:
    api = docker.APIClient(timeout=30)
    policy = ExecutorPolicy(pool_size=1, max_concurrent=2)
    runner_config = NodeConfig(identity=NodeIdentity.generate(), executor_policy=policy, gate_interval=3600)
    async with MeshNode.open(runner_config) as runner:
        offerer_config = NodeConfig(identity=NodeIdentity.generate(), sandbox_mode="none", peers=runner.addrs[:1])
        async with MeshNode.open(offerer_config) as offerer:
            to = runner.addrs[0]
            cancel_answer: list[float] = []
            cancel_gone: list[float] = []
            for _ in range(runs):
                await steady(runner)
                raw = offerer.make_offer(
                    to=runner.peer_id, language="python", code=TALKER, limits=Limits(timeout_ms=30_000)
                )
                oid = parse_offer(raw).offer.offer_id
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(offerer.offer_direct, to, raw)
                    while (job := runner.intake.pending_job(oid)) is None or job.stream is None or not job.stream.bytes:
                        await trio.sleep(0.005)
                    container = job.control.container_id
                    assert container is not None
                    sent = trio.current_time()
                    outcome = await offerer.cancel(runner.peer_id, oid)
                    answered = trio.current_time()
                    assert outcome.result is not None and outcome.result.result.error_kind is ErrorKind.ABORTED
                    assert not running(api, container), "the container still ran when the cancel was answered"
                    while not gone(api, container):
                        await trio.sleep(0.01)
                    cancel_answer.append(answered - sent)
                    cancel_gone.append(trio.current_time() - sent)
            first_chunk: list[float] = []
            followed_total: list[float] = []
            for _ in range(runs):
                await steady(runner)
                raw = offerer.make_offer(to=runner.peer_id, language="python", code=TWO_LINES, follow=True)
                started = trio.current_time()
                firsts: list[float] = []

                def seen(_chunk: Any, firsts: list[float] = firsts) -> None:
                    if not firsts:
                        firsts.append(trio.current_time())

                outcome = await offerer.offer_direct(to, raw, on_output=seen)
                assert outcome.ok and outcome.stream_verified, outcome
                first_chunk.append(firsts[0] - started)
                followed_total.append(trio.current_time() - started)
            plain: list[float] = []
            streamed: list[float] = []
            for i in range(2 * runs):
                await steady(runner)
                follow = i % 2 == 1  # interleaved, so that load on the machine falls on both alike
                raw = offerer.make_offer(to=runner.peer_id, language="python", code=QUICK, follow=follow)
                started = trio.current_time()
                outcome = await offerer.offer_direct(to, raw, on_output=(lambda _c: None) if follow else None)
                assert outcome.ok and (not follow or outcome.stream_verified), outcome
                (streamed if follow else plain).append(trio.current_time() - started)
    api.close()
    figures = {
        "cancel -> signed aborted answer (container dead)": percentiles(cancel_answer),
        "cancel -> container gone from Docker": percentiles(cancel_gone),
        "follow: offer -> first streamed chunk": percentiles(first_chunk),
        "follow: offer -> verified result (0.3 s program)": percentiles(followed_total),
        "print(6) offer -> result, no stream": percentiles(plain),
        "print(6) offer -> result, followed": percentiles(streamed),
    }
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    quiet()
    figures = trio.run(bench, args.runs)
    print_figures(figures)
    plain = figures["print(6) offer -> result, no stream"][0]
    followed = figures["print(6) offer -> result, followed"][0]
    verdict = Verdict()
    verdict.target("the live stream's cost at the p50", (followed - plain) / plain * 100, at_most=10, unit="%")
    # The "within 1 s": cancel sent to the signed answer, by which time the container is dead.
    verdict.target(
        "cancel -> container dead, p50",
        figures["cancel -> signed aborted answer (container dead)"][0],
        at_most=1000,
        unit=" ms",
    )
    return verdict.finish()


if __name__ == "__main__":
    sys.exit(main())
