"""Whether a sandbox tier can take runs: the daemon check (daemon, image, image user, runtime) and the canary, a
real run of the tier that proves the policy from inside (executor/canary.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import docker
import docker.errors
import trio

from executor import canary as canary_probe
from executor.backends import SandboxBackend
from executor.bootstrap import encode_payload, new_nonce
from executor.container_config import NOFILE, PIDS_LIMIT
from executor.containers import DISCARDED, DOCKER_ERRORS, SandboxUnavailable
from executor.contract import ExecRequest
from executor.policy import ExecutorPolicy
from executor.request import PreparedRequest, prepare_request

if TYPE_CHECKING:
    from executor.sandbox import DockerSandbox

ACCEPTED_IMAGE_USERS = ("65534", "65534:65534")
# What reading a canary container's host cgroup may raise (a /proc line that is not one, beside the daemon's).
CANARY_HOST_ERRORS: tuple[type[BaseException], ...] = (*DOCKER_ERRORS, ValueError)


@dataclass(frozen=True, slots=True)
class SandboxHealth:
    ok: bool
    reason: str
    detail: str
    # For a canary that found a limit not enforced: the readings that did not match (executor/canary.py names).
    missing: tuple[str, ...] = ()
    # The gVisor platform the canary's sandbox really ran on (`host.platform`); None for runc, or when unread.
    platform: str | None = None


def health_blocking(api: docker.APIClient, policy: ExecutorPolicy, backend: SandboxBackend) -> SandboxHealth:
    """The daemon answers, the image is there and runs as the sandbox user, and the tier's runtime is installed."""
    try:
        api.ping()
    except DOCKER_ERRORS as exc:
        return SandboxHealth(False, "daemon_unreachable", f"cannot reach the Docker daemon: {exc}")
    image = policy.image
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
        problem = backend.daemon_problem(api.info())
    except DOCKER_ERRORS as exc:
        return SandboxHealth(False, "daemon_unreachable", f"cannot ask the daemon for its runtimes: {exc}")
    if problem is not None:
        return SandboxHealth(False, "runtime_missing", f"{backend.tier}: {problem}")
    return SandboxHealth(
        True, "ok", f"image {image} ({str(info.get('Id', ''))[:19]}) user {user}, runtime {backend.runtime}"
    )


async def run_canary(sandbox: DockerSandbox) -> SandboxHealth:
    """Run executor/canary.py's probe in one container of `sandbox`'s tier and judge what it saw from inside (and,
    where the backend has a host witness, from the host's cgroup)."""
    started_at = trio.current_time()
    limits = sandbox.policy.pool_limits
    health = await sandbox.ensure_ready()
    if not health.ok:
        return health
    prepared = prepare_request(ExecRequest("python", canary_probe.CANARY_CODE), sandbox.policy)
    assert isinstance(prepared, PreparedRequest)  # a fixed program, far inside every size bound
    nonce = new_nonce()
    payload = encode_payload(prepared.language, prepared.code, prepared.input_json, limits.timeout_ms, nonce)
    try:
        started = await sandbox.start(limits, role="canary", accept_warnings=True)
    except SandboxUnavailable as exc:
        sandbox.forget_health()
        return SandboxHealth(False, "canary_failed", f"{sandbox.tier}: {exc}")
    host: dict[str, Any] | str = {}
    if sandbox.backend.host_witness:
        try:
            host = await sandbox.docker.call(lambda api: host_readings_blocking(api, started.container_id))
        except CANARY_HOST_ERRORS as exc:
            host = f"cannot read the canary container's host cgroup: {exc}"
        except BaseException:  # cancelled before the run: the container must not outlive us
            started.close()
            with trio.CancelScope(shield=True):
                await sandbox.kill_within(started.container_id)
                await sandbox.dispose(started.container_id)
            raise
    result = await sandbox.drive(started, payload, nonce, limits, started_at)
    if not result.ok:
        return SandboxHealth(False, "canary_failed", f"{sandbox.tier}: {result.error_kind}: {result.stderr[-500:]}")
    seen = canary_probe.parse_output(result.stdout)
    if seen is None:
        return SandboxHealth(False, "canary_failed", f"{sandbox.tier}: unreadable output {result.stdout[:200]!r}")
    if isinstance(host, str):
        seen["host"] = host  # why the host side could not be read: every host reading stays missing
    else:
        seen.update(host)
    expected = canary_probe.expected_everywhere(
        uid=started.uid, nofile=NOFILE, nproc=PIDS_LIMIT, network=sandbox.policy.allow_network
    )
    expected.update(sandbox.backend.expected(limits, sandbox.policy))
    platform = seen.get("host.platform")
    findings = canary_probe.judge(seen, expected)
    discarded = [w for w in started.warnings if DISCARDED in w]
    if findings or discarded:
        detail = "; ".join([str(f) for f in findings] + [f"the daemon warned: {w}" for w in discarded])
        if isinstance(host, str):
            detail += f" (host cgroup: {host})"
        missing = tuple(f.reading for f in findings) + (("daemon.warning",) if discarded else ())
        return SandboxHealth(False, "limit_not_enforced", f"{sandbox.tier}: {detail}", missing, platform)
    return SandboxHealth(True, "ok", json.dumps(seen, sort_keys=True), platform=platform)


def host_readings_blocking(api: docker.APIClient, container_id: str) -> dict[str, Any] | str:
    """The container's host cgroup limits and its gVisor platform, read while its bootstrap waits for the task (so
    it is running, and has its stub processes)."""
    pid = int((api.inspect_container(container_id).get("State") or {}).get("Pid") or 0)
    if pid <= 0:
        return f"container {container_id[:12]} has no process"
    readings = canary_probe.host_cgroup_readings(pid, container_id)
    if isinstance(readings, dict):  # the pid is the container's (its cgroup names it): so is its platform
        readings["host.platform"] = canary_probe.sandbox_platform(pid)
    return readings
