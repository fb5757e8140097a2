"""A unix-socket relay in front of the real Docker socket, which a scenario can cut and restore.

Cutting it makes Docker unavailable to the nodes that use it (their executor is given `unix://<relay path>` as its
Docker base URL) without touching the machine's dockerd: the listener closes and every relayed connection is
closed, so health checks, canaries and runs fail exactly as with a dead daemon.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    # The installed trio-stubs know TaskStatus only from trio_typing (as in mesh/node.py).
    from trio_typing import TaskStatus

DOCKER_SOCKET = "/var/run/docker.sock"


class DockerRelay:
    def __init__(self, path: Path, nursery: trio.Nursery, target: str = DOCKER_SOCKET) -> None:
        self.path = path
        self.target = target
        self._nursery = nursery
        self._scope: trio.CancelScope | None = None
        self.cut_count = 0

    @property
    def base_url(self) -> str:
        return f"unix://{self.path}"

    @property
    def open(self) -> bool:
        return self._scope is not None

    async def restore(self) -> None:
        if self._scope is None:
            await self._nursery.start(self._serve)

    def cut(self) -> None:
        if self._scope is not None:
            self._scope.cancel()  # ends the listener and every relayed connection with it
            self._scope = None
            self.cut_count += 1

    async def _serve(self, *, task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await sock.bind(str(self.path))
        sock.listen(64)
        listener = trio.SocketListener(sock)
        with trio.CancelScope() as scope:
            self._scope = scope
            async with listener, trio.open_nursery() as nursery:
                task_status.started()
                while True:
                    client = await listener.accept()
                    nursery.start_soon(self._relay, client)

    async def _relay(self, client: trio.SocketStream) -> None:
        # The client is ours from the first line: a cut while the upstream connects (Cancelled, not OSError) used to
        # leave it to the garbage collector.
        async with client:
            try:
                upstream = await trio.open_unix_socket(self.target)
            except OSError:
                return
            await self._pipe(client, upstream)

    async def _pipe(self, client: trio.SocketStream, upstream: trio.SocketStream) -> None:
        async with upstream, trio.open_nursery() as nursery:

            async def pipe(src: trio.SocketStream, dst: trio.SocketStream) -> None:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    while data := await src.receive_some(65536):
                        await dst.send_all(data)
                nursery.cancel_scope.cancel()

            nursery.start_soon(pipe, client, upstream)
            nursery.start_soon(pipe, upstream, client)


@contextlib.asynccontextmanager
async def open_relays(directory: Path, count: int) -> AsyncIterator[list[DockerRelay]]:
    directory.mkdir(parents=True, exist_ok=True)
    async with trio.open_nursery() as nursery:
        relays = [DockerRelay(directory / f"docker-{i}.sock", nursery) for i in range(count)]
        for relay in relays:
            await relay.restore()
        yield relays
        nursery.cancel_scope.cancel()


def sweep_containers(node_labels: list[str]) -> int:
    """Remove every container (any state) that the executor labelled for these nodes, through the real daemon."""
    import docker
    import docker.errors

    from executor.container_config import NODE_LABEL

    api = docker.APIClient()
    removed = 0
    try:
        for label in node_labels:
            for container in api.containers(all=True, filters={"label": f"{NODE_LABEL}={label}"}):
                with contextlib.suppress(docker.errors.NotFound):  # its node removed it meanwhile
                    api.remove_container(container["Id"], force=True)
                    removed += 1
    finally:
        api.close()
    return removed
