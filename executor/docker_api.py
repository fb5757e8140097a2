"""DockerApi: the executor's own line to the Docker daemon.

The docker SDK blocks, so its calls run in worker threads. Three rules, each for a failure seen in review:
- A limiter of the executor's own (`DOCKER_THREADS` calls at once). A call abandoned on cancellation keeps its
  limiter token until its thread ends; with trio's shared default limiter that starved every other user of
  `trio.to_thread` in the process.
- A client per call in flight: `docker.APIClient` is a `requests.Session`, and neither library promises that one
  may be shared between threads. A call borrows an idle client (or makes one) and gives it back; so at most
  `DOCKER_THREADS` clients exist, and they are reused.
- Every request is bounded: each client has `API_TIMEOUT_S` as its timeout (connect and each read), and `wait`,
  whose SDK default is no timeout at all, is always given one by its caller. `close()` closes every client: 10
  executor cycles used to leave 122 sockets to the garbage collector.

The SDK's unix-socket transport leaks the socket of every connection attempt that fails (docker-py 7.1,
`UnixHTTPConnection.connect`; upstream PR docker/docker-py#3356 is open). So our clients connect through
`_UnixAdapter`, whose connection closes its socket when connecting fails: a call in flight when the daemon goes
away costs no socket to the garbage collector. With a unix-socket daemon the first connection, and every call after
a connection failure, is also preceded by a connection test of our own until one succeeds, so that a daemon that is
down fails fast, with one clear error.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

import docker
import docker.errors
import docker.utils
import requests
import trio
from docker.transport.unixconn import UnixHTTPAdapter, UnixHTTPConnection, UnixHTTPConnectionPool

from executor.guardian import ensure_guardian

T = TypeVar("T")

DOCKER_THREADS = 8
API_TIMEOUT_S = 20
# Only for the client that asks the daemon which version it speaks (unversioned requests); every daemon since 1.12
# accepts it.
MIN_API_VERSION = "1.24"


class DockerApi:
    def __init__(self, base_url: str | None = None, *, threads: int = DOCKER_THREADS, timeout: float = API_TIMEOUT_S):
        self._base_url = base_url
        self.timeout = timeout
        self.limiter = trio.CapacityLimiter(threads)
        self._lock = threading.Lock()
        self._idle: list[docker.APIClient] = []
        self._version: str | None = None  # negotiated once; later clients skip the version request
        self._closed = False
        host = docker.utils.parse_host(base_url or os.environ.get("DOCKER_HOST"), False)
        self._unix_path = host.removeprefix("http+unix://") if host.startswith("http+unix://") else None
        self._unreachable = True  # until a connection of our own has succeeded

    async def call(
        self, fn: Callable[[docker.APIClient], T], *, abandon_on_cancel: bool = False, guarded: bool = False
    ) -> T:
        """`fn(client)` in a worker thread, on a client no other thread is using.

        With `abandon_on_cancel`, a cancellation returns at once and the thread finishes alone (its token and its
        client come back when it does); otherwise the call must be shielded or short. `guarded`: `fn` creates
        containers, so this process's guardian for the daemon is started first (executor/guardian.py; raises
        GuardianUnavailable).
        """

        def in_thread() -> T:
            if guarded:
                ensure_guardian(self._base_url)
            self._check_reachable()
            api = self._borrow()
            try:
                return fn(api)
            except requests.ConnectionError:
                self._unreachable = True
                raise
            finally:
                self._give_back(api)

        # The stale trio-stubs package (pulled in by libp2p) predates the `abandon_on_cancel` name, hence the Any.
        run_sync: Any = trio.to_thread.run_sync
        return cast(T, await run_sync(in_thread, limiter=self.limiter, abandon_on_cancel=abandon_on_cancel))

    def close(self) -> None:
        """Close every idle client now, and every busy one when its call ends. Never raises."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for api in idle:
            api.close()

    # -- in worker threads --------------------------------------------------------------------------------------

    def _check_reachable(self) -> None:
        if not self._unreachable or self._unix_path is None:
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(self.timeout)
            try:
                probe.connect(self._unix_path)
            except OSError as exc:
                raise requests.ConnectionError(
                    f"cannot connect to the Docker daemon at {self._unix_path}: {exc}"
                ) from exc
        self._unreachable = False

    def _borrow(self) -> docker.APIClient:
        with self._lock:
            if self._closed:
                raise docker.errors.DockerException("the executor's Docker connection is closed")
            if self._idle:
                return self._idle.pop()
            version = self._version
        if version is None:
            version = self._negotiate_version()
        # With an explicit version the constructor sends nothing, so it cannot fail halfway and leave a socket
        # that nobody can close (with version="auto" it asks the daemon, and raises when there is none).
        return self._new_client(version)

    def _negotiate_version(self) -> str:
        """The daemon's API version, from the `API-Version` header of an unversioned `GET /_ping`, as the docker
        CLI negotiates it. The SDK's `version="auto"` asks `GET /version` instead, which costs the daemon 8-20 ms
        (it runs `runc --version` and asks containerd), on the path of every one-shot `edgecoder exec`. A daemon too old
        to send the header is asked `GET /version` after all."""
        probe = self._new_client(MIN_API_VERSION)
        try:
            answer = probe._get(probe.base_url + "/_ping")
            probe._raise_for_status(answer)
            version = answer.headers.get("API-Version") or str(probe.version(api_version=False)["ApiVersion"])
        finally:
            probe.close()
        with self._lock:
            self._version = self._version or version
            return self._version

    def _new_client(self, version: str) -> docker.APIClient:
        if self._base_url is not None:
            api = docker.APIClient(base_url=self._base_url, version=version, timeout=self.timeout)
        else:
            api = docker.APIClient(**{**docker.utils.kwargs_from_env(), "version": version, "timeout": self.timeout})
        stock = getattr(api, "_custom_adapter", None)
        if isinstance(stock, UnixHTTPAdapter):  # unused so far: it has no connection to close
            api._custom_adapter = _UnixAdapter(stock.socket_path, stock.timeout, max_pool_size=stock.max_pool_size)
            api.mount("http+docker://", api._custom_adapter)
            stock.close()
        return api

    def _give_back(self, api: docker.APIClient) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(api)
                return
        api.close()


# -- the SDK's unix-socket transport, with the socket of a failed connection closed ------------------------------


class _UnixConnection(UnixHTTPConnection):
    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.unix_socket)
        except BaseException:
            sock.close()  # docker-py 7.1 leaves it to the garbage collector
            raise
        self.sock = sock


class _UnixPool(UnixHTTPConnectionPool):
    def _new_conn(self) -> _UnixConnection:
        return _UnixConnection(self.base_url, self.socket_path, self.timeout)


class _UnixAdapter(UnixHTTPAdapter):
    """docker-py's `UnixHTTPAdapter`, whose pools make `_UnixConnection`s."""

    def get_connection(self, url: Any, proxies: Any = None) -> _UnixPool:
        with self.pools.lock:
            pool = self.pools.get(url)
            if pool is None:
                pool = self.pools[url] = _UnixPool(url, self.socket_path, self.timeout, maxsize=self.max_pool_size)
            return cast(_UnixPool, pool)
