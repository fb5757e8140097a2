"""Runtimes across real nodes on loopback, real Docker: a numpy offer runs on the node that has the runtime, a node
without it refuses it before any claim, gossip invitations skip the nodes that lack it, and /status shows who
offers which runtime (docs/runtimes.md)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import docker
import pytest
import trio

from mesh.node import MeshNode, NodeConfig
from mesh.status import node_status
from tests.docker_support import NUMPY_RUNTIME, build_numpy_runtime, sandbox_policy
from transports.wire.identity import NodeIdentity
from transports.wire.needs import Needs
from transports.wire.reasons import Reason

MATMUL = """
import json, sys
import numpy as np
a = np.array(json.load(sys.stdin)["a"], dtype=float)
print(json.dumps((a @ a.T).tolist()))
"""


@pytest.fixture(scope="session")
def numpy_built(docker_api: docker.APIClient) -> None:
    problem = build_numpy_runtime()
    if problem is not None:
        pytest.fail(problem, pytrace=False)


@contextlib.asynccontextmanager
async def mesh() -> AsyncIterator[tuple[MeshNode, MeshNode, MeshNode, MeshNode]]:
    """Two runners with the numpy runtime, one without it, and an offerer, all meshed."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(peers: list[str], **fields: Any) -> MeshNode:
            config = NodeConfig(identity=NodeIdentity.generate(), peers=peers, heartbeat_interval=0.5, **fields)
            return await stack.enter_async_context(MeshNode.open(config))

        science = sandbox_policy(pool_size=0, runtimes=(NUMPY_RUNTIME,))
        first = await start([], executor_policy=science)
        second = await start(first.addrs[:1], executor_policy=science)
        plain = await start(first.addrs[:1], executor_policy=sandbox_policy(pool_size=0))
        offerer = await start(first.addrs[:1], sandbox_mode="none")
        with trio.fail_after(20):
            while len([h for h in offerer.peers.fresh() if h.capabilities is not None]) < 3:
                await trio.sleep(0.05)
        yield first, second, plain, offerer


async def test_a_numpy_offer_runs_where_the_runtime_is_and_is_refused_where_it_is_not(numpy_built: None) -> None:
    async with mesh() as (first, second, plain, offerer):
        needs = Needs(NUMPY_RUNTIME.name)
        refused = await offerer.offer_direct(
            plain.addrs[0], offerer.make_offer(to=plain.peer_id, language="python", code=MATMUL, needs=needs)
        )
        assert refused.refusal is not None and refused.refusal.reason == Reason.RUNTIME_UNAVAILABLE
        assert "not built here" in refused.refusal.detail and not plain.ran
        raw = offerer.make_offer(
            to=first.peer_id, language="python", code=MATMUL, input={"a": [[1, 2], [3, 4]]}, needs=needs
        )
        ran = await offerer.offer_direct(first.addrs[0], raw)
        assert ran.ok and ran.result is not None, ran.refusal
        assert json.loads(ran.result.result.stdout) == [[5.0, 11.0], [11.0, 25.0]]
        # Pinned to this node's exact package set: runs; pinned to another: refused.
        digest = first.executor.built_runtimes[NUMPY_RUNTIME.name].digest  # type: ignore[union-attr]
        pinned = Needs(NUMPY_RUNTIME.name, digest)
        other = Needs(NUMPY_RUNTIME.name, "0" * 64)
        assert (
            await offerer.offer_direct(
                first.addrs[0], offerer.make_offer(to=first.peer_id, language="python", code="1", needs=pinned)
            )
        ).ok
        mismatch = await offerer.offer_direct(
            first.addrs[0], offerer.make_offer(to=first.peer_id, language="python", code="1", needs=other)
        )
        assert mismatch.refusal is not None and mismatch.refusal.reason == Reason.RUNTIME_UNAVAILABLE

        # Gossip: only the runners with the runtime are invited, and one of them runs it.
        invitable = {c.peer_id for c in offerer.runner_candidates(language="python", min_isolation=None, needs=needs)}
        assert invitable == {first.peer_id, second.peer_id}
        gossip = await offerer.offer_gossip(
            offerer.make_offer(language="python", code=MATMUL, input={"a": [[2]]}, needs=needs), timeout=60
        )
        assert gossip.ok and gossip.result is not None and gossip.result.result.stdout == "[[4.0]]\n"
        assert plain.intake.admitted["gossip"] == 0

        # Who offers which runtime: each runner's own status, and the offerer's view of its peers.
        mine = node_status(first)
        assert {r["name"] for r in mine["runtimes"]} == {"python", NUMPY_RUNTIME.name}
        assert any(p.startswith("python3-numpy=") for r in mine["runtimes"] for p in r["packages"])
        assert first.executor is not None
        assert mine["resources"]["gpu"] == "none"
        assert mine["resources"]["memoryMb"] == first.executor.policy.max_memory_mb
        seen = {p["peerId"]: p["runtimes"] for p in node_status(offerer)["peers"]}
        assert {r["name"] for r in seen[plain.peer_id]} == {"python"}
        assert {r["name"] for r in seen[second.peer_id]} == {"python", NUMPY_RUNTIME.name}
