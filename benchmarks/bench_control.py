"""CPU per claim exchange: a new stream per exchange (the one-exchange protocols) against the control stream.

    .venv/bin/python benchmarks/bench_control.py [--exchanges 200] [--rounds 5]

Two real hosts in one process on loopback (Noise, yamux), the server's desk granting every claim at once. Each round
runs `--exchanges` claims one after another both ways, interleaved (stream per exchange, then control stream, then
again), and the figure is the process CPU (both hosts: client and server sides) per exchange. The ratio is what the
control stream saves; wall time per exchange is printed too.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time

import structlog
import trio
from verdict import Verdict as BenchVerdict  # benchmarks/ is the script's directory

from transports.base import Admitted, Delivery, Verdict
from transports.direct import DirectTransport
from transports.p2p import open_host
from transports.wire.identity import NodeIdentity
from transports.wire.reasons import Rejection

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
OFFER_ID = b"\x07" * 16


class GrantAll:
    async def grant_claim(self, offer_id: bytes, claimant: str, status: dict[str, object] | None = None) -> None:
        return None

    async def accept_result(self, raw: bytes, sender: str) -> Rejection | None:
        return None


class NoOffers:
    participating = True

    async def deliver(self, delivery: Delivery) -> Verdict:
        return Admitted(b"\x00" * 16)


async def measure(client: DirectTransport, peer: str, exchanges: int) -> tuple[float, float]:
    """(CPU ms, wall ms) per exchange."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(exchanges):
        refusal = await client.request_claim(peer, OFFER_ID)
        assert refusal is None, refusal
    return (
        (time.process_time() - cpu) * 1000 / exchanges,
        (time.perf_counter() - wall) * 1000 / exchanges,
    )


async def main(exchanges: int, rounds: int) -> int:
    async with (
        open_host(NodeIdentity.generate(), [LOOPBACK]) as server,
        open_host(NodeIdentity.generate(), [LOOPBACK]) as client,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(DirectTransport(server, GrantAll()).run, NoOffers())
        per_stream = DirectTransport(client, GrantAll())  # not running: a stream per exchange
        controlled = DirectTransport(client, GrantAll())
        await nursery.start(controlled.run, NoOffers())
        peer = await client.connect(server.addrs[0])
        await measure(per_stream, peer, 20)  # warm both paths up (imports, the first stream, caches)
        await measure(controlled, peer, 20)
        results: dict[str, list[tuple[float, float]]] = {"stream per exchange": [], "control stream": []}
        for _ in range(rounds):
            results["stream per exchange"].append(await measure(per_stream, peer, exchanges))
            results["control stream"].append(await measure(controlled, peer, exchanges))
        print(f"{exchanges} claim exchanges x {rounds} interleaved rounds, both hosts in this process")
        medians = {}
        for name, samples in results.items():
            cpu = statistics.median(s[0] for s in samples)
            wall = statistics.median(s[1] for s in samples)
            medians[name] = cpu
            print(f"  {name:<20} CPU {cpu:6.2f} ms/exchange   wall {wall:6.2f} ms/exchange")
        ratio = medians["stream per exchange"] / medians["control stream"]
        print(f"  the control stream costs {ratio:.1f}x less CPU per exchange (opened {controlled.control.opened})")
        nursery.cancel_scope.cancel()
    # Every claim was granted (measure asserts it). No target: the ratio is what the control stream saves.
    verdict = BenchVerdict()
    verdict.require(controlled.control.opened >= 1, "the control stream was never opened: both rows were streams")
    return verdict.finish()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--exchanges", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    sys.exit(trio.run(main, args.exchanges, args.rounds))
