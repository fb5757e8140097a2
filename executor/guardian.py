"""The guardian: a small process that outlives its owner, to remove the containers the owner leaves behind.

A container cannot be removed by the daemon when it exits (AutoRemove): the executor inspects a failed run's
container afterwards, to tell an OOM kill from a crash, and an auto-removed container is gone by then. And a
process killed with SIGKILL (or SIGTERM, whose default action runs no cleanup) removes nothing. So before its
first container, every process that creates containers starts one guardian per daemon (`ensure_guardian`): a
child in a session of its own (a Ctrl-C at the terminal, or a signal to the owner's process group, leaves it
alone) whose stdin is a pipe only the owner holds. Whatever ends the owner, the kernel closes that pipe; the
guardian reads end of file and force-removes every container labelled with the owner's `edgecoder.owner`
(executor/owner.py), running ones included, within a second or so of the death. A guardian that was itself
killed leaves the rest to the start-up sweep of the next edgecoder process (executor/sweep.py).

Run as `python -I guardian.py <daemon url or ""> <owner label>`: this file imports nothing of the executor
package at module level, so that the child loads only the Docker SDK, and only once its owner is gone.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import docker

# The exit status when the daemon could not be reached to remove them (the start-up sweep then will).
UNREACHABLE = 3


@dataclass(frozen=True, slots=True)
class _Guardian:
    """A running guardian: its pid, and the write end of its stdin pipe, held (never written) for the owner's life.

    Spawned with os.posix_spawn, not subprocess.Popen: the guardian is meant to outlive this process, and a Popen
    still running at interpreter exit is reported as a leak (ResourceWarning) by its finaliser."""

    pid: int
    pipe: int

    def running(self) -> bool:
        try:
            pid, _ = os.waitpid(self.pid, os.WNOHANG)  # reaps a guardian that died, so none is left a zombie
        except ChildProcessError:
            return False
        return pid == 0


_lock = threading.Lock()
# (owner pid, daemon url) -> the guardian watching that owner's containers on that daemon. Kept for the process's
# life: closing its pipe would make the guardian remove the owner's running containers.
_guardians: dict[tuple[int, str], _Guardian] = {}


class GuardianUnavailable(Exception):
    """The guardian could not be started: no container may be created without one."""


def ensure_guardian(base_url: str | None) -> None:
    """Start this process's guardian for the daemon at `base_url` (DOCKER_HOST's when None), unless it runs.
    Blocking (a fork and exec): call it from a worker thread. Raises GuardianUnavailable."""
    from executor.owner import OWNER_LABEL, this_process

    url = base_url or ""  # "": the environment's daemon (DOCKER_HOST, DOCKER_TLS_VERIFY...), as DockerApi's
    key = (os.getpid(), url)  # by pid: a forked child is an owner of its own
    with _lock:
        guardian = _guardians.get(key)
        if guardian is not None and guardian.running():
            return
        if guardian is not None:
            os.close(guardian.pipe)
        _guardians[key] = _spawn([sys.executable, "-I", __file__, url, f"{OWNER_LABEL}={this_process().label}"])


def _spawn(argv: list[str]) -> _Guardian:
    """Start the guardian in a session of its own, its stdin the read end of a pipe whose write end only this
    process holds (os.pipe's ends are not inherited by other children), its stdout and stderr /dev/null."""
    try:
        read_end, write_end = os.pipe()
    except OSError as exc:
        raise GuardianUnavailable(f"cannot start the container guardian: {exc}") from exc
    try:
        pid = os.posix_spawn(
            argv[0],
            argv,
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, read_end, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
            ],
            setsid=True,
        )
    except OSError as exc:
        os.close(write_end)
        raise GuardianUnavailable(f"cannot start the container guardian: {exc}") from exc
    finally:
        os.close(read_end)
    return _Guardian(pid, write_end)


def remove_owned_blocking(api: docker.APIClient, owner_filter: str) -> int:
    """Force-remove every container (running or not) that carries `owner_filter` (`edgecoder.owner=<label>`).
    Returns how many were removed."""
    import docker.errors

    removed = 0
    for container in api.containers(all=True, filters={"label": owner_filter}):
        try:
            api.remove_container(container["Id"], force=True)
        except docker.errors.NotFound:
            continue  # removed meanwhile
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: a removal already in progress, which gets there by itself
                raise
        removed += 1
    return removed


def main(argv: list[str]) -> int:
    base_url, owner_filter = argv
    while os.read(0, 4096):  # the owner never writes: this returns b"" once its end is closed, however it ended
        pass
    import docker
    import docker.errors
    import docker.utils
    import requests

    try:
        kwargs = {"base_url": base_url} if base_url else docker.utils.kwargs_from_env()
        with docker.APIClient(**{**kwargs, "version": "auto", "timeout": 20}) as api:
            remove_owned_blocking(api, owner_filter)
    except (docker.errors.DockerException, requests.RequestException, OSError):
        return UNREACHABLE
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
