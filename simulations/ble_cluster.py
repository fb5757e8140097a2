"""A BLE cluster over the simulated radio: several runners scan one radio on which nearby laptops advertise offers.

Each laptop (a bumble peripheral) grants one claim per offer, so however many runners see it, it runs once.

The virtual radio has no timing of its own, so its latencies say nothing about a real radio. The report therefore
also gives, per link preset (`transports.ble.timing`: iOS, Android, Linux defaults), the model's time for the offers
and results actually exchanged, and the time measured when the same radio is paced by that preset (`LinkPacer`),
side by side.
"""

from __future__ import annotations

import time
from typing import Any

import trio

from simulations.cluster import Role
from simulations.progress import Progress
from simulations.report import Report
from simulations.scenario import Options, started
from simulations.stats import percentile, ratio
from simulations.workload import SHORT_TASK
from transports.ble.sim import open_simulated_radio
from transports.ble.timing import PRESETS, LinkProfile, offer_timing
from transports.wire.identity import NodeIdentity
from transports.wire.offers import TaskOffer


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
        paced = [await _paced_offer(cluster.live("runner"), profile) for profile in PRESETS.values()]
    figures: dict[str, Any] = {
        "offers": laptops,
        "completion_rate": ratio(len(latencies), laptops),
        "duplicate_runs": sum(max(0, n - 1) for n in runs),
        "result_p50": percentile(latencies, 50),
        "result_p99": percentile(latencies, 99),
        "result_latencies": latencies,
        "paced": paced,
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
    report.text(
        "Under the timing model: one offer of the same workload per link preset, on the virtual radio paced as that "
        "link would be (`LinkPacer`: MTU, connection interval, packets per event), beside what the model computes "
        "for the same offer and result sizes plus the run's own duration. Set-up covers discovery, GATT reads and "
        "subscriptions; docs/ble.md has the per-size table."
    )
    report.table(
        ["preset", "offer B", "result B", "model: to offer at node", "model: total + run", "measured (paced)"],
        [
            (
                p["preset"],
                p["offer_bytes"],
                p["result_bytes"],
                f"{p['model_to_offer_s']:.2f} s",
                f"{p['model_total_s']:.2f} s",
                f"{p['measured_s']:.2f} s" if p["measured_s"] is not None else "no result",
            )
            for p in paced
        ],
    )
    if latencies:
        report.figure(
            "ble_result_latency.png",
            "BLE: advertising → verified result at the laptop, s",
            lambda ax: (
                ax.hist(latencies, bins=10),
                ax.set_xlabel("advertising to verified result, s"),
                ax.set_ylabel("offers"),
            ),
            counted_y=True,
        )
    return report, figures


async def _paced_offer(runners: list[Any], profile: LinkProfile) -> dict[str, Any]:
    """One laptop offer on a radio paced as `profile`, taken by the runners: measured time beside the model's."""
    identity = NodeIdentity.generate()
    offer = TaskOffer.create(identity, language="python", code=SHORT_TASK, input={"xs": [1, 2]})
    raw = offer.sign(identity)
    measured: float | None = None
    result_bytes, run_s = 0, 0.0
    async with open_simulated_radio(link_model=profile) as radio, trio.open_nursery() as nursery:
        for node in runners:
            await nursery.start(node.run_ble, radio)
        started_at = time.monotonic()
        peer = await radio.add_offering_peer(identity, raw)
        with trio.move_on_after(120):
            result = await peer.wait_result()
            measured = time.monotonic() - started_at
            result_bytes = len(peer.peripheral.server.result_raw or b"")
            run_s = result.result.duration_ms / 1000
        nursery.cancel_scope.cancel()
    model = offer_timing(len(raw), result_bytes, profile)
    return {
        "preset": profile.name,
        "offer_bytes": len(raw),
        "result_bytes": result_bytes,
        "model_to_offer_s": model.to_offer,
        "model_total_s": model.total + run_s,
        "measured_s": measured,
    }
