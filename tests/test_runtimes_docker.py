"""Runtimes on the real daemon: a declared runtime's packages import, an undeclared one never runs, and the same
hardening holds under every runtime (its canary, the limits). The runtime is NUMPY_RUNTIME (numpy and its BLAS),
built once per machine and cached by its package list; python-science is built the same way (docs/runtimes.md)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import docker
import pytest
import trio

from executor.backends.runc import RuncBackend
from executor.container_config import SANDBOX_UID_BASE, build_container_config
from executor.contract import ErrorKind, ExecRequest, Limits
from executor.policy import ExecutorPolicy
from executor.runner import Executor
from executor.runtimes import PACKAGES_LABEL, runtime_info
from tests.conftest import containers_of
from tests.docker_support import NUMPY_RUNTIME, build_numpy_runtime, wait_pool_ready
from tests.test_executor_warm import BUSY_LOOPS, FLOODS, FORK_BOMBS, MEMORY_BOMBS, PYTHON_CANARY

MATMUL = """
import json, sys
import numpy as np
data = json.load(sys.stdin)
a = np.array(data["a"], dtype=float)
print(json.dumps((a @ a.T).tolist()))
"""
PRELOADED = "import sys\nprint('numpy' in sys.modules)\n"


@pytest.fixture(scope="session")
def numpy_runtime(docker_api: docker.APIClient) -> str:
    """NUMPY_RUNTIME's image, built on first use (minutes) and found in the cache afterwards."""
    problem = build_numpy_runtime()
    if problem is not None:
        pytest.fail(problem, pytrace=False)  # the daemon is here (docker_api): debootstrap must work too
    return NUMPY_RUNTIME.name


def runtime_policy(**changes: object) -> ExecutorPolicy:
    fields: dict[str, object] = {"subset_check": False, "runtimes": (NUMPY_RUNTIME,), "pool_size": 0}
    fields.update(changes)
    return ExecutorPolicy(**fields)  # type: ignore[arg-type]


@asynccontextmanager
async def executor(label: str, **changes: object) -> AsyncIterator[Executor]:
    async with Executor.open(runtime_policy(**changes), node_label=label) as ex:
        yield ex


async def test_a_declared_runtime_runs_its_packages_and_the_base_runtime_has_none(
    docker_api: docker.APIClient, node_label: str, numpy_runtime: str
) -> None:
    request = ExecRequest("python", MATMUL, input={"a": [[1, 2], [3, 4]]}, limits=Limits(timeout_ms=20_000))
    async with executor(node_label) as ex:
        science = await ex.run_code(request, runtime=numpy_runtime)
        plain = await ex.run_code(request)
        node = await ex.run_code(ExecRequest("javascript", "console.log(1 + 1)"), runtime=numpy_runtime)
    assert science.ok, science.stderr
    assert json.loads(science.stdout) == [[5.0, 11.0], [11.0, 25.0]]
    assert not plain.ok and "ModuleNotFoundError: No module named 'numpy'" in plain.stderr
    assert (node.ok, node.stdout) == (True, "2\n")  # both languages under every runtime
    assert containers_of(docker_api, node_label) == []


async def test_an_undeclared_runtime_never_starts_a_container(docker_api: docker.APIClient, node_label: str) -> None:
    async with executor(node_label) as ex:
        for name in ("python-science", "edgecoder-sandbox:bookworm", "debian", "../x", "x" * 10_000):
            result = await ex.run_code(ExecRequest("python", "print(1)"), runtime=name)
            assert (result.ok, result.queue_reason, result.error_kind) == (
                False,
                "runtime_unavailable",
                ErrorKind.EXECUTION_FAILED,
            )
            assert "not declared here" in result.stderr and len(result.stderr) < 300
        assert ex.stats().runs_in_flight == 0
    assert containers_of(docker_api, node_label) == []


def test_a_runtime_changes_the_image_and_nothing_else_of_the_container() -> None:
    """What an offer's runtime can reach: the image, among the operator's; no mount, bind, device or setting."""
    policy = runtime_policy()
    plain = build_container_config(Limits(), policy, labels={}, uid=SANDBOX_UID_BASE, backend=RuncBackend())
    science = build_container_config(
        Limits(), policy.for_runtime(NUMPY_RUNTIME.name), labels={}, uid=SANDBOX_UID_BASE, backend=RuncBackend()
    )
    assert science["image"] == NUMPY_RUNTIME.image and plain["image"] == policy.image
    assert {k: v for k, v in science.items() if k != "image"} == {k: v for k, v in plain.items() if k != "image"}
    host = science["host_config"]
    assert not {"Binds", "Mounts", "Devices", "VolumesFrom"} & set(host)


async def test_the_image_lists_its_packages_and_their_digest(docker_api: docker.APIClient, numpy_runtime: str) -> None:
    info = runtime_info(NUMPY_RUNTIME, docker_api.inspect_image(NUMPY_RUNTIME.image))
    assert info is not None
    names = {p.split("=", 1)[0] for p in info.packages}
    assert {"python3", "nodejs", "python3-numpy"} <= names
    assert info.image_id.startswith("sha256:") and len(info.digest) == 64
    labels = docker_api.inspect_image(NUMPY_RUNTIME.image)["Config"]["Labels"]
    assert labels[PACKAGES_LABEL].split() == list(info.packages)


@pytest.mark.parametrize("tier", ["runc", pytest.param("gvisor", marks=pytest.mark.gvisor)])
async def test_the_canary_passes_under_the_runtime(node_label: str, numpy_runtime: str, tier: str) -> None:
    async with executor(node_label, isolation=(tier,)) as ex:
        verdict = await ex.canary(tier, runtime=numpy_runtime)
    assert verdict.ok, verdict.detail


async def test_limits_hold_under_the_runtime(docker_api: docker.APIClient, node_label: str, numpy_runtime: str) -> None:
    async with executor(node_label) as ex:

        async def run(code: str, timeout_ms: int = 20_000) -> object:
            return await ex.run_code(
                ExecRequest("python", code, limits=Limits(timeout_ms=timeout_ms)), runtime=numpy_runtime
            )

        bomb = await run(FORK_BOMBS["python"])
        memory = await run(MEMORY_BOMBS["python"])
        busy = await run(BUSY_LOOPS["python"], 3000)
        flood = await run(FLOODS["python"], 5000)  # numpy is imported first, cold
        canary = await run(PYTHON_CANARY)
    # The ceiling held. The bomb's first process may not get to exit before the timeout: its interpreter, numpy
    # loaded, takes far longer to finalise on its 1/40th of half a CPU than a plain one (the rest fork on).
    current, ceiling = bomb.stdout.split()[-2:]  # type: ignore[attr-defined]
    assert ceiling == "50" and int(current) <= 50
    assert bomb.error_kind in (None, ErrorKind.TIMEOUT)  # type: ignore[attr-defined]
    assert (memory.error_kind, memory.exit_code) == (ErrorKind.MEMORY_EXCEEDED, 137)  # type: ignore[attr-defined]
    assert (busy.error_kind, busy.exit_code) == (ErrorKind.TIMEOUT, 124)  # type: ignore[attr-defined]
    assert (flood.error_kind, flood.stdout_truncated) == (ErrorKind.TIMEOUT, True)  # type: ignore[attr-defined]
    seen = json.loads(canary.stdout)  # type: ignore[attr-defined]
    assert (seen["interfaces"], seen["root_read_only"], seen["cap_eff"]) == (["lo"], True, "0000000000000000")
    assert containers_of(docker_api, node_label) == []


async def test_a_runtime_in_use_gets_warm_containers_with_numpy_already_imported(
    docker_api: docker.APIClient, node_label: str, numpy_runtime: str
) -> None:
    async with executor(node_label, pool_size=2, pool_languages=("python",)) as ex:
        await wait_pool_ready(ex, timeout=60)
        assert ex.runtime_pools["runc", numpy_runtime].size == 0
        cold = await ex.run_code(ExecRequest("python", PRELOADED), runtime=numpy_runtime)
        # In use now: the budget of two is shared, one each.
        assert (ex.runtime_pools["runc", "python"].size, ex.runtime_pools["runc", numpy_runtime].size) == (1, 1)
        await wait_pool_ready(ex, timeout=60)
        warm = await ex.run_code(ExecRequest("python", PRELOADED), runtime=numpy_runtime)
        plain = await ex.run_code(ExecRequest("python", PRELOADED))
        assert ex.stats().pool_size == 2
    assert (cold.ok, cold.stdout) == (True, "True\n")  # the image's site imports it, warm or cold
    assert (warm.ok, warm.stdout) == (True, "True\n")
    assert (plain.ok, plain.stdout) == (True, "False\n")
    with trio.fail_after(30):
        while containers_of(docker_api, node_label):
            await trio.sleep(0.1)


async def test_the_hostile_probes_meet_the_same_walls_under_the_runtime(
    docker_api: docker.APIClient, node_label: str, numpy_runtime: str
) -> None:
    """The seccomp probe and the in-memory ELF of the hostile catalogue (tests/test_executor_sandbox.py), run under
    the runtime, with that catalogue's verdicts: the runtime's packages open no door the base image keeps shut."""
    from tests.test_executor_sandbox import MEMFD_EXEC, SYSCALL_PROBE

    async with executor(node_label) as ex:
        probe = await ex.run_code(ExecRequest("python", SYSCALL_PROBE), runtime=numpy_runtime)
        memfd = await ex.run_code(ExecRequest("python", MEMFD_EXEC), runtime=numpy_runtime)
    assert probe.ok, probe.stderr
    seen = json.loads(probe.stdout)
    allowed = {"socket(AF_UNIX)", "socket(AF_INET)"}
    assert {name for name, outcome in seen.items() if outcome == "allowed"} == allowed, seen
    assert {o for n, o in seen.items() if n not in allowed} <= {"EPERM", "killed by signal 31", "no socket"}, seen
    assert (memfd.ok, memfd.stdout) == (True, "memfd_create denied\n"), memfd.stderr
    assert containers_of(docker_api, node_label) == []
