"""WarmPool: a few started containers, each waiting on stdin for exactly one task, never reused.

Reuse would let one task leave something (a file in /tmp, a process) for the next. A container that has run a
task is removed; the pool refills in the owner's nursery. A waiting container ends by itself when its owner's
attach connection closes, and whatever a dead owner left is swept by the next executor (executor/owner.py).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import structlog
import trio

from executor.contract import Limits
from executor.sandbox import DockerSandbox, SandboxUnavailable, StartedContainer

log = structlog.get_logger(__name__)

RETRY_FIRST_S = 0.5
RETRY_MAX_S = 10.0


class WarmPool:
    def __init__(self, sandbox: DockerSandbox, *, limits: Limits, size: int) -> None:
        if size and not sandbox.has_background:
            raise ValueError("a warm pool needs a sandbox with a background nursery for removals")
        self._sandbox = sandbox
        self.limits = limits
        self.size = size
        self._ready: deque[StartedContainer] = deque()
        self._refill_wanted = trio.Event()
        self._refill_scope: trio.CancelScope | None = None
        self._refill_stopped = trio.Event()

    @property
    def ready(self) -> int:
        return len(self._ready)

    def take(self, limits: Limits) -> StartedContainer | None:
        """A started container for `limits`, or None (the caller then starts one cold).

        Only memory and cpus are properties of a container; the timeout is enforced by the executor, so a run
        with any timeout can use a pooled container made with the same memory and cpus.
        """
        if (limits.memory_mb, limits.cpus) != (self.limits.memory_mb, self.limits.cpus):
            return None
        self._refill_wanted.set()
        while self._ready:
            container = self._ready.popleft()
            if container.looks_alive():
                return container
            # Died while waiting (daemon restart, external removal): never hand it out.
            container.close()
            self._discard(container)
        return None

    # task_status is Any: the stale trio-stubs package (via libp2p) has no trio.TaskStatus.
    async def keep_filled(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Refill, one container at a time, in the owner's nursery until `close()`. Use with `nursery.start`."""
        try:
            with trio.CancelScope() as self._refill_scope:
                task_status.started()
                await self._refill_forever()
        finally:
            self._refill_stopped.set()

    async def _refill_forever(self) -> None:
        retry_s = RETRY_FIRST_S
        while True:
            while len(self._ready) < self.size:
                try:
                    health = await self._sandbox.ensure_ready()
                    if not health.ok:
                        raise SandboxUnavailable(f"{health.reason}: {health.detail}")
                    container = await self._sandbox.start(self.limits, role="pool")
                except SandboxUnavailable as exc:
                    log.warning("pool.refill_failed", error=str(exc), retry_in_s=retry_s)
                    await trio.sleep(retry_s)
                    retry_s = min(retry_s * 2, RETRY_MAX_S)
                    continue
                retry_s = RETRY_FIRST_S
                self._ready.append(container)
            self._refill_wanted = trio.Event()
            await self._refill_wanted.wait()

    async def close(self) -> None:
        """Stop refilling, then remove every idle container (shielded: this runs while the owner shuts down)."""
        with trio.CancelScope(shield=True):
            if self._refill_scope is not None:
                # A container being started right now lands in the pool first, then goes with the rest.
                self._refill_scope.cancel()
                await self._refill_stopped.wait()
            async with trio.open_nursery() as nursery:
                while self._ready:
                    container = self._ready.popleft()
                    container.close()
                    nursery.start_soon(self._sandbox.dispose, container.container_id)

    def _discard(self, container: StartedContainer) -> None:
        # take() is synchronous, so the removal goes to the owner's nursery.
        self._sandbox.dispose_soon(container.container_id)
