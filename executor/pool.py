"""WarmPool: a few started containers, each waiting on stdin for exactly one task, never reused.

Reuse would let one task leave something (a file in /tmp, a process) for the next. A container that has run a
task is removed; the pool refills in the owner's nursery. A waiting container ends by itself when its owner's
attach connection closes, and whatever a dead owner left is swept by the next executor (executor/owner.py).

Each container has started the interpreter of one language before its task (executor/supervisor.py), in the mix
the policy sets (`pool_languages`, cycled over the pool's size). A run takes a container of its own language if
one is ready, and any other otherwise: the supervisor then starts the run's interpreter on arrival, which is
slower but still spares a container start. Whatever is taken is replaced by a container of the same language, so
the mix stays as configured.

A replacement is started once the runs on pool containers have returned, or REFILL_DEFER_S after it was wanted if
one runs longer: creating and starting a container costs dockerd, containerd and runc far more CPU than a warm run
takes, and on a small machine a start that overlaps the run it replaces was the larger part of that run's latency
(measured: benchmarks/bench_executor.py, docs/executor.md "Warm start").
"""

from __future__ import annotations

from collections import deque
from itertools import cycle, islice
from typing import Any

import trio

from executor import lazylog
from executor.containers import SandboxUnavailable, StartedContainer
from executor.contract import Language, Limits
from executor.sandbox import DockerSandbox

log = lazylog.get_logger(__name__)

RETRY_FIRST_S = 0.5
RETRY_MAX_S = 10.0
# A container counts as ready once its interpreter is parked: node needs about 0.3 s at the pool's half a CPU.
PARK_TIMEOUT_S = 30.0
PARK_ERRORS = (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, OSError)
# The longest a refill waits for runs on pool containers to return before it starts a container anyway.
REFILL_DEFER_S = 0.25


class WarmPool:
    def __init__(self, sandbox: DockerSandbox, *, limits: Limits, size: int) -> None:
        if size and not sandbox.has_background:
            raise ValueError("a warm pool needs a sandbox with a background nursery for removals")
        self._sandbox = sandbox
        self.limits = limits
        self.size = size
        self._ready: deque[StartedContainer] = deque()
        policy = sandbox.policy
        languages: tuple[Language | None, ...] = policy.pool_languages if policy.prestart else (None,)
        # What the refill starts next: the prestart language of each container missing from the pool.
        self._to_start: deque[Language | None] = deque(islice(cycle(languages), size))
        self._refill_wanted = trio.Event()
        self._lent = 0  # containers taken whose runs have not returned yet
        self._returned = trio.Event()
        self._refill_scope: trio.CancelScope | None = None
        self._refill_stopped = trio.Event()
        self._languages = languages
        self._starting = False  # the head of `_to_start` is being started now

    @property
    def ready(self) -> int:
        return len(self._ready)

    @property
    def ready_languages(self) -> list[Language | None]:
        """The prestart language of each ready container, oldest first."""
        return [container.prestarted for container in self._ready]

    def take(self, limits: Limits, language: Language) -> StartedContainer | None:
        """A started container for `limits`, one prestarted for `language` if any is ready, or None (the caller
        then starts one cold).

        Only memory and cpus are properties of a container; the timeout is enforced by the executor, so a run
        with any timeout can use a pooled container made with the same memory and cpus.
        """
        if (limits.memory_mb, limits.cpus) != (self.limits.memory_mb, self.limits.cpus):
            return None
        # Its own language's first; sorted() is stable, so the oldest of each kind comes first.
        for container in sorted(self._ready, key=lambda c: c.prestarted != language):
            self._ready.remove(container)
            self._to_start.append(container.prestarted)
            self._refill_wanted.set()
            if container.looks_alive():
                self._lent += 1
                return container
            # Died while waiting (daemon restart, external removal): never hand it out.
            container.close()
            self._discard(container)
        return None

    def resize(self, size: int) -> None:
        """Keep `size` containers from now on (executor/budget.py shares one budget among runtimes). Growing
        starts the new ones in the refill; shrinking forgets the ones not yet started, then removes the oldest
        ready ones (a container being started now is removed when it lands)."""
        self.size = max(0, size)
        excess = len(self._ready) + len(self._to_start) - self.size
        while excess > 0 and len(self._to_start) > (1 if self._starting else 0):
            self._to_start.pop()
            excess -= 1
        while excess > 0 and self._ready:
            container = self._ready.popleft()
            container.close()
            self._discard(container)
            excess -= 1
        if excess < 0:
            self._to_start.extend(islice(cycle(self._languages), -excess))
            self._refill_wanted.set()

    def returned(self, container: StartedContainer) -> None:
        """The run on a container from `take` is over (the container itself is being removed)."""
        self._lent -= 1
        self._returned.set()

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
            while self._to_start:
                await self._runs_returned()
                if not self._to_start:  # shrunk to nothing meanwhile (resize)
                    break
                self._starting = True
                try:
                    health = await self._sandbox.ensure_ready()
                    if not health.ok:
                        raise SandboxUnavailable(f"{health.reason}: {health.detail}")
                    container = await self._sandbox.start(self.limits, role="pool", prestart=self._to_start[0])
                    if container.parking:
                        await self._parked(container)
                except Exception as exc:  # a refill's failure is the pool's to retry, never the node's
                    # SandboxUnavailable as a rule; anything else (a daemon gone mid-call, an SDK surprise) too: the
                    # pool is a cache, and the gate judges the daemon.
                    log.warning("pool.refill_failed", error=repr(exc), retry_in_s=retry_s)
                    await trio.sleep(retry_s)
                    retry_s = min(retry_s * 2, RETRY_MAX_S)
                    continue
                finally:
                    self._starting = False
                retry_s = RETRY_FIRST_S
                self._to_start.popleft()
                self._ready.append(container)
                if len(self._ready) + len(self._to_start) > self.size:  # shrunk while it was being started
                    self.resize(self.size)
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

    async def _runs_returned(self) -> None:
        with trio.move_on_after(REFILL_DEFER_S):
            while self._lent:
                self._returned = trio.Event()
                await self._returned.wait()

    async def _parked(self, container: StartedContainer) -> None:
        """Until the container's interpreter is parked. Raises SandboxUnavailable, the container then removed."""
        try:
            with trio.fail_after(PARK_TIMEOUT_S):
                await container.wait_parked()
        except BaseException as exc:  # a cancellation (the pool closing) too: the container must not leak
            container.close()
            self._discard(container)
            if isinstance(exc, PARK_ERRORS):
                raise SandboxUnavailable(f"the interpreter did not start: {exc!r}") from exc
            raise

    def _discard(self, container: StartedContainer) -> None:
        # take() is synchronous, so the removal goes to the owner's nursery.
        self._sandbox.dispose_soon(container.container_id)
