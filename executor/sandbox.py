"""DockerSandbox: one run of untrusted code in a hardened, single-use container.

A run is: get a started container (pre-started from the warm pool, or created now: create, attach, start),
send the bootstrap payload over the attach socket, read the multiplexed output to end of file in bounded memory,
wait for the exit status, inspect for the OOM flag only when the status is not 0, and remove the container.
Pooled and cold runs share every step after the container is started, so their results are the same.

The docker SDK blocks, so its calls run in worker threads through the executor's own `DockerApi` (its own
limiter, a client per call in flight, a timeout on every request; executor/docker_api.py): create+attach+start is
one call, wait is one, inspect only on failure, and removal happens in the owner's nursery after the result is
returned.
The attach socket itself is handed to Trio, so sending and reading are ordinary cancellable Trio I/O.

Nothing here raises for a run that went wrong: a timeout, a cancellation by the executor, an OOM kill or a daemon
that vanishes all become an `ExecResult`. A cancellation from the caller's own scope kills the container (in a
shielded scope) and propagates, as Trio expects.
"""

from __future__ import annotations

import math

import docker
import docker.errors
import requests
import trio

from executor import lazylog
from executor.backends import SandboxBackend, Tier
from executor.backends.runc import RuncBackend
from executor.bootstrap import encode_payload, new_nonce
from executor.containers import (
    DOCKER_ERRORS,
    ContainerSource,
    SandboxUnavailable,
    StartedContainer,
    kill_blocking,
    oom_killed_blocking,
    remove_blocking,
    start_blocking,
    wait_blocking,
)
from executor.contract import ErrorKind, ExecRequest, ExecResult, Language, Limits, QueueReason
from executor.docker_api import API_TIMEOUT_S, DockerApi
from executor.guardian import GuardianUnavailable
from executor.health import SandboxHealth, health_blocking, run_canary
from executor.output import AttachDemuxer
from executor.policy import ExecutorPolicy
from executor.request import PreparedRequest, prepare_request
from executor.runcontrol import RunControl
from executor.sweep import doomed_blocking

log = lazylog.get_logger(__name__)

TIMEOUT_EXIT_CODE = 124
# After a run's deadline, the kill may take this long before the result is returned anyway; after a failed
# status, the OOM check this long. Both keep a run within its timeout + 2 s.
KILL_GRACE_S = 1.5
STATUS_GRACE_S = 1.5
# How long a removal is seen through on a slow daemon before it is left to the next start-up's sweep.
REMOVE_PATIENCE_S = 60.0
# A positive health check is trusted this long; any daemon error during a run forgets it at once.
HEALTH_TTL_S = 10.0
RECV_CHUNK = 65536
# What a run sees when its container or the daemon disappears under it.
LOST_CONTAINER_ERRORS = (
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    docker.errors.DockerException,
    requests.RequestException,
    OSError,
)


class DockerSandbox:
    def __init__(
        self,
        policy: ExecutorPolicy,
        *,
        node_label: str,
        backend: SandboxBackend | None = None,
        base_url: str | None = None,
        docker_api: DockerApi | None = None,
        background: trio.Nursery | None = None,
    ) -> None:
        self.policy = policy
        self.node_label = node_label
        self.backend: SandboxBackend = backend or RuncBackend()
        # Finished containers are removed in this nursery, after the result has been returned. Without one,
        # removal happens before `run` returns.
        self._background = background
        # The executor's sandboxes of several tiers share one line to the daemon (its limiter and clients).
        self._owns_docker = docker_api is None
        self.docker = docker_api or DockerApi(base_url)
        self._healthy_until = -math.inf
        self.pending_removals = 0
        # The last canary's verdict: None until one ran. A tier whose canary failed takes no runs until one passes.
        self.last_canary: SandboxHealth | None = None

    @property
    def tier(self) -> Tier:
        return self.backend.tier

    @property
    def withdrawn(self) -> bool:
        return self.last_canary is not None and not self.last_canary.ok

    def close(self) -> None:
        """Close the connections to the daemon, if they are this sandbox's own (the owner calls this once its
        removals are done)."""
        if self._owns_docker:
            self.docker.close()

    # -- health ---------------------------------------------------------------------------------------------

    async def health(self) -> SandboxHealth:
        try:
            health = await self.docker.call(lambda api: health_blocking(api, self.policy, self.backend))
        except DOCKER_ERRORS as exc:  # no client could even be made (no daemon to ask the version of)
            health = SandboxHealth(False, "daemon_unreachable", f"cannot reach the Docker daemon: {exc}")
        self._healthy_until = trio.current_time() + HEALTH_TTL_S if health.ok else -math.inf
        return health

    async def ensure_ready(self) -> SandboxHealth:
        if trio.current_time() < self._healthy_until:
            return SandboxHealth(True, "ok", "recently checked")
        return await self.health()

    async def canary(self) -> SandboxHealth:
        """A real run of this tier proving the policy from inside (executor/canary.py): the memory, pids and CPU
        limits, nofile and nproc, its own uid and gid, no capabilities, no new privileges, a seccomp filter, a
        read-only root and only `lo`; under gVisor also the sandbox's host cgroup. Its verdict is kept
        (`last_canary`): a tier that fails it takes no runs until one passes."""
        verdict = await run_canary(self)
        self.last_canary = verdict
        if not verdict.ok:
            log.warning("sandbox.canary_failed", tier=self.tier, reason=verdict.reason, detail=verdict.detail)
        return verdict

    def forget_health(self) -> None:
        """A daemon error was seen: the next run asks the daemon again."""
        self._healthy_until = -math.inf

    # -- containers -----------------------------------------------------------------------------------------

    async def start(
        self, limits: Limits, *, role: str, prestart: Language | None = None, accept_warnings: bool = False
    ) -> StartedContainer:
        """Create, attach and start one container, its interpreter for `prestart` started at once when given.
        Raises SandboxUnavailable (a daemon that went away mid-call included).

        A container the daemon created with a limit discarded is removed at once (SandboxUnavailable), unless
        `accept_warnings` (the canary's, which reads from inside what the daemon really did).
        Shielded: a container that exists must reach our hands, or it would leak when a cancel lands mid-call.
        """
        with trio.CancelScope(shield=True):
            try:
                made = await self.docker.call(
                    lambda api: start_blocking(
                        api, self.policy, self.backend, self.node_label, limits, role, prestart, accept_warnings
                    ),
                    guarded=True,
                )
            except DOCKER_ERRORS as exc:  # the daemon went away before the call reached it (its socket refused)
                raise SandboxUnavailable(f"cannot reach the Docker daemon: {exc}") from exc
            except GuardianUnavailable as exc:
                raise SandboxUnavailable(str(exc)) from exc
        container_id, raw, uid, warnings = made
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(raw))
        return StartedContainer(
            container_id,
            limits,
            stream,
            raw,
            prestarted=prestart,
            parking=prestart is not None,
            uid=uid,
            warnings=warnings,
        )

    async def run(
        self,
        request: ExecRequest | PreparedRequest,
        limits: Limits,
        *,
        source: ContainerSource | None = None,
        control: RunControl | None = None,
    ) -> ExecResult:
        """Run `request` with already clamped `limits`, in a pooled container from `source` if it has one.
        `control` may stop the run (its output so far is kept) and watch its output (executor/runcontrol.py)."""
        started_at = trio.current_time()
        nonce = new_nonce()
        prepared = prepare_request(request, self.policy)
        if isinstance(prepared, ExecResult):
            return prepared
        payload = encode_payload(prepared.language, prepared.code, prepared.input_json, limits.timeout_ms, nonce)
        # A pooled container passed the health check when it was made (the pool checks before each start),
        # so the hot path asks the daemon nothing before the task is sent.
        if source is not None and (pooled := source.take(limits, prepared.language)) is not None:
            try:
                return await self.drive(pooled, payload, nonce, limits, started_at, control)
            finally:
                source.returned(pooled)
        health = await self.ensure_ready()
        if not health.ok:
            return _unavailable(f"{health.reason}: {health.detail}", started_at)
        try:
            prestart = prepared.language if self.policy.prestart else None
            started = await self.start(limits, role="cold", prestart=prestart)
        except SandboxUnavailable as exc:
            self._healthy_until = -math.inf
            return _unavailable(str(exc), started_at)
        return await self.drive(started, payload, nonce, limits, started_at, control)

    async def drive(
        self,
        started: StartedContainer,
        payload: bytes,
        nonce: str,
        limits: Limits,
        started_at: float,
        control: RunControl | None = None,
    ) -> ExecResult:
        container_id = started.container_id
        on_output = None if control is None else control.on_output
        output = AttachDemuxer(self.policy.stdout_cap, self.policy.stderr_cap, nonce=nonce, on_output=on_output)
        status_from_docker = False
        stop = trio.CancelScope()
        if control is not None:
            control.attach(stop, container_id)
        try:
            with trio.move_on_after(limits.timeout_ms / 1000) as deadline, stop:
                if started.parking:  # a cold container: its interpreter is starting now, as it would on arrival
                    await started.wait_parked()
                await started.stream.send_all(payload)
                while output.exit_status is None and (data := await started.stream.receive_some(RECV_CHUNK)):
                    output.feed(data)
                if output.exit_status is None:
                    # End of stream without both trailers: the supervisor itself was killed (OOM, the daemon).
                    # Docker has the status.
                    status = await self._wait(container_id, timeout=limits.timeout_ms / 1000 + API_TIMEOUT_S)
                    status_from_docker = True
                else:
                    status = output.exit_status
            # Our end of the attach closes before anything else is asked of the daemon: a socket that is open and
            # no longer read blocks dockerd's copy of the output, and with it kill and inspect (a 3 s run under an
            # output flood took 23 s).
            started.close()
            output.finish()  # bytes held back as a possible trailer are output after all
            if stop.cancelled_caught:  # stopped by its caller (a cancel): killed, with what it printed so far
                await self.kill_within(container_id)
                return _result(output, started_at, exit_code=None, kind=ErrorKind.ABORTED)
            if deadline.cancelled_caught:
                await self.kill_within(container_id)
                return _result(output, started_at, exit_code=TIMEOUT_EXIT_CODE, kind=ErrorKind.TIMEOUT)
            if status == 0:
                return _result(output, started_at, exit_code=0, kind=None)
            oom_killed = await self._oom_killed(container_id, ended=status_from_docker)
            kind = ErrorKind.MEMORY_EXCEEDED if oom_killed else ErrorKind.EXECUTION_FAILED
            return _result(output, started_at, exit_code=status, kind=kind)
        except trio.Cancelled:
            started.close()
            await self.kill_within(container_id)
            raise
        except LOST_CONTAINER_ERRORS as exc:
            self._healthy_until = -math.inf
            started.close()
            await self.kill_within(container_id)
            log.warning("sandbox.lost", container=container_id[:12], error=repr(exc))
            output.finish()
            partial = _unavailable(f"lost the container mid-run: {exc!r}", started_at)
            return partial.replace(stdout=output.stdout.text(), stdout_truncated=output.stdout.truncated)
        finally:
            if control is not None:
                control.detach()
            started.close()
            await self.dispose(container_id)

    async def _wait(self, container_id: str, *, timeout: float) -> int:
        """The container's exit status. Abandoned on cancellation; bounded by `timeout` either way."""
        return await self.docker.call(lambda api: wait_blocking(api, container_id, timeout), abandon_on_cancel=True)

    async def _oom_killed(self, container_id: str, *, ended: bool) -> bool:
        """Whether the daemon saw an OOM kill; False when it cannot say within STATUS_GRACE_S."""
        with trio.move_on_after(STATUS_GRACE_S):
            if not ended:
                # The container ends right after its trailer; once it has, the daemon has processed any OOM event.
                await self._wait(container_id, timeout=STATUS_GRACE_S)
            return await self.docker.call(lambda api: oom_killed_blocking(api, container_id), abandon_on_cancel=True)
        log.warning("sandbox.status_slow", container=container_id[:12], grace_s=STATUS_GRACE_S)
        return False

    async def kill_within(self, container_id: str) -> None:
        """Kill the container, waiting at most KILL_GRACE_S (shielded: it runs on cancellation too). Never raises.

        A kill that takes longer goes on alone, bounded by its own API timeout; the removal that follows in the
        background uses force and gets there either way.
        """
        with trio.CancelScope(shield=True), trio.move_on_after(KILL_GRACE_S) as grace:
            try:
                await self.docker.call(lambda api: kill_blocking(api, container_id), abandon_on_cancel=True)
            except DOCKER_ERRORS as exc:
                log.warning("sandbox.kill_failed", container=container_id[:12], error=repr(exc))
        if grace.cancelled_caught:
            log.warning("sandbox.kill_slow", container=container_id[:12], grace_s=KILL_GRACE_S)

    @property
    def has_background(self) -> bool:
        return self._background is not None

    def dispose_soon(self, container_id: str) -> None:
        """Schedule removal in the background nursery (which must exist). Never raises."""
        assert self._background is not None
        try:
            self._background.start_soon(self._remove, container_id)
        except RuntimeError:
            log.warning("sandbox.remove_skipped", container=container_id[:12], reason="owner closed")

    async def dispose(self, container_id: str) -> None:
        """Remove a container, in the background nursery when there is one. Never raises."""
        if self._background is not None:
            try:
                self._background.start_soon(self._remove, container_id)
                return
            except RuntimeError:  # the nursery is closing: remove it here instead
                pass
        with trio.CancelScope(shield=True):
            await self._remove(container_id)

    async def sweep_dead_owners(self) -> int:
        """Schedule the removal of every edgecoder container whose owner is dead (executor/owner.py), whichever
        node label it carries. Returns how many. Raises the daemon's errors: the caller decides what they mean."""
        doomed = await self.docker.call(doomed_blocking)
        for container_id in doomed:
            await self.dispose(container_id)
        return len(doomed)

    async def _remove(self, container_id: str) -> None:
        self.pending_removals += 1
        try:
            # Shielded: the owner's nursery may be cancelled (an exception, Ctrl-C) with removals still queued, and
            # a removal is bounded anyway (API_TIMEOUT_S).
            with trio.CancelScope(shield=True):
                await self._remove_until_gone(container_id)
        except DOCKER_ERRORS as exc:
            # Left for the labelled sweep at the next start-up.
            log.warning("sandbox.remove_failed", container=container_id[:12], error=repr(exc))
        finally:
            self.pending_removals -= 1

    async def _remove_until_gone(self, container_id: str) -> None:
        """Remove, and on a busy daemon see it through: a removal that timed out (a gVisor sandbox of fifty processes
        took over 20 s on a loaded machine) goes on inside the daemon, so ask again, and wait until the container is
        gone, for at most REMOVE_PATIENCE_S. Raises the daemon's errors past that."""
        deadline = trio.current_time() + REMOVE_PATIENCE_S
        while True:
            try:
                if await self.docker.call(lambda api: remove_blocking(api, container_id)):
                    return
            except (requests.Timeout, docker.errors.APIError):
                if trio.current_time() >= deadline:
                    raise
            if trio.current_time() >= deadline:
                raise requests.Timeout(f"container {container_id[:12]} still there after {REMOVE_PATIENCE_S:g} s")
            await trio.sleep(0.5)


def _elapsed_ms(started_at: float) -> int:
    return int((trio.current_time() - started_at) * 1000)


def _result(output: AttachDemuxer, started_at: float, *, exit_code: int | None, kind: ErrorKind | None) -> ExecResult:
    queue_reason: QueueReason | None = None
    if kind is ErrorKind.ABORTED:
        queue_reason = QueueReason.ABORTED
    elif kind is ErrorKind.TIMEOUT:
        queue_reason = QueueReason.TIMEOUT
    elif kind is ErrorKind.MEMORY_EXCEEDED:
        queue_reason = QueueReason.MEMORY
    return ExecResult(
        ok=kind is None,
        stdout=output.stdout.text(),
        stderr=output.stderr.text(),
        exit_code=exit_code,
        duration_ms=_elapsed_ms(started_at),
        queue_for_cloud=queue_reason is not None,
        queue_reason=queue_reason,
        error_kind=kind,
        stdout_truncated=output.stdout.truncated,
        stderr_truncated=output.stderr.truncated,
    )


def _unavailable(detail: str, started_at: float) -> ExecResult:
    return ExecResult(
        ok=False,
        stderr=f"sandbox unavailable: {detail}",
        duration_ms=_elapsed_ms(started_at),
        queue_for_cloud=True,
        queue_reason=QueueReason.SANDBOX_UNAVAILABLE,
        error_kind=ErrorKind.SANDBOX_VIOLATION,
    )
