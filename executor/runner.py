"""Executor: the one entry point through which the node runs code.

    async with Executor.open(policy, node_label=node_id) as ex:
        result = await ex.run_code(request)                  # sandbox="docker", origin="remote"

The order of decisions for a run is fixed, and every refusal happens before anything is started:

1. a remote task may never run on the host (`sandbox_required_for_remote_task`): no process, no container;
2. sizes: code and JSON input within the policy's bounds, judged before anything parses them;
3. code outside the subset is refused (`outside_subset`), as hygiene, when the policy says so. The check runs in
   the checker process (executor/checker.py), never on the Trio thread;
4. limits are clamped into the policy;
5. admission: at most `max_concurrent` runs, at most `max_waiting` waiting, otherwise `busy` at once;
6. the run itself: pooled when the clamped memory and cpus match the pool's, cold otherwise.

The executor owns a nursery: the pool refill and the removal of finished containers live there, and leaving the
`async with` aborts runs still in flight (their results say `aborted`), removes idle pool containers, ends the
checker process and waits for pending removals.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import structlog
import trio

from executor.checker import SubsetChecker
from executor.contract import (
    LANGUAGES,
    SANDBOX_REQUIRED,
    ErrorKind,
    ExecRequest,
    ExecResult,
    Limits,
    QueueReason,
    refusal,
)
from executor.host import run_on_host
from executor.policy import ExecutorPolicy
from executor.pool import WarmPool
from executor.sandbox import DOCKER_ERRORS, DockerSandbox, PreparedRequest, SandboxHealth, prepare_request

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ExecutorStats:
    """For metrics: containers ready in the pool, runs holding a slot, runs waiting for one, removals pending."""

    pool_ready: int
    pool_size: int
    runs_in_flight: int
    waiting: int
    max_concurrent: int
    pending_removals: int = 0

    @property
    def free_slots(self) -> int:
        return max(0, self.max_concurrent - self.runs_in_flight)


class Executor:
    def __init__(
        self, policy: ExecutorPolicy, sandbox: DockerSandbox, pool: WarmPool, checker: SubsetChecker | None
    ) -> None:
        self.policy = policy
        self.sandbox = sandbox
        self.pool = pool
        self.checker = checker  # None when the policy switches the subset check off
        self._slots = trio.CapacityLimiter(policy.max_concurrent)
        self._in_flight = 0
        self._waiting = 0
        self._closing = False
        self._runs: set[trio.CancelScope] = set()
        self._no_runs = trio.Event()
        self._no_runs.set()
        self.swept = False  # the start-up sweep of dead owners' containers has finished (for tests)

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        policy: ExecutorPolicy | None = None,
        *,
        node_label: str = "local",
        docker_base_url: str | None = None,
        pool_size: int | None = None,
    ) -> AsyncIterator[Executor]:
        """An executor whose pool and background removals live exactly as long as the `async with`.

        `pool_size` overrides the policy's (0: no pool, every run cold); `docker_base_url` overrides DOCKER_HOST.
        """
        policy = policy or ExecutorPolicy.from_env()
        checker = SubsetChecker() if policy.subset_check else None
        sandbox: DockerSandbox | None = None
        try:
            if checker is not None:
                await checker.start()
            async with trio.open_nursery() as nursery:
                sandbox = DockerSandbox(policy, node_label=node_label, base_url=docker_base_url, background=nursery)
                size = policy.pool_size if pool_size is None else pool_size
                warm = WarmPool(sandbox, limits=policy.pool_limits, size=size)
                executor = cls(policy, sandbox, warm, checker)
                # Every executor, a one-off `exec` too, sweeps what dead owners left; in the background, so the
                # first run does not wait for it. It never touches a living owner's containers.
                nursery.start_soon(executor._sweep)
                if warm.size:
                    await nursery.start(warm.keep_filled)
                try:
                    yield executor
                finally:
                    with trio.CancelScope(shield=True):
                        executor._closing = True
                        executor.abort_all()
                        # Aborted runs kill their containers (bounded by the kill's own timeout) before the
                        # connections to the daemon close.
                        await executor._all_runs_ended()
                        await warm.close()
                # The nursery now waits for the removals still pending.
        finally:
            # After the nursery: no removal is left to use the daemon connections.
            if sandbox is not None:
                sandbox.close()
            if checker is not None:
                await checker.aclose()

    async def run_code(
        self, request: ExecRequest, *, sandbox: str = "docker", origin: str = "remote", spare_warm: int = 0
    ) -> ExecResult:
        """Run one request under the policy. `spare_warm` is how many warm containers this run must leave in the
        pool: when it would take one of the last ones, it starts cold instead (the node keeps them for offerers it
        knows, see mesh/standing.py)."""
        if sandbox == "host" and origin != "local":
            return refusal(SANDBOX_REQUIRED, error_kind=ErrorKind.SANDBOX_VIOLATION, queue_reason=SANDBOX_REQUIRED)
        if sandbox not in ("docker", "host") or origin not in ("local", "remote"):
            return _invalid(f"unknown sandbox {sandbox!r} or origin {origin!r}")
        if request.language not in LANGUAGES:
            return _invalid(f"unsupported language {request.language!r}")
        prepared = prepare_request(request, self.policy)
        if isinstance(prepared, ExecResult):
            return prepared
        # Hygiene for every run while the policy asks for it: remote offers by default, and the local user until
        # they pass `--no-subset`. Never the boundary: the container is.
        if self.checker is not None:
            violation = await self.checker.check(request.language, request.code)
            if violation is not None:
                where = "" if violation.line is None else f" (line {violation.line})"
                return refusal(
                    f"{QueueReason.OUTSIDE_SUBSET}: {violation.construct}{where}",
                    error_kind=ErrorKind.SANDBOX_VIOLATION,
                    queue_reason=str(QueueReason.OUTSIDE_SUBSET),
                )
        limits = self.policy.clamp(request.limits)
        if self._closing:
            return _aborted(0)
        if self._slots.available_tokens == 0 and self._waiting >= self.policy.max_waiting:
            return refusal("executor busy", error_kind=ErrorKind.ABORTED, queue_reason=str(QueueReason.BUSY))
        return await self._admitted(prepared, limits, on_host=sandbox == "host", spare_warm=spare_warm)

    async def _admitted(
        self, request: PreparedRequest, limits: Limits, *, on_host: bool, spare_warm: int = 0
    ) -> ExecResult:
        started_at = trio.current_time()
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        self._in_flight += 1
        self._no_runs = trio.Event() if self._no_runs.is_set() else self._no_runs
        try:
            with trio.CancelScope() as run_scope:
                self._runs.add(run_scope)
                if self._closing:
                    run_scope.cancel()
                if on_host:
                    return await run_on_host(request, limits, self.policy)
                source = self.pool if self.pool.ready > spare_warm else None
                return await self.sandbox.run(request, limits, source=source)
            # Only abort_all() cancels this scope; the sandbox has killed and removed the container.
            return _aborted(int((trio.current_time() - started_at) * 1000))
        finally:
            self._runs.discard(run_scope)
            self._in_flight -= 1
            self._slots.release()
            if self._in_flight == 0:
                self._no_runs.set()

    async def _all_runs_ended(self) -> None:
        await self._no_runs.wait()

    async def _sweep(self) -> None:
        try:
            removed = await self.sandbox.sweep_dead_owners()
        except DOCKER_ERRORS as exc:  # no daemon at start-up is normal: runs will say sandbox_unavailable
            log.info("executor.sweep_skipped", error=repr(exc))
        else:
            if removed:
                log.info("executor.swept", removed=removed)
        finally:
            self.swept = True

    def abort_all(self) -> None:
        """Abort every run in flight: containers are killed and removed, results say `aborted`."""
        for scope in list(self._runs):
            scope.cancel()

    async def health(self) -> SandboxHealth:
        return await self.sandbox.health()

    async def canary(self) -> SandboxHealth:
        return await self.sandbox.canary()

    def stats(self) -> ExecutorStats:
        return ExecutorStats(
            pool_ready=self.pool.ready,
            pool_size=self.pool.size,
            runs_in_flight=self._in_flight,
            waiting=self._waiting,
            max_concurrent=self.policy.max_concurrent,
            pending_removals=self.sandbox.pending_removals,
        )


async def run_code(
    request: ExecRequest,
    *,
    sandbox: str = "docker",
    origin: str = "remote",
    policy: ExecutorPolicy | None = None,
) -> ExecResult:
    """One run through a short-lived executor without a pool: for one-off CLI use."""
    async with Executor.open(policy, node_label=f"oneoff-{uuid.uuid4().hex[:12]}", pool_size=0) as executor:
        return await executor.run_code(request, sandbox=sandbox, origin=origin)


def _aborted(duration_ms: int) -> ExecResult:
    return refusal(
        "run aborted", error_kind=ErrorKind.ABORTED, queue_reason=str(QueueReason.ABORTED), duration_ms=duration_ms
    )


def _invalid(why: str) -> ExecResult:
    return ExecResult(ok=False, stderr=why, error_kind=ErrorKind.EXECUTION_FAILED)
