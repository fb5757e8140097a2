"""Docker becomes unavailable on some runners: they must withdraw, run nothing while withdrawn, and the mesh must
route the offers to the runners that still work; when Docker returns they rejoin by themselves."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from simulations.cluster import Cluster, lineup
from simulations.docker_relay import DockerRelay, open_relays, sweep_containers
from simulations.progress import Progress
from simulations.report import Report
from simulations.scenario import Options, offerers, quiet_logs, standard_sections
from simulations.workload import Instruments, drive_offers, summarize
from transports.wire.identity import peer_id_of

GATE_INTERVAL = 1.0  # a quick gate, so that the withdrawal shows within a couple of offers


async def run(options: Options) -> tuple[Report, dict[str, Any]]:
    quiet_logs()
    total = options.n(quick=6, full=12)
    runners = 4 if options.quick else 6
    cut = runners // 2
    count, rate = (8, 1.0) if options.quick else (30, 1.5)
    report = options.report("docker-outage", f"Docker cut on {cut} of {runners} runners mid-run")
    samples: list[tuple[float, str, bool, int]] = []  # time, peer, participating, runs so far
    with tempfile.TemporaryDirectory(prefix="edgecoder-relays-") as tmp:
        async with open_relays(Path(tmp), runners) as relays, trio.open_nursery() as outer:
            cluster = Cluster(outer, seed=options.seed, gate_interval=GATE_INTERVAL)
            instruments = Instruments()
            instruments.attach(cluster)
            for relay in relays:
                await cluster.add("runner", executor_options={"docker_base_url": relay.base_url})
            roles = lineup(("listener", total - runners - 1), ("offerer", 1))
            for role in roles:
                await cluster.add(role)
            formed = await cluster.wait_formed(timeout=60)
            victims = cluster.of_role("runner")[:cut]
            t0 = time.monotonic()

            async def sample() -> None:
                while True:
                    for sim in victims:
                        if sim.node is not None:
                            samples.append(
                                (time.monotonic() - t0, sim.peer_id, sim.node.gate.participating, len(sim.node.ran))
                            )
                    await trio.sleep(0.05)

            outer.start_soon(sample)
            events: list[tuple[float, str]] = []

            async def during(i: int) -> None:
                if i == count // 4:
                    for relay in relays[:cut]:
                        relay.cut()
                    events.append((time.monotonic() - t0, "Docker cut"))
                if i == 3 * count // 4:
                    for relay in relays[:cut]:
                        await relay.restore()
                    events.append((time.monotonic() - t0, "Docker restored"))

            with Progress("outage", count) as bar:
                records = await drive_offers(
                    cluster, offerers(cluster), count=count, rate=rate, timeout=60, progress=bar, during=during
                )
            await _wait_rejoined(cluster, victims, relays)
            figures = summarize(instruments, records, instruments.sends.snapshot())
            figures["rejoined"] = all(s.node is not None and s.node.gate.participating for s in victims)
            outer.cancel_scope.cancel()
    # While its relay was cut, a victim could not remove the containers it was starting, just as a node cannot
    # through a dead daemon. Its next start-up would sweep them by label; these nodes have no next start, so the
    # scenario sweeps them through the real daemon instead of leaving them on the machine.
    await trio.to_thread.run_sync(sweep_containers, [sim.peer_id for sim in victims])
    # Measured at the executor, not from `node.ran`: a run handed over just before the gate closed returns (Docker
    # failed it) after the gate closed, and `ran` records it then; what must never happen is code executing after.
    figures["runs_while_withdrawn"] = len(instruments.execs.executed_while_withdrawn())
    figures["attempts_while_withdrawn"] = sum(not a.participating for a in instruments.execs.attempts)
    victim_ids = {s.peer_id for s in victims}
    answers = [r.outcome.result for r in records if r.outcome is not None and r.outcome.result is not None]
    figures["answered_rate"] = len(answers) / len(records) if records else 0.0
    # A failed answer must come from a runner whose Docker was cut: the healthy ones run everything they claim.
    figures["failed_by_healthy"] = sum(
        1 for a in answers if not a.result.ok and peer_id_of(a.executor) not in victim_ids
    )
    figures["withdrawn_seconds"] = _withdrawn_seconds(samples, len(victims))
    report.text(
        f"{runners} runners, each talking to Docker through its own relay socket; the relays of {cut} are cut "
        f"at offer {count // 4} and restored at offer {3 * count // 4}. Formed: {formed}. Code executed on a node "
        f"while its gate was withdrawn: {figures['runs_while_withdrawn']} (offers handed to the executor while "
        f"withdrawn, which Docker failed before any code ran: {figures['attempts_while_withdrawn']}). Offers answered "
        f"with a verified result: {figures['answered_rate']:.2f}; failed answers from healthy runners: "
        f"{figures['failed_by_healthy']}. Time withdrawn per cut node: "
        f"{figures['withdrawn_seconds']:.1f} s. All rejoined: {figures['rejoined']}. Events: {events}."
    )
    standard_sections(report, figures)

    def draw(ax: Any) -> None:
        for i, sim in enumerate(victims):
            pts = [(t, p) for t, peer, p, _ in samples if peer == sim.peer_id]
            ax.step([t for t, _ in pts], [int(p) + i * 1.5 for _, p in pts], where="post", label=f"runner {i}")
        for t, what in events:
            ax.axvline(t, color="grey", ls="--")
            ax.text(t, 0.2, what, rotation=90, fontsize=7)
        ax.set_xlabel("time since the scenario started, s")
        ax.set_ylabel("participating: 0 or 1, one step per runner")

    report.figure("participation.png", "Gate participation of the runners whose Docker was cut", draw)
    return report, figures


async def _wait_rejoined(cluster: Cluster, victims: list[Any], relays: list[DockerRelay]) -> None:
    with trio.move_on_after(4 * GATE_INTERVAL + 10):
        while not all(s.node is not None and s.node.gate.participating for s in victims):
            await trio.sleep(0.1)


def _withdrawn_seconds(samples: list[tuple[float, str, bool, int]], nodes: int) -> float:
    if not samples or not nodes:
        return 0.0
    withdrawn = sum(1 for _, _, p, _ in samples if not p)
    return withdrawn * 0.05 / nodes
