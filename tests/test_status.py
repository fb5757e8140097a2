"""`/status`, `/healthz` and `/metrics` of real nodes, and the CLI that reads them.

The nodes here run with `sandbox_mode="none"` unless marked docker: status, peers and health need no sandbox.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from mesh.metrics_server import serve_metrics
from mesh.node import MeshNode, NodeConfig
from mesh.status import health, node_status
from transports.wire.identity import NodeIdentity
from transports.wire.reasons import WIRE_REFUSALS

CLI = [sys.executable, "-m", "mesh.cli"]


@contextlib.asynccontextmanager
async def served(node: MeshNode) -> AsyncIterator[str]:
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(
            partial(serve_metrics, node.metrics, 0, status=lambda: node_status(node), health=lambda: health(node))
        )
        yield urls[0]
        nursery.cancel_scope.cancel()


async def get(url: str) -> httpx.Response:
    async with httpx.AsyncClient() as client:
        return await client.get(url, timeout=10)


async def test_status_names_peers_with_direction_and_health_says_why_not() -> None:
    first_config = NodeConfig(identity=NodeIdentity.generate(), sandbox_mode="none", heartbeat_interval=0.5)
    async with MeshNode.open(first_config) as first:
        second_config = NodeConfig(
            identity=NodeIdentity.generate(), peers=first.addrs[:1], sandbox_mode="none", heartbeat_interval=0.5
        )
        async with MeshNode.open(second_config) as second, served(first) as url:
            with trio.fail_after(15):
                while second.peer_id not in {h.peer_id for h in first.peers.fresh()}:
                    await trio.sleep(0.05)
            status = (await get(f"{url}/status")).json()
            assert status["peerId"] == first.peer_id and status["addrs"] == first.addrs
            assert status["sandboxMode"] == "none" and status["participating"] is False
            assert status["queueDepth"] == 0 and status["runsInFlight"] == 0 and status["jobs"] == []
            (peer,) = status["peers"]
            assert peer["peerId"] == second.peer_id and peer["connected"] is True
            assert peer["direction"] == "inbound" and peer["relayed"] is False  # the second node dialled us
            assert peer["sandboxMode"] == "none" and peer["addrs"] == second.addrs
            (theirs,) = node_status(second)["peers"]
            assert theirs["peerId"] == first.peer_id and theirs["direction"] == "outbound"

            healthz = await get(f"{url}/healthz")
            assert healthz.status_code == 503 and healthz.json() == {"ok": False, "reason": "sandbox_mode_none"}
            first.intake.close()
            assert (await get(f"{url}/healthz")).json()["reason"] == "shutting_down"


async def test_every_labelled_metric_exists_at_zero_on_a_fresh_node() -> None:
    config = NodeConfig(identity=NodeIdentity.generate(), sandbox_mode="none")
    async with MeshNode.open(config) as node, served(node) as url:
        text = (await get(f"{url}/metrics")).text
    for transport in ("gossip", "direct", "ble", "coordinator"):
        assert f'edgecoder_offers_admitted_total{{transport="{transport}"}} 0.0' in text
        for reason in WIRE_REFUSALS:
            assert f'edgecoder_offers_rejected_total{{reason="{reason}",transport="{transport}"}} 0.0' in text
    assert 'edgecoder_results_total{error_kind="none",queue_reason="none"} 0.0' in text
    assert 'edgecoder_results_total{error_kind="timeout",queue_reason="timeout"} 0.0' in text
    assert 'edgecoder_claims_total{outcome="granted"} 0.0' in text
    assert "edgecoder_fallbacks_total 0.0" in text and "edgecoder_queue_depth 0.0" in text
    # Prometheus naming: counters end in _total, the one duration is in seconds, no name carries a unit it lacks.
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    for name in names:
        kind = next(line.split()[3] for line in text.splitlines() if line.startswith(f"# TYPE {name} "))
        assert name.startswith("edgecoder_")
        if kind == "counter":
            assert name.endswith("_total")
        if kind == "histogram":
            assert name.endswith("_seconds")


async def test_a_port_in_use_is_one_line_before_started() -> None:
    from mesh.metrics import NodeMetrics
    from mesh.metrics_server import MetricsBindError

    async with trio.open_nursery() as nursery:
        urls = await nursery.start(partial(serve_metrics, NodeMetrics(), 0))
        port = int(urls[0].rsplit(":", 1)[1])
        with pytest.raises(MetricsBindError, match=f"127.0.0.1:{port}: the port is already in use"):
            await nursery.start(partial(serve_metrics, NodeMetrics(), port))
        nursery.cancel_scope.cancel()


@pytest.mark.docker
async def test_a_sandboxed_node_is_healthy_and_lists_the_job_it_ran() -> None:
    from tests.docker_support import sandbox_policy, wait_pool_ready

    config = NodeConfig(identity=NodeIdentity.generate(), executor_policy=sandbox_policy())
    offerer_config = NodeConfig(identity=NodeIdentity.generate(), sandbox_mode="none")
    async with MeshNode.open(config) as node, MeshNode.open(offerer_config) as offerer, served(node) as url:
        assert node.executor is not None
        await wait_pool_ready(node.executor)
        assert (await get(f"{url}/healthz")).json() == {"ok": True, "reason": "ready"}
        raw = offerer.make_offer(to=node.peer_id, language="python", code="print(6 * 7)")
        outcome = await offerer.offer_direct(node.addrs[0], raw)
        assert outcome.ok
        (job,) = (await get(f"{url}/status")).json()["jobs"]
        assert job["offerer"] == offerer.peer_id and job["transport"] == "direct"
        assert job["state"] == "answered" and job["ok"] is True and job["durationMs"] >= 0


# -- the CLI, against a real node process ------------------------------------------------------------------------


def test_status_peers_and_jobs_read_a_running_node(tmp_path: Path) -> None:
    key = tmp_path / "node.key"
    NodeIdentity.generate().save(key)
    state = str(tmp_path / "state")
    with subprocess.Popen(
        [*CLI, "node", "--key", str(key), "--sandbox-mode", "none", "--metrics-port", "0", "--state-dir", state],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as node:  # leaving `with` closes our end of its stdout
        try:
            assert node.stdout is not None
            ready: dict[str, Any] = json.loads(node.stdout.readline())
            port = ready["metricsPort"]  # --metrics-port 0: the ready line says which port was bound
            assert port > 0 and ready["metrics"] == f"http://127.0.0.1:{port}"

            def edgecoder(*args: str) -> subprocess.CompletedProcess[str]:
                return subprocess.run([*CLI, *args, "--metrics", f"127.0.0.1:{port}"], capture_output=True, text=True)

            text = edgecoder("status")
            assert text.returncode == 0 and ready["peerId"] in text.stdout and "does NOT take part" in text.stdout
            as_json = json.loads(edgecoder("status", "--json").stdout)
            assert as_json["peerId"] == ready["peerId"] and as_json["reason"] == "sandbox_mode_none"
            assert "has no peers" in edgecoder("peers").stdout
            assert json.loads(edgecoder("peers", "--json").stdout) == {"peerId": ready["peerId"], "peers": []}
            assert "no job taken yet" in edgecoder("jobs").stdout
            assert json.loads(edgecoder("jobs", "--json").stdout)["jobs"] == []
        finally:
            node.terminate()
            assert node.wait(timeout=30) == 0
