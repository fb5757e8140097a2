"""When the daemon is missing, goes away mid-run, or the image is wrong: results, never hangs or exceptions.

The machine's real dockerd is shared, so "the daemon goes away" is simulated with a relay socket between the
sandbox and /var/run/docker.sock that the test cuts.
"""

from __future__ import annotations

import collections
import gc
import io
import os
import tarfile
import uuid
import warnings
from pathlib import Path

import docker
import pytest
import trio

from executor.contract import ErrorKind, ExecRequest, ExecResult, Limits
from executor.policy import ExecutorPolicy
from executor.runner import Executor
from simulations.docker_relay import open_relays
from tests.conftest import containers_of

POLICY = ExecutorPolicy(subset_check=False, pool_size=0)


@pytest.mark.docker
@pytest.mark.parametrize("pool_size", [0, 1])
async def test_daemon_vanishing_mid_run_gives_a_result_and_nothing_hangs(
    docker_api: docker.APIClient, node_label: str, tmp_path: Path, pool_size: int
) -> None:
    results: list[ExecResult] = []
    # Nothing hangs: the run in flight ends as lost (asserted below), and the next one is refused. The bound is a
    # hang backstop, not a speed target.
    with trio.fail_after(120):
        async with (
            open_relays(tmp_path, 1) as (relay,),
            Executor.open(POLICY, node_label=node_label, docker_base_url=relay.base_url, pool_size=pool_size) as ex,
        ):

            async def long_run() -> None:
                request = ExecRequest("python", "import time\nprint('started', flush=True)\ntime.sleep(30)")
                results.append(await ex.run_code(request))

            async with trio.open_nursery() as nursery:
                if pool_size:
                    await wait_until(lambda: ex.stats().pool_ready == 1)
                nursery.start_soon(long_run)
                await wait_until(lambda: ex.stats().runs_in_flight == 1)
                await trio.sleep(1.0)
                relay.cut()
            after = await ex.run_code(ExecRequest("python", "print(1)"))
    [lost] = results
    assert lost.error_kind in (ErrorKind.SANDBOX_VIOLATION, ErrorKind.ABORTED)
    assert lost.queue_for_cloud is True
    assert (after.error_kind, after.queue_reason) == (ErrorKind.SANDBOX_VIOLATION, "sandbox_unavailable")
    # The node could not clean up through a dead daemon; its next start-up sweep (here, the fixture) will.
    for container in containers_of(docker_api, node_label):
        docker_api.remove_container(container["Id"], force=True)


async def test_no_daemon_at_all_is_sandbox_unavailable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such-docker.sock")
    async with Executor.open(POLICY, node_label="no-daemon", pool_size=1) as ex:
        health = await ex.health()
        result = await ex.run_code(ExecRequest("python", "print(1)"))
        canary = await ex.canary()
    assert (health.ok, health.reason) == (False, "daemon_unreachable")
    assert (result.ok, result.error_kind, result.queue_reason, result.queue_for_cloud) == (
        False,
        ErrorKind.SANDBOX_VIOLATION,
        "sandbox_unavailable",
        True,
    )
    assert "daemon" in result.stderr
    assert not canary.ok


@pytest.mark.docker
async def test_missing_image_is_sandbox_unavailable(docker_api: docker.APIClient, node_label: str) -> None:
    policy = ExecutorPolicy(image=f"edgecoder-absent:{uuid.uuid4().hex[:8]}", pool_size=0)
    async with Executor.open(policy, node_label=node_label) as ex:
        health = await ex.health()
        result = await ex.run_code(ExecRequest("python", "print(1)"))
    assert (health.ok, health.reason) == (False, "image_missing")
    assert (result.error_kind, result.queue_reason) == (ErrorKind.SANDBOX_VIOLATION, "sandbox_unavailable")
    assert containers_of(docker_api, node_label) == []


@pytest.mark.docker
async def test_image_running_as_root_is_refused(docker_api: docker.APIClient, node_label: str) -> None:
    tag = f"edgecoder-root-test:{uuid.uuid4().hex[:8]}"
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        info = tarfile.TarInfo("marker")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    docker_api.import_image_from_data(archive.getvalue(), repository=tag)  # no USER: root
    try:
        async with Executor.open(ExecutorPolicy(image=tag, pool_size=0), node_label=node_label) as ex:
            health = await ex.health()
            result = await ex.run_code(ExecRequest("python", "print(1)", limits=Limits()))
    finally:
        docker_api.remove_image(tag, force=True)
    assert (health.ok, health.reason) == (False, "image_user")
    assert (result.error_kind, result.queue_reason) == (ErrorKind.SANDBOX_VIOLATION, "sandbox_unavailable")
    assert containers_of(docker_api, node_label) == []


async def wait_until(condition: object, timeout_s: float = 10.0) -> None:
    with trio.fail_after(timeout_s):
        while not condition():  # type: ignore[operator]
            await trio.sleep(0.02)


def open_descriptors() -> collections.Counter[str]:
    """This process's open file descriptors by kind: socket, pipe, anon_inode, or the file's path."""
    kinds: collections.Counter[str] = collections.Counter()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the descriptor listdir itself used, closed meanwhile
            continue
        kinds[target.split(":")[0] if ":[" in target else target] += 1
    return kinds


@pytest.mark.docker
async def test_executor_cycles_leave_no_socket_or_descriptor_behind(
    docker_api: docker.APIClient, node_label: str
) -> None:
    async def cycle() -> None:
        async with Executor.open(ExecutorPolicy(pool_size=1), node_label=node_label) as ex:
            await wait_until(lambda: ex.stats().pool_ready == 1)
            result = await ex.run_code(ExecRequest("python", "print(1)"))
            assert result.ok, result.stderr
            timed_out = await ex.run_code(ExecRequest("python", "while True: pass", limits=Limits(timeout_ms=300)))
            assert timed_out.error_kind is ErrorKind.TIMEOUT

    await cycle()  # first use initialises what lives as long as the process (trio's thread cache, imports)
    gc.collect()
    before = open_descriptors()
    # Whatever only the garbage collector would close is a leak: the collector is off while the cycles run, and
    # anything it finalises afterwards says so with a ResourceWarning.
    gc.disable()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            for _ in range(10):
                await cycle()
            after = open_descriptors()
            gc.collect()
    finally:
        gc.enable()
    leaked = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert after == before, f"before {dict(before)}, after 10 executor cycles {dict(after)}"
    assert leaked == []
    assert containers_of(docker_api, node_label) == []


@pytest.mark.docker
async def test_docker_calls_never_hold_trios_shared_thread_limiter(
    docker_api: docker.APIClient, node_label: str
) -> None:
    """An abandoned or slow daemon call holds its limiter token until the thread ends; it must be the executor's."""
    shared = trio.to_thread.current_default_thread_limiter()
    most_borrowed = 0

    async def watch(*, task_status: object = trio.TASK_STATUS_IGNORED) -> None:
        nonlocal most_borrowed
        task_status.started()  # type: ignore[attr-defined]
        while True:
            most_borrowed = max(most_borrowed, shared.borrowed_tokens)
            await trio.sleep(0)

    async with trio.open_nursery() as nursery:
        await nursery.start(watch)
        # No subset check: starting its process is trio's own short use of the shared limiter (Popen).
        async with Executor.open(ExecutorPolicy(pool_size=1, subset_check=False), node_label=node_label) as ex:
            await wait_until(lambda: ex.stats().pool_ready == 1)
            await ex.health()
            await ex.run_code(ExecRequest("python", "import sys\nsys.exit(3)"))
            await ex.run_code(ExecRequest("python", "while True: pass", limits=Limits(timeout_ms=300)))
        nursery.cancel_scope.cancel()
    assert most_borrowed == 0


@pytest.mark.docker
async def test_the_api_version_is_the_daemons_own_without_asking_get_version(
    docker_api: docker.APIClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The executor speaks the version the daemon says it speaks (GET /_ping's header), not one pinned here, and
    never pays for GET /version (the daemon runs `runc --version` to answer it)."""
    from executor.docker_api import DockerApi

    daemon_speaks = docker_api.version(api_version=False)["ApiVersion"]
    asked: list[object] = []
    monkeypatch.setattr(docker.APIClient, "version", lambda *args, **kwargs: asked.append(args))
    line = DockerApi()
    try:
        speaks = await line.call(lambda api: api.api_version)
    finally:
        line.close()
    assert (speaks, asked) == (daemon_speaks, [])
