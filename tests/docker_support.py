"""Helpers for tests that run real nodes against the real Docker daemon."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import trio

from executor.policy import ExecutorPolicy
from executor.runner import Executor
from executor.runtimes import Runtime


def sandbox_policy(**changes: object) -> ExecutorPolicy:
    """Small pools, so that several nodes in one test stay light on a 2-core machine."""
    fields: dict[str, object] = {"pool_size": 1, "max_concurrent": 2}
    fields.update(changes)
    return ExecutorPolicy(**fields)  # type: ignore[arg-type]


async def wait_pool_ready(executor: Executor, timeout: float = 30.0) -> None:
    """Until the pool is full and no removal (of the gate's canary, say) is still under way: a quiet executor."""
    with trio.fail_after(timeout):
        while (stats := executor.stats()).pool_ready < stats.pool_size or stats.pending_removals:
            await trio.sleep(0.02)


# An executor in a process of its own, for tests of what happens when its owner dies. It runs one `ExecRequest`
# (or none) and prints "ready" once the run's container is running, then waits to be killed.
EXECUTOR_PROCESS = """
import sys, trio
from executor.contract import ExecRequest, Limits
from executor.policy import ExecutorPolicy
from executor.runner import Executor
from executor.runtimes import Runtime

label, pool_size, timeout_ms, code = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

async def main():
    policy = ExecutorPolicy(subset_check=False, pool_size=pool_size)
    # 96 MiB: not the pool's limits, so the run is cold and the pool keeps its own container.
    request = ExecRequest("python", code, limits=Limits(timeout_ms=timeout_ms, memory_mb=96))
    async with Executor.open(policy, node_label=label) as ex, trio.open_nursery() as nursery:
        while ex.stats().pool_ready < pool_size:
            await trio.sleep(0.02)
        if code:
            nursery.start_soon(ex.run_code, request)
            while ex.stats().runs_in_flight == 0:
                await trio.sleep(0.02)
        print("ready", flush=True)
        await trio.sleep_forever()

trio.run(main)
"""


async def start_executor_process(label: str, *, pool_size: int, timeout_ms: int = 0, code: str = "") -> trio.Process:
    """A child process owning an executor (see EXECUTOR_PROCESS), returned once it printed "ready"."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-c", EXECUTOR_PROCESS, label, str(pool_size), str(timeout_ms), code],
        stdout=subprocess.PIPE,
    )
    assert process.stdout is not None
    with trio.fail_after(60):
        seen = b""
        while b"ready\n" not in seen:
            chunk = await process.stdout.receive_some(100)
            assert chunk, f"the executor process ended before it was ready (status {await process.wait()})"
            seen += chunk
    return process


async def kill_process(process: trio.Process, *, with_guardian: bool = False) -> None:
    """SIGKILL the process; `with_guardian`: its container guardian first (executor/guardian.py), as if both had
    been killed at once, so that what is left to test is the last line: the containers' own deadlines, the sweep."""
    if with_guardian:
        for pid in guardians_of(process.pid):
            os.kill(pid, signal.SIGKILL)
    process.kill()
    await process.wait()
    if process.stdout is not None:
        await process.stdout.aclose()


# The smallest real package set that proves runtimes: numpy and its BLAS. python-science (scipy, pandas, sklearn...)
# is built the same way and measured by benchmarks/bench_runtimes.py, not in the suite: about ten minutes cold here.
NUMPY_RUNTIME = Runtime("python-numpy", ("python3-numpy",))


def build_numpy_runtime() -> str | None:
    """Build NUMPY_RUNTIME's image unless it is there (cached by its package list); None, or why it cannot be."""
    from executor.images import ImageError, build_image, runtime_built

    try:
        if not runtime_built(NUMPY_RUNTIME):
            build_image(NUMPY_RUNTIME.image, runtime=NUMPY_RUNTIME, progress=lambda _line: None)
    except ImageError as exc:
        return f"cannot build the {NUMPY_RUNTIME.name} runtime: {exc}"
    return None


def guardians_of(pid: int) -> list[int]:
    """The pids of the container guardians the process `pid` started (its children running executor/guardian.py)."""
    children = [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]
    return [c for c in children if b"guardian.py" in Path(f"/proc/{c}/cmdline").read_bytes()]
