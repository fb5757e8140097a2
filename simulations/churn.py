"""Node churn: runners and listeners are killed mid-run and restarted (same identity, same port) later."""

from __future__ import annotations

from typing import Any

from simulations.cluster import SimNode, lineup
from simulations.progress import Progress
from simulations.report import Report
from simulations.scenario import Options, offerers, standard_sections, started
from simulations.workload import drive_offers, summarize


async def run(options: Options) -> tuple[Report, dict[str, Any]]:
    total = options.n(quick=7, full=12)
    runners = 3
    roles = lineup(("runner", runners), ("listener", total - runners - 1), ("offerer", 1))
    count, rate = (9, 1.5) if options.quick else (30, 2.0)
    report = options.report("churn", f"Churn: nodes killed and restarted during {count} offers")
    async with started(roles, seed=options.seed) as (cluster, instruments, formed):
        victims: list[SimNode] = cluster.of_role("runner")[:1] + cluster.of_role("listener")[:2]
        events: list[str] = []

        async def during(i: int) -> None:
            if i == count // 3:
                for sim in victims:
                    await cluster.kill(sim)
                events.append(f"killed {len(victims)} nodes before offer {i}")
            if i == 2 * count // 3:
                for sim in victims:
                    await cluster.restart(sim)
                events.append(f"restarted them before offer {i}")

        with Progress("churn", count) as bar:
            records = await drive_offers(
                cluster, offerers(cluster), count=count, rate=rate, timeout=60, progress=bar, during=during
            )
        figures = summarize(instruments, records, instruments.sends.snapshot())
        figures["restarted"] = sum(s.incarnations > 1 and s.alive for s in victims)
    report.text(
        f"{total} nodes ({runners} runners). Formed: {formed}. {'; '.join(events)}. Delivery counts the nodes "
        "subscribed when each offer was published; a node killed while the offer travelled counts as missed."
    )
    standard_sections(report, figures)
    return report, figures
