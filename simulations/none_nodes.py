"""A share of SANDBOX_MODE=none nodes: they stay in the mesh and forward offers like any node, but their intake
never sees one, and they claim and run nothing."""

from __future__ import annotations

from typing import Any

from simulations.cluster import lineup
from simulations.progress import Progress
from simulations.report import Report
from simulations.scenario import Options, offerers, standard_sections, started
from simulations.workload import drive_offers, summarize


async def run(options: Options) -> tuple[Report, dict[str, Any]]:
    total = options.n(quick=6, full=12)
    refusers = total // 2
    runners = max(1, total - refusers - 1)
    count, rate = (4, 1.0) if options.quick else (20, 2.0)
    roles = lineup(("runner", runners), ("refuser", refusers), ("offerer", 1))
    report = options.report("none-nodes", f"{refusers} of {total} nodes with SANDBOX_MODE=none")
    async with started(roles, seed=options.seed) as (cluster, instruments, formed):
        with Progress("none-nodes", count) as bar:
            records = await drive_offers(cluster, offerers(cluster), count=count, rate=rate, timeout=60, progress=bar)
        figures = summarize(instruments, records, instruments.sends.snapshot())
        none_nodes = cluster.live("refuser")
        figures["none_ran"] = sum(len(n.ran) for n in none_nodes)
        figures["none_admitted"] = sum(sum(n.intake.admitted.values()) for n in none_nodes)
        figures["none_intake_calls"] = sum(
            sum(n.intake.admitted.values()) + sum(n.intake.rejected.values()) for n in none_nodes
        )
        figures["none_claims"] = sum(
            n.metrics.claims.labels(outcome)._value.get() for n in none_nodes for outcome in ("granted", "refused")
        )
        figures["none_forwarded"] = sum(n.gossip.stats["offer_forwarded_not_taken"] for n in none_nodes)
        offerer = offerers(cluster)[0]
        figures["none_seen_as_none"] = sum(offerer.peers.sandbox_mode(n.peer_id) == "none" for n in none_nodes)
    report.text(
        f"{runners} Docker runners, {refusers} plain `SANDBOX_MODE=none` nodes (started as an operator would) and one "
        f"offerer. Formed: {formed}. The none nodes ran {figures['none_ran']} offers, admitted "
        f"{figures['none_admitted']}, asked for {figures['none_claims']:.0f} claims, and forwarded offers they did not "
        f"take {figures['none_forwarded']} times; "
        f"{figures['none_seen_as_none']} of {refusers} were seen by the offerer's heartbeats as `sandboxMode: none`."
    )
    standard_sections(report, figures)
    return report, figures
