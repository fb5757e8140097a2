"""A sandbox container at the daemon: the container started and waiting for its task (`StartedContainer`), and the
Docker SDK's blocking calls that make, watch, kill and remove one (always run in worker threads through
`DockerApi.call`; executor/sandbox.py drives a run with them)."""

from __future__ import annotations

import secrets
import socket
import ssl
from dataclasses import dataclass, field
from typing import Any, Protocol

import docker
import docker.errors
import requests
import trio

from executor import lazylog
from executor.backends import SandboxBackend
from executor.bootstrap import NOT_PARKED, PARKED, encode_prestart
from executor.container_config import NODE_LABEL, SANDBOX_UID_BASE, SANDBOX_UID_COUNT, build_container_config
from executor.contract import Language, Limits
from executor.output import FRAME_HEADER, STDOUT
from executor.owner import OWNER_LABEL, this_process
from executor.policy import ExecutorPolicy

log = lazylog.get_logger("executor.sandbox")

ROLE_LABEL = "edgecoder.role"

# Everything the SDK raises when the daemon is missing or misbehaves (requests' errors are OSErrors too).
DOCKER_ERRORS: tuple[type[BaseException], ...] = (
    docker.errors.DockerException,
    requests.RequestException,
    OSError,
)


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


def start_blocking(
    api: docker.APIClient,
    policy: ExecutorPolicy,
    backend: SandboxBackend,
    node_label: str,
    limits: Limits,
    role: str,
    prestart: Language | None,
    accept_warnings: bool,
) -> tuple[str, socket.socket, int, tuple[str, ...]]:
    """Create, attach and start one container (raises SandboxUnavailable): its id, our own attach socket, its uid
    and the daemon's warnings."""
    uid = new_uid()
    try:
        labels = {NODE_LABEL: node_label, ROLE_LABEL: role, OWNER_LABEL: this_process().label}
        config = build_container_config(limits, policy, labels=labels, uid=uid, backend=backend)
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
            remove_blocking(api, container_id)
        except DOCKER_ERRORS:
            pass
        raise SandboxUnavailable(f"the daemon discarded a limit of the sandbox: {'; '.join(discarded)}")
    raw: socket.socket | None = None
    try:
        # Attach before start, so not one byte of output can be missed.
        attached = api.attach_socket(container_id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
        raw = own_socket(attached)
        api.start(container_id)
        if prestart is not None:
            raw.sendall(encode_prestart(prestart))  # 16 bytes into an empty socket buffer: never blocks
    except BaseException as exc:
        if raw is not None:
            raw.close()
        try:
            remove_blocking(api, container_id)
        except DOCKER_ERRORS:
            pass
        if isinstance(exc, DOCKER_ERRORS):
            raise SandboxUnavailable(f"cannot start a container: {exc}") from exc
        raise
    return container_id, raw, uid, warnings


def wait_blocking(api: docker.APIClient, container_id: str, timeout: float) -> int:
    return int(api.wait(container_id, timeout=timeout)["StatusCode"])


def oom_killed_blocking(api: docker.APIClient, container_id: str) -> bool:
    state = api.inspect_container(container_id).get("State") or {}
    return bool(state.get("OOMKilled"))


def kill_blocking(api: docker.APIClient, container_id: str) -> None:
    try:
        api.kill(container_id)
    except docker.errors.APIError as exc:
        if exc.status_code not in (404, 409):  # already gone, or no longer running: both fine
            raise


def remove_blocking(api: docker.APIClient, container_id: str) -> bool:
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


def new_uid() -> int:
    """A uid of the sandbox range for a new container. Drawn at random: executors share no registry, and with
    k containers alive on the daemon a draw collides with probability k / 2**20 (under 1e-5 for 10)."""
    return SANDBOX_UID_BASE + secrets.randbelow(SANDBOX_UID_COUNT)


def own_socket(attached: Any) -> socket.socket:
    """Our own duplicate of the attach connection's socket (the SDK wraps it in a SocketIO)."""
    sock = getattr(attached, "_sock", attached)
    try:
        if isinstance(sock, ssl.SSLSocket) or not isinstance(sock, socket.socket):
            raise SandboxUnavailable(f"unsupported Docker transport for attach: {type(sock).__name__}")
        return sock.dup()
    finally:
        attached.close()
        sock.close()
