"""A BLE cluster over the simulated radio: several runners scan one radio on which nearby laptops advertise offers.

Each laptop (a bumble peripheral) grants one claim per offer, so however many runners see it, it runs once.
"""

from __future__ import annotations

import time
from typing import Any

import trio

from mesh.identity import NodeIdentity
from mesh.offers import TaskOffer
from simulations.cluster import Role
from simulations.progress import Progress
from simulations.report import Report
from simulations.scenario import Options, started
from simulations.stats import percentile, ratio
from simulations.workload import SHORT_TASK
from transports.ble.sim import open_simulated_radio


async def run(options: Options) -> tuple[Report, dict[str, Any]]:
    runners = options.n(quick=2, full=3)
    laptops = 3 if options.quick else 8
    report = options.report("ble", f"BLE cluster: {runners} runners, {laptops} offering laptops on one radio")
    latencies: list[float] = []
    roles: list[Role] = ["runner"] * runners
    async with started(roles, seed=options.seed) as (cluster, instruments, _):
        offers = []
        async with open_simulated_radio() as radio, trio.open_nursery() as nursery:
            for node in cluster.live("runner"):
                await nursery.start(node.run_ble, radio)
            with Progress("ble", laptops) as bar:

                async def laptop(i: int) -> None:
                    identity = NodeIdentity.generate()
                    offer = TaskOffer.create(identity, language="python", code=SHORT_TASK, input={"xs": [i]})
                    offers.append(offer.offer_id)
                    started_at = time.monotonic()
                    peer = await radio.add_offering_peer(identity, offer.sign(identity))
                    with trio.move_on_after(90):
                        await peer.wait_result()
                        latencies.append(time.monotonic() - started_at)
                    bar.advance()

                async with trio.open_nursery() as laptops_nursery:
                    for i in range(laptops):
                        laptops_nursery.start_soon(laptop, i)
            nursery.cancel_scope.cancel()
        runs = [instruments.runs_of(o) for o in offers]
    figures: dict[str, Any] = {
        "offers": laptops,
        "completion_rate": ratio(len(latencies), laptops),
        "duplicate_runs": sum(max(0, n - 1) for n in runs),
        "result_p50": percentile(latencies, 50),
        "result_p99": percentile(latencies, 99),
        "result_latencies": latencies,
    }
    report.table(
        ["figure", "value"],
        [
            ("offers (one per laptop)", laptops),
            ("completion rate", f"{figures['completion_rate']:.3f}"),
            ("duplicate runs", figures["duplicate_runs"]),
            ("advertise → verified result p50 / p99", f"{figures['result_p50']:.2f} s / {figures['result_p99']:.2f} s"),
        ],
    )
    if latencies:
        report.figure(
            "ble_result_latency.png",
            "BLE: advertising → verified result at the laptop, s",
            lambda ax: (ax.hist(latencies, bins=10), ax.set_xlabel("s"), ax.set_ylabel("offers")),
        )
    return report, figures
