"""Real `edgecoder node` processes on separate hosts (network namespaces) across a router: the scenarios of issue 12
that today's code passes. Each prints its time to connect and to answer each offer (`pytest -s`), and writes them to
a JSON file under /tmp/edgecoder-netns-timings.

Today's node announces its `--listen` address verbatim, so each node listens on its own host's address (never
0.0.0.0), and peers are wired with `--peer`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import containers_of
from tests.netns import Host, NodeProcess, OfferRun, Timings, Topology, make_key, run_offer
from tests.netns.fixtures import topology

pytestmark = [pytest.mark.netns, pytest.mark.docker, pytest.mark.slow]


@pytest.fixture
def net(docker_api: Any) -> Iterator[Topology]:
    with topology() as built:
        yield built


@dataclass
class Mesh:
    """Three subnets joined by one router: node A on lan1, node B on lan2 (`--peer` A), an offerer's host on lan3."""

    a: NodeProcess
    b: NodeProcess
    offerer: Host
    offerer_key: Path

    @property
    def nodes(self) -> list[NodeProcess]:
        return [self.a, self.b]


def three_subnets(net: Topology, tmp_path: Path, timings: Timings, *, loss: float | None = None) -> Mesh:
    lans = [net.lan(f"lan{i}", f"10.77.{i}.0/24") for i in (1, 2, 3)]
    router = net.router("r", lans)
    if loss is not None:  # before any node starts: the connections themselves form under loss
        router.add_loss(loss)
    hosts = [net.host(name, lan) for name, lan in zip(("a", "b", "o"), lans, strict=True)]
    a = NodeProcess(hosts[0], make_key(tmp_path / "a.key"), log_path=tmp_path / "a.log", name="A")
    b = NodeProcess(
        hosts[1], make_key(tmp_path / "b.key"), "--peer", a.addr, log_path=tmp_path / "b.log", name="B", wait=False
    )
    tcp_up = b.wait_connected(hosts[0])
    b.wait_ready()
    assert a.addr.startswith(f"/ip4/{hosts[0].address}/tcp/") and b.addr.startswith(f"/ip4/{hosts[1].address}/tcp/")
    assert b.connected_to(hosts[0])
    timings.record("A start -> ready (no dial)", a.ready_after_s)
    timings.record("B start -> TCP connection to A up (polled /10 ms)", tcp_up - b.started_at)
    timings.record("B TCP up -> B ready (libp2p upgrade, end of start)", b.ready.at - tcp_up)
    timings.record("B start -> ready (today it dials --peer first)", b.ready_after_s)
    return Mesh(a, b, hosts[2], make_key(tmp_path / "offerer.key"))


def answered_by(nodes: list[NodeProcess]) -> list[tuple[str, dict[str, Any]]]:
    """Every "offer answered" record of every node, with the node's name."""
    return [(node.name, record) for node in nodes for record in node.answered()]


def claims(nodes: list[NodeProcess]) -> dict[str, dict[str, float]]:
    """Claims each node asked the offerer for, by outcome (refused includes an offerer it could not reach)."""
    return {
        node.name: {
            outcome: node.metric("edgecoder_claims_total", outcome=outcome) for outcome in ("granted", "refused")
        }
        for node in nodes
    }


def stop_all(nodes: list[NodeProcess], docker_api: Any) -> None:
    """SIGTERM and wait: the logs are complete only once the nodes have drained and exited, and nothing is left
    on the daemon."""
    for node in nodes:
        assert node.stop() == 0, node.failure("did not exit 0 on SIGTERM")
        assert containers_of(docker_api, node.peer_id) == []


def expect_ok(run: OfferRun, stdout: str) -> dict[str, Any]:
    assert run.returncode == 0, run.describe()
    assert run.result is not None and run.result["ok"] is True and run.result["stdout"] == stdout, run.describe()
    return run.result


def record_answer(timings: Timings, what: str, run: OfferRun, record: dict[str, Any], runner: str) -> None:
    timings.record(
        what, run.elapsed_s, runner=runner, run_ms=record.get("duration_ms"), queued_ms=record.get("waited_ms")
    )


def test_a_gossip_offer_from_a_third_subnet_runs_exactly_once(
    net: Topology, tmp_path: Path, timings: Timings, code: Path, docker_api: Any
) -> None:
    """The offerer joins through A alone; the offer reaches both nodes (B through A) and runs once."""
    mesh = three_subnets(net, tmp_path, timings)
    run = run_offer(
        mesh.offerer, mesh.offerer_key, code, "--gossip", "--peer", mesh.a.addr, input_json='{"xs": [20, 22]}'
    )
    result = expect_ok(run, "42\n")
    heard = {node.name: node.metric("edgecoder_offers_admitted_total", transport="gossip") for node in mesh.nodes}
    assert heard == {"A": 1.0, "B": 1.0}, heard  # B heard it across the router, through A's mesh
    granted = claims(mesh.nodes)
    assert sum(c["granted"] for c in granted.values()) == 1, granted
    stop_all(mesh.nodes, docker_api)
    answers = answered_by(mesh.nodes)
    assert len(answers) == 1, answers  # one answer in the whole mesh, and none after the first
    runner, record = answers[0]
    assert record["offer"] == result["offerId"] and record["transport"] == "gossip" and record["ok"] is True
    record_answer(timings, "gossip offer: offerer start -> verified result", run, record, runner)


def test_ten_gossip_offers_under_five_percent_loss_each_run_exactly_once(
    net: Topology, tmp_path: Path, timings: Timings, code: Path, docker_api: Any
) -> None:
    """Every packet crossing the router (every packet between the three hosts) is dropped with p = 0.05, from
    before the nodes start. The offerer joins through both nodes, so both can claim every offer: each claim is
    contested, and each offer must still run on exactly one node."""
    mesh = three_subnets(net, tmp_path, timings, loss=0.05)
    peers = ["--peer", mesh.a.addr, "--peer", mesh.b.addr]
    runs: list[tuple[OfferRun, str]] = []
    for i in range(10):
        run = run_offer(mesh.offerer, mesh.offerer_key, code, "--gossip", *peers, input_json=f'{{"xs": [{i}, 100]}}')
        result = expect_ok(run, f"{100 + i}\n")
        assert "re-offering" not in run.stderr, run.describe()  # no claim lapsed, so no second id for the same work
        runs.append((run, str(result["offerId"])))
    granted = claims(mesh.nodes)
    assert sum(c["granted"] for c in granted.values()) == 10, granted
    timings.note(f"claims by node: {granted}")
    stop_all(mesh.nodes, docker_api)
    answers = answered_by(mesh.nodes)
    per_offer = Counter(record["offer"] for _, record in answers)
    assert per_offer == Counter(offer_id for _, offer_id in runs), per_offer  # each of the ten answered once
    assert all(record["ok"] and record["transport"] == "gossip" for _, record in answers), answers
    by_offer = {record["offer"]: (runner, record) for runner, record in answers}
    for i, (run, offer_id) in enumerate(runs):
        runner, record = by_offer[offer_id]
        record_answer(timings, f"offer {i + 1}/10 under 5% loss: start -> result", run, record, runner)


def test_a_direct_offer_crosses_the_router(
    net: Topology, tmp_path: Path, timings: Timings, code: Path, docker_api: Any
) -> None:
    mesh = three_subnets(net, tmp_path, timings)
    run = run_offer(mesh.offerer, mesh.offerer_key, code, "--to", mesh.b.addr, input_json='{"xs": [1, 2, 3]}')
    result = expect_ok(run, "6\n")
    stop_all(mesh.nodes, docker_api)
    assert mesh.a.answered() == []
    (record,) = mesh.b.answered()
    assert record["offer"] == result["offerId"] and record["transport"] == "direct" and record["ok"], record
    record_answer(timings, "direct offer --to B: offerer start -> verified result", run, record, "B")
