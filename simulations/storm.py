"""Offer storm: many offers from several offerers in a short time, runners competing for each one."""

from __future__ import annotations

from typing import Any

from simulations.cluster import Role, lineup
from simulations.progress import Progress
from simulations.report import Report
from simulations.scenario import Options, offerers, standard_sections, started
from simulations.workload import drive_offers, summarize

OFFERERS = 2  # the intake rate-limits each offerer (5/s, burst 20): a storm from one offerer would measure that


def roles(total: int, runners: int) -> list[Role]:
    listeners = max(0, total - runners - OFFERERS)
    return lineup(("runner", runners), ("listener", listeners), ("offerer", OFFERERS))


async def run(options: Options) -> tuple[Report, dict[str, Any]]:
    total = options.n(quick=6, full=12)
    runners = 2 if options.quick else 4
    count, rate = (8, 2.0) if options.quick else (60, 6.0)
    report = options.report("storm", f"Offer storm: {count} offers at {rate:g}/s over {total} nodes")
    async with started(roles(total, runners), seed=options.seed) as (cluster, instruments, formed):
        before = instruments.sends.snapshot()
        with Progress("storm", count) as bar:
            records = await drive_offers(cluster, offerers(cluster), count=count, rate=rate, timeout=60, progress=bar)
        sends = instruments.sends.snapshot()
        sends.subtract(before)
        figures = summarize(instruments, records, sends)
    figures["formed"] = formed
    report.text(
        f"{total} real nodes on loopback in one process: {runners} Docker runners (one warm container, one worker "
        f"each), {OFFERERS} offerers, and listeners (no sandbox, subscribed by the harness so they relay and "
        f"observe). Mesh formed before the storm: {formed}."
    )
    standard_sections(report, figures)
    return report, figures
