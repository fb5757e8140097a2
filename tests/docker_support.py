"""Helpers for tests that run real nodes against the real Docker daemon."""

from __future__ import annotations

import trio

from executor.policy import ExecutorPolicy
from executor.runner import Executor


def sandbox_policy(**changes: object) -> ExecutorPolicy:
    """Small pools, so that several nodes in one test stay light on a 2-core machine."""
    fields: dict[str, object] = {"pool_size": 1, "max_concurrent": 2}
    fields.update(changes)
    return ExecutorPolicy(**fields)  # type: ignore[arg-type]


async def wait_pool_ready(executor: Executor, timeout: float = 30.0) -> None:
    """Until the pool is full and no removal (of the gate's canary, say) is still under way: a quiet executor."""
    with trio.fail_after(timeout):
        while (stats := executor.stats()).pool_ready < stats.pool_size or stats.pending_removals:
            await trio.sleep(0.02)
