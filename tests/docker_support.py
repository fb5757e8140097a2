"""Helpers for tests that talk to the real Docker daemon."""

from __future__ import annotations

import docker
import trio

from executor.container_config import NODE_LABEL
from executor.policy import ExecutorPolicy
from executor.runner import Executor


def containers_labelled(node_label: str) -> list[str]:
    """Ids of every container (any state) that the executor labelled for this node."""
    client = docker.APIClient()
    try:
        found = client.containers(all=True, filters={"label": f"{NODE_LABEL}={node_label}"})
    finally:
        client.close()
    return sorted(c["Id"] for c in found)


def sandbox_policy(**changes: object) -> ExecutorPolicy:
    """Small pools, so that several nodes in one test stay light on a 2-core machine."""
    fields: dict[str, object] = {"pool_size": 1, "max_concurrent": 2}
    fields.update(changes)
    return ExecutorPolicy(**fields)  # type: ignore[arg-type]


async def wait_pool_ready(executor: Executor, timeout: float = 30.0) -> None:
    with trio.fail_after(timeout):
        while executor.stats().pool_ready < executor.stats().pool_size:
            await trio.sleep(0.02)
