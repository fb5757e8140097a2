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

import json
import math
import secrets
import socket
import ssl
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import docker
import docker.errors
import requests
import trio

from executor import canary as canary_probe
from executor import lazylog
from executor.backends import SandboxBackend, Tier
from executor.backends.runc import RuncBackend
from executor.bootstrap import NOT_PARKED, PARKED, encode_payload, encode_prestart, new_nonce
from executor.container_config import (
    MESH_LABEL,
    NODE_LABEL,
    NOFILE,
    PIDS_LIMIT,
    SANDBOX_UID_BASE,
    SANDBOX_UID_COUNT,
    build_container_config,
)
from executor.contract import ErrorKind, ExecRequest, ExecResult, Language, Limits, QueueReason
from executor.docker_api import API_TIMEOUT_S, DockerApi
from executor.output import FRAME_HEADER, STDOUT, AttachDemuxer
from executor.owner import OWNER_LABEL, STOPPED_GRACE_S, Owner, this_process
from executor.policy import ExecutorPolicy
from executor.runcontrol import RunControl

log = lazylog.get_logger(__name__)

ROLE_LABEL = "edgecoder.role"
TIMEOUT_EXIT_CODE = 124
# After a run's deadline, the kill may take this long before the result is returned anyway; after a failed
# status, the OOM check this long. Both keep a run within its timeout + 2 s.
KILL_GRACE_S = 1.5
STATUS_GRACE_S = 1.5
# How long a removal is seen through on a slow daemon before it is left to the next start-up's sweep.
REMOVE_PATIENCE_S = 60.0
# A positive health check is trusted this long; any daemon error during a run forgets it at once.
HEALTH_TTL_S = 10.0
ACCEPTED_IMAGE_USERS = ("65534", "65534:65534")
RECV_CHUNK = 65536

# Everything the SDK raises when the daemon is missing or misbehaves (requests' errors are OSErrors too).
DOCKER_ERRORS: tuple[type[BaseException], ...] = (
    docker.errors.DockerException,
    requests.RequestException,
    OSError,
)
# What reading a canary container's host cgroup may raise (a /proc line that is not one, beside the daemon's).
CANARY_HOST_ERRORS: tuple[type[BaseException], ...] = (*DOCKER_ERRORS, ValueError)
# What a run sees when its container or the daemon disappears under it.
LOST_CONTAINER_ERRORS = (
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    docker.errors.DockerException,
    requests.RequestException,
    OSError,
)


@dataclass(frozen=True, slots=True)
class SandboxHealth:
    ok: bool
    reason: str
    detail: str
    # For a canary that found a limit not enforced: the readings that did not match (executor/canary.py names).
    missing: tuple[str, ...] = ()


# A create warning with this word means the daemon dropped a resource setting (a limit it cannot enforce: "PIDs
# limit discarded", "Limitation discarded", "CPU CFS quota discarded"): the container would run without it.
DISCARDED = "discarded"


class SandboxUnavailable(Exception):
    """No container could be had: no daemon, no image, a bad image or a bad configuration."""


@dataclass(slots=True)
class StartedContainer:
    """A started container whose bootstrap waits on stdin for exactly one task, and our end of its attach."""

    container_id: str
    limits: Limits
    stream: trio.SocketStream
    raw: socket.socket  # the same socket, for the non-blocking liveness peek
    # The language whose interpreter the container started before its task (the prestart line), if any.
    prestarted: Language | None = None
    # The supervisor's answer to the prestart line is still to be read: nothing may be sent before it is.
    parking: bool = False
    uid: int = field(default=0, kw_only=True)  # the container's own uid (and gid), from the sandbox range
    # What the daemon said when it created the container (kept for the canary, which judges it).
    warnings: tuple[str, ...] = field(default=(), kw_only=True)

    async def wait_parked(self) -> None:
        """Read the supervisor's answer to the prestart line: the interpreter is parked, or `prestarted` becomes
        None (it died while it initialised; the task's interpreter will start on arrival). Raises
        trio.BrokenResourceError when the container ends first or answers anything else.

        Reads exactly the answer's frame (receive_some never returns more than asked), so no byte of the task's
        output can be taken with it; the supervisor writes it with one write, which Docker sends as one frame.
        """
        wanted = FRAME_HEADER.size + len(PARKED)
        answer = b""
        while len(answer) < wanted:
            chunk = await self.stream.receive_some(wanted - len(answer))
            if not chunk:
                raise trio.BrokenResourceError("the container ended before its interpreter was parked")
            answer += chunk
        if FRAME_HEADER.unpack(answer[: FRAME_HEADER.size]) != (STDOUT, len(PARKED)):
            raise trio.BrokenResourceError(f"unexpected output before the task: {answer!r}")
        said = answer[FRAME_HEADER.size :]
        if said not in (PARKED, NOT_PARKED):
            raise trio.BrokenResourceError(f"unexpected output before the task: {answer!r}")
        if said == NOT_PARKED:
            log.warning("sandbox.not_parked", container=self.container_id[:12], language=self.prestarted)
            self.prestarted = None
        self.parking = False

    def close(self) -> None:
        """Close our end of the attach connection (idempotent). A waiting bootstrap then ends: StdinOnce."""
        self.stream.socket.close()

    def looks_alive(self) -> bool:
        """True while the attach connection is open and silent, as a waiting bootstrap's is."""
        try:
            self.raw.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return False  # end of file, or bytes from a bootstrap that should still be silent


class ContainerSource(Protocol):
    def take(self, limits: Limits, language: Language) -> StartedContainer | None: ...

    def returned(self, container: StartedContainer) -> None: ...


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
            health = await self.docker.call(self._health_blocking)
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
        verdict = await self._canary()
        self.last_canary = verdict
        if not verdict.ok:
            log.warning("sandbox.canary_failed", tier=self.tier, reason=verdict.reason, detail=verdict.detail)
        return verdict

    async def _canary(self) -> SandboxHealth:
        started_at = trio.current_time()
        limits = self.policy.pool_limits
        health = await self.ensure_ready()
        if not health.ok:
            return health
        prepared = prepare_request(ExecRequest("python", canary_probe.CANARY_CODE), self.policy)
        assert isinstance(prepared, PreparedRequest)  # a fixed program, far inside every size bound
        nonce = new_nonce()
        payload = encode_payload(prepared.language, prepared.code, prepared.input_json, limits.timeout_ms, nonce)
        try:
            started = await self.start(limits, role="canary", accept_warnings=True)
        except SandboxUnavailable as exc:
            self._healthy_until = -math.inf
            return SandboxHealth(False, "canary_failed", f"{self.tier}: {exc}")
        host: dict[str, Any] | str = {}
        if self.backend.host_witness:
            try:
                host = await self.docker.call(lambda api: self._host_readings_blocking(api, started.container_id))
            except CANARY_HOST_ERRORS as exc:
                host = f"cannot read the canary container's host cgroup: {exc}"
            except BaseException:  # cancelled before the run: the container must not outlive us
                started.close()
                with trio.CancelScope(shield=True):
                    await self._kill_within(started.container_id)
                    await self.dispose(started.container_id)
                raise
        result = await self._drive(started, payload, nonce, limits, started_at)
        if not result.ok:
            return SandboxHealth(False, "canary_failed", f"{self.tier}: {result.error_kind}: {result.stderr[-500:]}")
        seen = canary_probe.parse_output(result.stdout)
        if seen is None:
            return SandboxHealth(False, "canary_failed", f"{self.tier}: unreadable output {result.stdout[:200]!r}")
        if isinstance(host, str):
            seen["host"] = host  # why the host side could not be read: every host reading stays missing
        else:
            seen.update(host)
        expected = canary_probe.expected_everywhere(
            uid=started.uid, nofile=NOFILE, nproc=PIDS_LIMIT, network=self.policy.allow_network
        )
        expected.update(self.backend.expected(limits, self.policy))
        findings = canary_probe.judge(seen, expected)
        discarded = [w for w in started.warnings if DISCARDED in w]
        if findings or discarded:
            detail = "; ".join([str(f) for f in findings] + [f"the daemon warned: {w}" for w in discarded])
            if isinstance(host, str):
                detail += f" (host cgroup: {host})"
            missing = tuple(f.reading for f in findings) + (("daemon.warning",) if discarded else ())
            return SandboxHealth(False, "limit_not_enforced", f"{self.tier}: {detail}", missing)
        return SandboxHealth(True, "ok", json.dumps(seen, sort_keys=True))

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
                    lambda api: self._start_blocking(api, limits, role, prestart, accept_warnings)
                )
            except DOCKER_ERRORS as exc:  # the daemon went away before the call reached it (its socket refused)
                raise SandboxUnavailable(f"cannot reach the Docker daemon: {exc}") from exc
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
                return await self._drive(pooled, payload, nonce, limits, started_at, control)
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
        return await self._drive(started, payload, nonce, limits, started_at, control)

    async def _drive(
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
            control.attach(stop)
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
                await self._kill_within(container_id)
                return _result(output, started_at, exit_code=None, kind=ErrorKind.ABORTED)
            if deadline.cancelled_caught:
                await self._kill_within(container_id)
                return _result(output, started_at, exit_code=TIMEOUT_EXIT_CODE, kind=ErrorKind.TIMEOUT)
            if status == 0:
                return _result(output, started_at, exit_code=0, kind=None)
            oom_killed = await self._oom_killed(container_id, ended=status_from_docker)
            kind = ErrorKind.MEMORY_EXCEEDED if oom_killed else ErrorKind.EXECUTION_FAILED
            return _result(output, started_at, exit_code=status, kind=kind)
        except trio.Cancelled:
            started.close()
            await self._kill_within(container_id)
            raise
        except LOST_CONTAINER_ERRORS as exc:
            self._healthy_until = -math.inf
            started.close()
            await self._kill_within(container_id)
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
        return await self.docker.call(
            lambda api: self._wait_blocking(api, container_id, timeout), abandon_on_cancel=True
        )

    async def _oom_killed(self, container_id: str, *, ended: bool) -> bool:
        """Whether the daemon saw an OOM kill; False when it cannot say within STATUS_GRACE_S."""
        with trio.move_on_after(STATUS_GRACE_S):
            if not ended:
                # The container ends right after its trailer; once it has, the daemon has processed any OOM event.
                await self._wait(container_id, timeout=STATUS_GRACE_S)
            return await self.docker.call(
                lambda api: self._oom_killed_blocking(api, container_id), abandon_on_cancel=True
            )
        log.warning("sandbox.status_slow", container=container_id[:12], grace_s=STATUS_GRACE_S)
        return False

    async def _kill_within(self, container_id: str) -> None:
        """Kill the container, waiting at most KILL_GRACE_S (shielded: it runs on cancellation too). Never raises.

        A kill that takes longer goes on alone, bounded by its own API timeout; the removal that follows in the
        background uses force and gets there either way.
        """
        with trio.CancelScope(shield=True), trio.move_on_after(KILL_GRACE_S) as grace:
            try:
                await self.docker.call(lambda api: self._kill_blocking(api, container_id), abandon_on_cancel=True)
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
        doomed = await self.docker.call(self._doomed_blocking)
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
                if await self.docker.call(lambda api: self._remove_blocking(api, container_id)):
                    return
            except (requests.Timeout, docker.errors.APIError):
                if trio.current_time() >= deadline:
                    raise
            if trio.current_time() >= deadline:
                raise requests.Timeout(f"container {container_id[:12]} still there after {REMOVE_PATIENCE_S:g} s")
            await trio.sleep(0.5)

    # -- blocking SDK calls, always in worker threads --------------------------------------------------------

    def _health_blocking(self, api: docker.APIClient) -> SandboxHealth:
        try:
            api.ping()
        except DOCKER_ERRORS as exc:
            return SandboxHealth(False, "daemon_unreachable", f"cannot reach the Docker daemon: {exc}")
        image = self.policy.image
        try:
            info = api.inspect_image(image)
        except docker.errors.ImageNotFound:
            return SandboxHealth(False, "image_missing", f"image {image} is not present: run `edgecoder image build`")
        except DOCKER_ERRORS as exc:
            return SandboxHealth(False, "daemon_unreachable", f"cannot inspect image {image}: {exc}")
        user = (info.get("Config") or {}).get("User") or ""
        if user not in ACCEPTED_IMAGE_USERS:
            return SandboxHealth(False, "image_user", f"image {image} runs as {user or 'root'!r}, not 65534:65534")
        try:
            problem = self.backend.daemon_problem(api.info())
        except DOCKER_ERRORS as exc:
            return SandboxHealth(False, "daemon_unreachable", f"cannot ask the daemon for its runtimes: {exc}")
        if problem is not None:
            return SandboxHealth(False, "runtime_missing", f"{self.tier}: {problem}")
        return SandboxHealth(
            True, "ok", f"image {image} ({str(info.get('Id', ''))[:19]}) user {user}, runtime {self.backend.runtime}"
        )

    def _start_blocking(
        self, api: docker.APIClient, limits: Limits, role: str, prestart: Language | None, accept_warnings: bool
    ) -> tuple[str, socket.socket, int, tuple[str, ...]]:
        uid = self._new_uid()
        try:
            labels = {NODE_LABEL: self.node_label, ROLE_LABEL: role, OWNER_LABEL: this_process().label}
            config = build_container_config(limits, self.policy, labels=labels, uid=uid, backend=self.backend)
        except (OSError, ValueError) as exc:
            raise SandboxUnavailable(f"bad sandbox configuration: {exc}") from exc
        try:
            created = api.create_container(**config)
        except DOCKER_ERRORS as exc:
            raise SandboxUnavailable(f"cannot create a container: {exc}") from exc
        container_id: str = created["Id"]
        warnings = tuple(str(w) for w in created.get("Warnings") or ())
        discarded = [w for w in warnings if DISCARDED in w]
        if discarded and not accept_warnings:
            try:
                self._remove_blocking(api, container_id)
            except DOCKER_ERRORS:
                pass
            raise SandboxUnavailable(f"the daemon discarded a limit of the sandbox: {'; '.join(discarded)}")
        raw: socket.socket | None = None
        try:
            # Attach before start, so not one byte of output can be missed.
            attached = api.attach_socket(container_id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            raw = _own_socket(attached)
            api.start(container_id)
            if prestart is not None:
                raw.sendall(encode_prestart(prestart))  # 16 bytes into an empty socket buffer: never blocks
        except BaseException as exc:
            if raw is not None:
                raw.close()
            try:
                self._remove_blocking(api, container_id)
            except DOCKER_ERRORS:
                pass
            if isinstance(exc, DOCKER_ERRORS):
                raise SandboxUnavailable(f"cannot start a container: {exc}") from exc
            raise
        return container_id, raw, uid, warnings

    def _host_readings_blocking(self, api: docker.APIClient, container_id: str) -> dict[str, Any] | str:
        """The container's host cgroup limits, read while its bootstrap waits for the task (so it is running)."""
        pid = int((api.inspect_container(container_id).get("State") or {}).get("Pid") or 0)
        if pid <= 0:
            return f"container {container_id[:12]} has no process"
        return canary_probe.host_cgroup_readings(pid, container_id)

    def _wait_blocking(self, api: docker.APIClient, container_id: str, timeout: float) -> int:
        return int(api.wait(container_id, timeout=timeout)["StatusCode"])

    def _oom_killed_blocking(self, api: docker.APIClient, container_id: str) -> bool:
        state = api.inspect_container(container_id).get("State") or {}
        return bool(state.get("OOMKilled"))

    def _kill_blocking(self, api: docker.APIClient, container_id: str) -> None:
        try:
            api.kill(container_id)
        except docker.errors.APIError as exc:
            if exc.status_code not in (404, 409):  # already gone, or no longer running: both fine
                raise

    def _remove_blocking(self, api: docker.APIClient, container_id: str) -> bool:
        """True once the container is gone; False while the daemon is still removing it (409)."""
        try:
            api.remove_container(container_id, force=True)
        except docker.errors.NotFound:
            return True
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress
                raise
            return False
        return True

    def _new_uid(self) -> int:
        """A uid of the sandbox range for a new container. Drawn at random: executors share no registry, and with
        k containers alive on the daemon a draw collides with probability k / 2**20 (under 1e-5 for 10)."""
        return SANDBOX_UID_BASE + secrets.randbelow(SANDBOX_UID_COUNT)

    def _doomed_blocking(self, api: docker.APIClient) -> list[str]:
        here = this_process()
        now = time.time()
        doomed = []
        for container in api.containers(all=True, filters={"label": f"{MESH_LABEL}=1"}):
            owner = Owner.parse((container.get("Labels") or {}).get(OWNER_LABEL))
            alive = None if owner is None else owner.alive(here)
            if alive is False or (
                # An owner that cannot be judged from here: only what has been stopped for a while.
                alive is None
                and container.get("State") in ("created", "exited", "dead")
                and now - self._stopped_at_blocking(api, container) > STOPPED_GRACE_S
            ):
                doomed.append(container["Id"])
        return doomed

    def _stopped_at_blocking(self, api: docker.APIClient, container: dict[str, Any]) -> float:
        if container.get("State") == "created":  # never started
            return float(container.get("Created") or 0)
        try:
            finished = (api.inspect_container(container["Id"]).get("State") or {}).get("FinishedAt") or ""
            return datetime.fromisoformat(finished).timestamp()
        except docker.errors.NotFound:  # its owner removed it meanwhile: nothing to sweep
            return math.inf
        except ValueError:
            return float(container.get("Created") or 0)


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """A request whose sizes were checked: code and input as the bytes that travel into the sandbox."""

    language: Language
    code: bytes
    input_json: bytes


def prepare_request(request: ExecRequest | PreparedRequest, policy: ExecutorPolicy) -> PreparedRequest | ExecResult:
    """The request as bytes within the policy's sizes, or the result explaining why not.

    The code's length is judged before it is encoded (a str never encodes to fewer bytes than it has
    characters), and before anything parses it.
    """
    if isinstance(request, PreparedRequest):
        return request
    if len(request.code) > policy.max_code_bytes:
        return _rejected(f"code is {len(request.code)} characters, more than {policy.max_code_bytes} bytes")
    code = request.code.encode("utf-8", errors="surrogatepass")
    if len(code) > policy.max_code_bytes:
        return _rejected(f"code is {len(code)} bytes, more than {policy.max_code_bytes}")
    try:
        input_json = json.dumps(request.input, allow_nan=False).encode("utf-8")
    except RecursionError:
        return _rejected("input nests too deeply to encode as JSON")
    except (TypeError, ValueError) as exc:
        return _rejected(f"input is not JSON data: {exc}")
    if len(input_json) > policy.max_input_bytes:
        return _rejected(f"input is {len(input_json)} bytes of JSON, more than {policy.max_input_bytes}")
    return PreparedRequest(request.language, code, input_json)


def _own_socket(attached: Any) -> socket.socket:
    """Our own duplicate of the attach connection's socket (the SDK wraps it in a SocketIO)."""
    sock = getattr(attached, "_sock", attached)
    try:
        if isinstance(sock, ssl.SSLSocket) or not isinstance(sock, socket.socket):
            raise SandboxUnavailable(f"unsupported Docker transport for attach: {type(sock).__name__}")
        return sock.dup()
    finally:
        attached.close()
        sock.close()


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
        queue_reason=None if queue_reason is None else str(queue_reason),
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
        queue_reason=str(QueueReason.SANDBOX_UNAVAILABLE),
        error_kind=ErrorKind.SANDBOX_VIOLATION,
    )


def _rejected(why: str) -> ExecResult:
    return ExecResult(ok=False, stderr=why, error_kind=ErrorKind.EXECUTION_FAILED)
