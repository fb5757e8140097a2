"""A Sybil flood against a real `edgecoder node` process, over real connections: honest offers still get served.

The node runs as a process of its own (two workers, Docker). The attacker is 48 libp2p hosts in this process, each with
a connection of its own, that keep 48 offers in flight from 300 fresh offerer keys in turn, each host sending its next
offer as soon as the node's retry hint allows. (One connection that ignores the hint is held off and then banned by
`transports.hardening.holdoff`, tests/test_hardening_holdoff.py: only a swarm of peers that each wait as told gets to
hold the queue.) The honest offerer is a `MeshNode` the node trusts (`--trusted-offerer`, the operator's list; a regular
offerer is established the same way after ten minutes of use).

First the finding, reproduced: with `--fresh-share 1` (fresh keys may take the whole queue, as every offerer could
before the classes) the swarm fills the queue and the honest offers are refused `busy`. Then the defaults: the swarm
fills only the fresh share, and every honest offer gets its verified result.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from mesh.node import MeshNode, NodeConfig
from tests.hardening_support import polite_swarm
from transports.wire.identity import NodeIdentity
from transports.wire.reasons import Reason

pytestmark = pytest.mark.docker

SYBIL_KEYS = 300
PEERS = 48  # offers in flight: one per peer
# The swarm's work holds a worker for three seconds: long enough that the queue stays full between its runs (a place
# a run frees stays free only until one of the swarm's waiting peers' retry hints runs out, some tens of ms).
SYBIL_CODE = "import time\ntime.sleep(3)\nprint(1)"
HONEST_OFFERS = 5


@asynccontextmanager
async def node_process(tmp_path: Path, honest: NodeIdentity, *options: str) -> AsyncIterator[dict[str, Any]]:
    key = tmp_path / "node.key"
    NodeIdentity.generate().save(key)
    command = [sys.executable, "-m", "mesh.cli", "node", "--key", str(key), "--listen", "/ip4/127.0.0.1/tcp/0"]
    command += ["--metrics-port", "0", "--state-dir", str(tmp_path / "state"), "--concurrency", "2"]
    command += ["--trusted-offerer", honest.peer_id, *options]
    log = open(tmp_path / "node.log", "wb")  # noqa: SIM115 (the process holds it; closed below)
    process = await trio.lowlevel.open_process(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
    assert process.stdout is not None
    try:
        line = b""
        with trio.fail_after(60):
            while not line.endswith(b"\n"):
                line += await process.stdout.receive_some(1)
        ready = json.loads(line)
        assert ready["event"] == "ready" and ready["sandboxMode"] == "docker", ready
        yield ready
    finally:
        process.terminate()
        with trio.CancelScope(shield=True), trio.move_on_after(30):
            await process.wait()
        if process.returncode is None:
            process.kill()
        log.close()


async def status(ready: dict[str, Any]) -> dict[str, Any]:
    async with httpx.AsyncClient() as client:
        answer = await client.get(f"{ready['metrics']}/status", timeout=10)
    return dict(answer.json())


async def sybil_flood(addr: str, answers: Counter[str], *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    await polite_swarm(addr, answers, code=SYBIL_CODE, keys=SYBIL_KEYS, peers=PEERS, task_status=task_status)


async def wait_for_the_swarm(ready: dict[str, Any], places: int, answers: Counter[str]) -> None:
    """Readiness: the swarm holds `places` places of the queue (and so keeps them, refilling each as it frees)."""
    with trio.move_on_after(60):
        while (now := await status(ready))["queueFresh"] < places:
            await trio.sleep(0.1)
        return
    raise AssertionError(f"the swarm holds {now['queueFresh']} places, not {places}; its answers: {dict(answers)}")


async def honest_offers(ready: dict[str, Any], honest: NodeIdentity) -> Counter[str]:
    outcomes: Counter[str] = Counter()
    config = NodeConfig(identity=honest, listen=["/ip4/127.0.0.1/tcp/0"], sandbox_mode="none")
    async with MeshNode.open(config) as offerer:
        for n in range(HONEST_OFFERS):
            raw = offerer.make_offer(to=ready["addrs"][0], language="python", code=f"print({n} * 2)")
            with trio.fail_after(60):
                outcome = await offerer.offer_direct(ready["addrs"][0], raw)
            if outcome.result is not None:
                assert outcome.ok and outcome.result.result.stdout == f"{n * 2}\n"
                outcomes["served"] += 1
            else:
                assert outcome.refusal is not None
                outcomes[str(outcome.refusal.reason)] += 1
    return outcomes


async def test_without_the_classes_a_sybil_swarm_takes_the_whole_queue(tmp_path: Path) -> None:
    honest = NodeIdentity.generate()
    answers: Counter[str] = Counter()
    async with node_process(tmp_path, honest, "--fresh-share", "1") as ready, trio.open_nursery() as nursery:
        await nursery.start(sybil_flood, ready["addrs"][0], answers)
        await wait_for_the_swarm(ready, 32, answers)
        outcomes = await honest_offers(ready, honest)
        nursery.cancel_scope.cancel()
    # The finding: the honest offers are refused, `busy`, and the ones sent at once after it within its retry hint.
    # (One may find a place a run has just freed before the swarm refills it: the swarm's peers wait as told.)
    assert outcomes[str(Reason.BUSY)] >= 1 and outcomes["served"] <= 1, outcomes
    assert outcomes[str(Reason.BUSY)] + outcomes[str(Reason.RATE_LIMITED)] >= HONEST_OFFERS - 1, outcomes
    assert answers["busy"] > 0


async def test_honest_offers_are_served_through_a_sybil_swarm(tmp_path: Path) -> None:
    honest = NodeIdentity.generate()
    answers: Counter[str] = Counter()
    async with node_process(tmp_path, honest) as ready, trio.open_nursery() as nursery:
        await nursery.start(sybil_flood, ready["addrs"][0], answers)
        await wait_for_the_swarm(ready, 16, answers)
        outcomes = await honest_offers(ready, honest)
        during = await status(ready)
        nursery.cancel_scope.cancel()
    assert outcomes == Counter({"served": HONEST_OFFERS}), outcomes
    # The swarm was there all along, holding the fresh share and being served within it.
    assert during["freshPlaces"] == 16
    assert during["queueFresh"] >= during["freshPlaces"] - 2  # less only the places its runs just freed
    assert answers["busy"] > 0
    assert during["offersRejected"].get("direct/busy", 0) > 0
