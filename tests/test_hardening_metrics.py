"""Refusals at the frame and connection level reach the node's Prometheus registry, by reason, from zero."""

from __future__ import annotations

import re

from mesh.metrics import NodeMetrics
from tests.hardening_support import LOOPBACK, attacker_ip, idle_sockets, stock_host, try_dial_from
from tests.test_p2p_fakes import run_trio, wait_until
from transports.hardening import Defences, Refusal, Refusals
from transports.p2p import open_host
from transports.wire.identity import NodeIdentity


def refusals_in(metrics: NodeMetrics) -> dict[str, float]:
    text = metrics.exposition().decode()
    return {
        reason: float(value)
        for reason, value in re.findall(r'^edgecoder_connection_refusals_total\{reason="(\w+)"\} (\S+)$', text, re.M)
    }


def test_every_reason_is_exposed_at_zero_before_anything_is_refused() -> None:
    assert refusals_in(NodeMetrics()) == {str(reason): 0.0 for reason in Refusal}


def test_a_node_wired_to_its_metrics_counts_the_refusals_of_an_attack() -> None:
    async def main() -> None:
        metrics = NodeMetrics()
        per_source = Defences().admission.max_per_source
        async with open_host(NodeIdentity.generate(), [LOOPBACK], on_refusal=metrics.connection_refused) as node:
            async with idle_sockets(node.host, [attacker_ip(0)] * (per_source + 5)):
                await wait_until(lambda: refusals_in(metrics)["source_concurrency"] == 5)
                async with stock_host(listen=()) as honest:
                    assert await try_dial_from(honest, "127.0.0.1", node.addrs[0])
            counted = refusals_in(metrics)
            assert counted.pop("source_concurrency") == 5
            assert set(counted.values()) == {0.0}

    run_trio(main)


def test_a_failing_sink_never_breaks_the_guard_that_reports_to_it() -> None:
    def broken(reason: Refusal) -> None:
        raise RuntimeError("the registry is gone")

    refusals = Refusals(broken)
    refusals(Refusal.STREAM_CAP)
    refusals(Refusal.STREAM_CAP)
    assert refusals.counts == {Refusal.STREAM_CAP: 2}
