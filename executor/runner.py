"""Executor: the one entry point through which the node runs code.

    async with Executor.open(policy, node_label=node_id) as ex:
        result = await ex.run_code(request)                  # sandbox="docker", origin="remote"

The order of decisions for a run is fixed, and every refusal happens before anything is started:

1. a remote task may never run on the host (`sandbox_required_for_remote_task`): no process, no container;
2. sizes: code and JSON input within the policy's bounds, judged before anything parses them;
3. code outside the subset is refused (`outside_subset`), as hygiene, when the policy says so. The check runs in
   the checker process (executor/checker.py), never on the Trio thread;
4. limits are clamped into the policy;
5. the runtime: one the policy declares (`runtime_unavailable` otherwise; executor/runtimes.py);
6. the isolation tier: the weakest the policy offers that meets the run's minimum (`isolation_insufficient` when
   none does), among those whose last canary passed (`sandbox_unavailable` when none has);
7. admission: at most `max_concurrent` runs, at most `max_waiting` waiting, otherwise `busy` at once;
8. the run itself, in that tier's and runtime's sandbox: pooled when the clamped memory and cpus match the pool's,
   cold otherwise.

Every tier has a sandbox per runtime (executor/sandbox.py, with its backend: executor/backends/; the same policy
but for the runtime's image) and a warm pool per runtime, whose sizes share one budget (executor/budget.py); they
share the executor's line to the daemon, its slots and its checker.

The executor owns a nursery: the pool refill and the removal of finished containers live there, and leaving the
`async with` aborts runs still in flight (their results say `aborted`), removes idle pool containers, ends the
checker process and waits for pending removals.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

import docker
import docker.errors
import trio

from executor import lazylog
from executor.backends import SandboxBackend, Tier, backend_for, rank, weakest_meeting
from executor.budget import WarmBudget
from executor.checker import SubsetChecker
from executor.containers import DOCKER_ERRORS
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
from executor.docker_api import DockerApi
from executor.health import SandboxHealth
from executor.policy import ExecutorPolicy
from executor.pool import WarmPool
from executor.request import PreparedRequest, prepare_request
from executor.runcontrol import RunControl
from executor.runtimes import DEFAULT_RUNTIME, RuntimeInfo, runtime_info
from executor.sandbox import DockerSandbox
from executor.subset import SubsetViolation

log = lazylog.get_logger(__name__)


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
        self,
        policy: ExecutorPolicy,
        sandboxes: dict[Tier, DockerSandbox],
        pools: dict[Tier, WarmPool],
        checker: SubsetChecker | None,
        *,
        runtime_sandboxes: dict[tuple[Tier, str], DockerSandbox] | None = None,
        runtime_pools: dict[tuple[Tier, str], WarmPool] | None = None,
    ) -> None:
        self.policy = policy
        self.sandboxes = sandboxes  # one per tier the policy offers: the `python` runtime's
        self.pools = pools
        # Every (tier, runtime): the `python` ones are the same objects as above.
        self.runtime_sandboxes = runtime_sandboxes or {(t, DEFAULT_RUNTIME): s for t, s in sandboxes.items()}
        self.runtime_pools = runtime_pools or {(t, DEFAULT_RUNTIME): p for t, p in pools.items()}
        self._budgets = {tier: WarmBudget(pool.size, policy.runtime_names) for tier, pool in pools.items() if pool.size}
        self.checker = checker  # None when the policy switches the subset check off
        self._slots = trio.CapacityLimiter(policy.max_concurrent)
        self._in_flight = 0
        self._waiting = 0
        self._closing = False
        self._runs: set[trio.CancelScope] = set()
        self._no_runs = trio.Event()
        self._no_runs.set()
        # The declared runtimes whose images are built, as `refresh_runtimes` last found them: what the node
        # advertises. Empty until the first refresh.
        self.built_runtimes: dict[str, RuntimeInfo] = {}
        self._idle_scope = trio.CancelScope()
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
        backends: Mapping[Tier, SandboxBackend] | None = None,
    ) -> AsyncIterator[Executor]:
        """An executor whose pool and background removals live exactly as long as the `async with`.

        `pool_size` overrides the policy's (0: no pool, every run cold); `docker_base_url` overrides DOCKER_HOST;
        `backends` gives a tier another backend than its own (benchmarks/bench_isolation.py: gVisor on ptrace).
        """
        policy = policy or ExecutorPolicy.from_env()
        checker = SubsetChecker() if policy.subset_check else None
        docker_api = DockerApi(docker_base_url)
        try:
            if checker is not None:
                await checker.start()
            async with trio.open_nursery() as nursery:
                size = policy.pool_size if pool_size is None else pool_size
                runtime_sandboxes: dict[tuple[Tier, str], DockerSandbox] = {}
                runtime_pools: dict[tuple[Tier, str], WarmPool] = {}
                for tier in policy.isolation:
                    for name in policy.runtime_names:
                        runtime_sandboxes[tier, name] = DockerSandbox(
                            policy.for_runtime(name),
                            node_label=node_label,
                            backend=(backends or {}).get(tier) or backend_for(tier),
                            docker_api=docker_api,
                            background=nursery,
                        )
                        # `python` holds the whole budget until another runtime is used (executor/budget.py).
                        runtime_pools[tier, name] = WarmPool(
                            runtime_sandboxes[tier, name],
                            limits=policy.pool_limits,
                            size=size if name == DEFAULT_RUNTIME else 0,
                        )
                sandboxes = {t: runtime_sandboxes[t, DEFAULT_RUNTIME] for t in policy.isolation}
                pools = {t: runtime_pools[t, DEFAULT_RUNTIME] for t in policy.isolation}
                executor = cls(
                    policy,
                    sandboxes,
                    pools,
                    checker,
                    runtime_sandboxes=runtime_sandboxes,
                    runtime_pools=runtime_pools,
                )
                # Every executor, a one-off `exec` too, sweeps what dead owners left; in the background, so the
                # first run does not wait for it. It never touches a living owner's containers.
                nursery.start_soon(executor._sweep)
                try:
                    if size:
                        for warm in runtime_pools.values():
                            await nursery.start(warm.keep_filled)
                        nursery.start_soon(executor._release_idle)
                    yield executor
                finally:
                    executor._idle_scope.cancel()
                    with trio.CancelScope(shield=True):
                        executor._closing = True
                        executor.abort_all()
                        # Aborted runs kill their containers (bounded by the kill's own timeout) before the
                        # connections to the daemon close.
                        await executor._all_runs_ended()
                        if checker is not None:  # nothing is left to check: its exit overlaps the removals
                            await checker.aclose()
                        for warm in runtime_pools.values():
                            await warm.close()
                # The nursery now waits for the removals still pending.
        finally:
            # After the nursery: no removal is left to use the daemon connections.
            docker_api.close()
            if checker is not None:
                await checker.aclose()

    @property
    def sandbox(self) -> DockerSandbox:
        """The weakest tier's sandbox (the only one, unless the policy offers several tiers)."""
        return self.sandboxes[self.policy.isolation[0]]

    @property
    def pool(self) -> WarmPool:
        """The weakest tier's warm pool."""
        return self.pools[self.policy.isolation[0]]

    @property
    def offered_tiers(self) -> tuple[Tier, ...]:
        """The tiers of the policy, weakest first, whatever their canaries say (the gate judges those)."""
        return self.policy.isolation

    async def run_code(
        self,
        request: ExecRequest,
        *,
        sandbox: str = "docker",
        origin: str = "remote",
        min_isolation: str | None = None,
        spare_warm: int = 0,
        control: RunControl | None = None,
        runtime: str = DEFAULT_RUNTIME,
    ) -> ExecResult:
        """Run `request` under the declared `runtime` (an offer's `runtime`; anything undeclared is refused, and
        nothing else chooses an image). `min_isolation` is the weakest tier the run accepts (an offer's
        `minIsolation`; None: any the policy offers); the run goes to the weakest offered tier that meets it.
        `spare_warm` is how many warm containers this run must leave in that tier's runtime's pool: when it would
        take one of the last ones, it starts cold instead (the node keeps them for offerers it knows, see
        mesh/standing.py). `control` may stop the run, keeping its output so far, and watch its output as it comes
        (executor/runcontrol.py)."""
        if sandbox == "host" and origin != "local":
            return refusal(
                SANDBOX_REQUIRED, error_kind=ErrorKind.SANDBOX_VIOLATION, queue_reason=QueueReason.SANDBOX_REQUIRED
            )
        if sandbox not in ("docker", "host") or origin not in ("local", "remote"):
            return _invalid(f"unknown sandbox {sandbox!r} or origin {origin!r}")
        try:
            if min_isolation is not None:
                rank(min_isolation)
        except ValueError as exc:
            return _invalid(str(exc))
        tier = None
        if sandbox == "docker":
            if self.policy.runtime(runtime) is None:
                why = (
                    f"{QueueReason.RUNTIME_UNAVAILABLE}: runtime {runtime[:64]!r} is not declared here (declared: "
                    f"{', '.join(self.policy.runtime_names)})"
                )
                return refusal(why, error_kind=ErrorKind.EXECUTION_FAILED, queue_reason=QueueReason.RUNTIME_UNAVAILABLE)
            chosen = self._tier_for(min_isolation, runtime)
            if isinstance(chosen, ExecResult):
                return chosen
            tier = chosen
        if request.language not in LANGUAGES:
            return _invalid(f"unsupported language {request.language!r}")
        prepared = prepare_request(request, self.policy)
        if isinstance(prepared, ExecResult):
            return prepared
        # Hygiene for every run while the policy asks for it: remote offers by default, and the local user until
        # they pass `--no-subset`. Never the boundary: the container is.
        if self.checker is not None:
            violation = await self._check_subset(request, tier, runtime)
            if violation is not None:
                where = "" if violation.line is None else f" (line {violation.line})"
                return refusal(
                    f"{QueueReason.OUTSIDE_SUBSET}: {violation.construct}{where}",
                    error_kind=ErrorKind.SANDBOX_VIOLATION,
                    queue_reason=QueueReason.OUTSIDE_SUBSET,
                )
        limits = self.policy.clamp(request.limits)
        if self._closing:
            return _aborted(0)
        if self._slots.available_tokens == 0 and self._waiting >= self.policy.max_waiting:
            return refusal("executor busy", error_kind=ErrorKind.ABORTED, queue_reason=QueueReason.BUSY)
        return await self._admitted(
            prepared, limits, tier=tier, spare_warm=spare_warm, control=control, runtime=runtime
        )

    async def _check_subset(self, request: ExecRequest, tier: Tier | None, runtime: str) -> SubsetViolation | None:
        """The subset check, while the tier's sandbox asks the daemon whether it is ready (ping, image, runtime):
        neither waits on the other, and a cold run starts as soon as both have answered. The health check only
        reads; nothing is created before the check has passed. Its verdict is kept (HEALTH_TTL_S) for the run."""
        assert self.checker is not None
        async with trio.open_nursery() as nursery:
            if tier is not None:
                nursery.start_soon(self.runtime_sandboxes[tier, runtime].ensure_ready)
            return await self.checker.check(request.language, request.code)

    def _tier_for(self, minimum: str | None, runtime: str = DEFAULT_RUNTIME) -> Tier | ExecResult:
        """The weakest offered tier that meets `minimum` and whose canaries (the tier's, and its `runtime`'s) have
        not failed, or the refusal."""
        if weakest_meeting(self.policy.isolation, minimum) is None:
            why = (
                f"{QueueReason.ISOLATION_INSUFFICIENT}: the run needs at least {minimum}; this executor offers "
                f"{', '.join(self.policy.isolation)}"
            )
            return refusal(why, error_kind=ErrorKind.SANDBOX_VIOLATION, queue_reason=QueueReason.ISOLATION_INSUFFICIENT)
        healthy = [
            t
            for t in self.policy.isolation
            if not self.sandboxes[t].withdrawn and not self.runtime_sandboxes[t, runtime].withdrawn
        ]
        tier = weakest_meeting(healthy, minimum)
        if tier is None:
            failed = "; ".join(
                f"{t}: {c.reason}: {c.detail}"
                for t in self.policy.isolation
                if (c := self.sandboxes[t].last_canary) is not None and not c.ok
            )
            return refusal(
                f"sandbox unavailable: every tier that meets the run's minimum failed its canary ({failed})",
                error_kind=ErrorKind.SANDBOX_VIOLATION,
                queue_reason=QueueReason.SANDBOX_UNAVAILABLE,
            )
        return tier

    async def _admitted(
        self,
        request: PreparedRequest,
        limits: Limits,
        *,
        tier: Tier | None,
        spare_warm: int = 0,
        control: RunControl | None = None,
        runtime: str = DEFAULT_RUNTIME,
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
                if self._closing or (control is not None and control.stopped):
                    run_scope.cancel()
                if tier is None:
                    from executor.host import run_on_host  # its subprocess machinery only for --sandbox host

                    return await run_on_host(request, limits, self.policy)
                self._used(tier, runtime)
                pool = self.runtime_pools[tier, runtime]
                # A run told to spare the last warm ones starts cold (no source); any other asks the pool.
                source = None if spare_warm and pool.ready <= spare_warm else pool
                return await self.runtime_sandboxes[tier, runtime].run(request, limits, source=source, control=control)
            # Only abort_all() or a stop before the start cancels this scope; the sandbox has killed and removed the
            # container.
            return _aborted(int((trio.current_time() - started_at) * 1000))
        finally:
            self._runs.discard(run_scope)
            self._in_flight -= 1
            self._slots.release()
            if self._in_flight == 0:
                self._no_runs.set()

    def _used(self, tier: Tier, runtime: str) -> None:
        """A run of `runtime` on `tier`: the warm budget's shares follow the runtimes in use."""
        budget = self._budgets.get(tier)
        if budget is not None and budget.used(runtime, trio.current_time()):
            self._share(tier, budget)

    def _share(self, tier: Tier, budget: WarmBudget) -> None:
        for name, size in budget.shares().items():
            self.runtime_pools[tier, name].resize(size)

    async def _release_idle(self) -> None:
        """Give an idle runtime's share of the warm budget back, its containers removed (until the close)."""
        with self._idle_scope:
            await self._release_idle_forever()

    async def _release_idle_forever(self) -> None:
        while True:
            await trio.sleep(min(budget.idle_s for budget in self._budgets.values()) / 4 if self._budgets else 60)
            for tier, budget in self._budgets.items():
                if budget.expire(trio.current_time()):
                    self._share(tier, budget)

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

    async def health(self, tier: str | None = None, runtime: str = DEFAULT_RUNTIME) -> SandboxHealth:
        """The daemon, the runtime's image and the tier's container runtime (the weakest offered tier by default)."""
        return await self._sandbox_of(tier, runtime).health()

    async def canary(self, tier: str | None = None, runtime: str = DEFAULT_RUNTIME) -> SandboxHealth:
        """The tier's canary (executor/canary.py) in `runtime`'s image; a failure withdraws that tier (for the
        `python` runtime: the whole tier) from runs until one passes."""
        return await self._sandbox_of(tier, runtime).canary()

    def _sandbox_of(self, tier: str | None, runtime: str = DEFAULT_RUNTIME) -> DockerSandbox:
        tier = tier or self.policy.isolation[0]
        if tier not in self.sandboxes:
            raise ValueError(f"this executor does not offer the {tier} tier (it offers {self.policy.isolation})")
        if (tier, runtime) not in self.runtime_sandboxes:
            raise ValueError(f"runtime {runtime!r} is not declared (declared: {', '.join(self.policy.runtime_names)})")
        return self.runtime_sandboxes[tier, runtime]  # type: ignore[index,unused-ignore]

    async def refresh_runtimes(self) -> dict[str, RuntimeInfo]:
        """Inspect each declared runtime's image: the built ones (present and labelled with their packages) with
        their digests. A declared runtime that is not built is left out, so the node never advertises it."""

        def inspect(api: docker.APIClient) -> dict[str, RuntimeInfo]:
            found: dict[str, RuntimeInfo] = {}
            for name in self.policy.runtime_names:
                runtime = self.policy.runtime(name)
                assert runtime is not None
                try:
                    info = runtime_info(runtime, api.inspect_image(runtime.image))
                except docker.errors.ImageNotFound:
                    continue
                if info is not None:
                    found[name] = info
            return found

        try:
            self.built_runtimes = await self.sandbox.docker.call(inspect)
        except DOCKER_ERRORS as exc:  # no daemon: nothing is built as far as anyone can tell
            log.info("executor.runtimes_unreadable", error=repr(exc))
            self.built_runtimes = {}
        return self.built_runtimes

    def stats(self) -> ExecutorStats:
        return ExecutorStats(
            pool_ready=sum(p.ready for p in self.runtime_pools.values()),
            pool_size=sum(p.size for p in self.runtime_pools.values()),
            runs_in_flight=self._in_flight,
            waiting=self._waiting,
            max_concurrent=self.policy.max_concurrent,
            pending_removals=sum(s.pending_removals for s in self.runtime_sandboxes.values()),
        )


async def run_code(
    request: ExecRequest,
    *,
    sandbox: str = "docker",
    origin: str = "remote",
    policy: ExecutorPolicy | None = None,
    min_isolation: str | None = None,
    runtime: str = DEFAULT_RUNTIME,
) -> ExecResult:
    """One run through a short-lived executor without a pool: for one-off CLI use."""
    async with Executor.open(policy, node_label=f"oneoff-{uuid.uuid4().hex[:12]}", pool_size=0) as executor:
        return await executor.run_code(
            request, sandbox=sandbox, origin=origin, min_isolation=min_isolation, runtime=runtime
        )


def _aborted(duration_ms: int) -> ExecResult:
    return refusal(
        "run aborted", error_kind=ErrorKind.ABORTED, queue_reason=QueueReason.ABORTED, duration_ms=duration_ms
    )


def _invalid(why: str) -> ExecResult:
    return ExecResult(ok=False, stderr=why, error_kind=ErrorKind.EXECUTION_FAILED)
