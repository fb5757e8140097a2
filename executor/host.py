"""Run the node owner's own code (origin "local") as a plain subprocess of the host.

Hygiene, not a boundary: the process runs as the node's user, sees the host's file system and network, and may
leave children behind until they are killed with its process group. Remote tasks never get here (the executor
refuses `sandbox="host"` for them before anything starts).

What it does provide, with the same result contract as the sandbox:
- a scrubbed environment: PATH, HOME (a fresh temporary directory, also the working directory) and LANG only;
- rlimits set in the child before exec: memory (RLIMIT_AS for Python; RLIMIT_DATA for Node, whose V8 reserves
  more than 1 GiB of address space up front and cannot start under a tight RLIMIT_AS), RLIMIT_CPU a second
  above the timeout, RLIMIT_NOFILE 256, RLIMIT_FSIZE 64 MiB, no core files. RLIMIT_NPROC is deliberately not
  set: it counts every process of the real user (and root ignores it), so it would either break unrelated work
  or do nothing; the process group kill below is what stops a fork storm;
- a wall timeout: the whole process group is killed, exit code 124, errorKind timeout;
- output captured in bounded memory with the policy's caps and truncation flags.

A memory limit hit shows up as the program's own failure (MemoryError, "heap out of memory"): it is reported as
execution-failed, because nothing on the host tells an OOM apart from any other crash as `OOMKilled` does.

Rlimits are set in `preexec_fn`. Python warns that preexec_fn is unsafe when threads exist (the node has
trio worker threads): the danger is a lock held by another thread at fork time. The function used here only
calls setrlimit on prebuilt integers, takes no locks and imports nothing, so it cannot meet such a lock.
"""

from __future__ import annotations

import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable

import trio

from executor.contract import ErrorKind, ExecRequest, ExecResult, Limits, QueueReason
from executor.output import BoundedBuffer
from executor.policy import ExecutorPolicy
from executor.request import PreparedRequest, prepare_request
from executor.sandbox import TIMEOUT_EXIT_CODE

NOFILE = 256
FSIZE_BYTES = 64 * 1024 * 1024
READ_CHUNK = 65536


def host_command(language: str, program_path: str) -> list[str] | None:
    """The interpreter command for `language`, or None when it is not installed."""
    if language == "python":
        # The node's own interpreter: present by definition, and a bare `python3` may be a shell shim
        # (pyenv) that needs the very environment we scrub.
        return [sys.executable, program_path]
    node = shutil.which("node") or shutil.which("nodejs")
    return None if node is None else [node, program_path]


def rlimits_for(language: str, limits: Limits) -> list[tuple[int, int]]:
    """(resource, value) pairs, soft = hard, applied in the child before exec."""
    memory = limits.memory_mb * 1024 * 1024
    cpu_seconds = math.ceil(limits.timeout_ms / 1000) + 1
    return [
        (resource.RLIMIT_AS if language == "python" else resource.RLIMIT_DATA, memory),
        (resource.RLIMIT_CPU, cpu_seconds),
        (resource.RLIMIT_NOFILE, NOFILE),
        (resource.RLIMIT_FSIZE, FSIZE_BYTES),
        (resource.RLIMIT_CORE, 0),
    ]


def _preexec(pairs: list[tuple[int, int]]) -> Callable[[], None]:
    def apply() -> None:
        for which, value in pairs:
            resource.setrlimit(which, (value, value))

    return apply


async def run_on_host(request: ExecRequest | PreparedRequest, limits: Limits, policy: ExecutorPolicy) -> ExecResult:
    """Run `request` with already clamped `limits` as a host subprocess. Never raises for a failed run."""
    started_at = trio.current_time()
    prepared = prepare_request(request, policy)
    if isinstance(prepared, ExecResult):
        return prepared
    code, input_json = prepared.code, prepared.input_json
    workdir = tempfile.mkdtemp(prefix="edgecoder-host-")
    try:
        extension = "py" if prepared.language == "python" else "js"
        program = os.path.join(workdir, f"main.{extension}")
        with open(program, "wb") as handle:
            handle.write(code)
        command = host_command(prepared.language, program)
        if command is None:
            return ExecResult(
                ok=False,
                stderr=f"no interpreter for {prepared.language} on this host",
                error_kind=ErrorKind.EXECUTION_FAILED,
            )
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": workdir, "LANG": "C.UTF-8"}
        rlimits = rlimits_for(prepared.language, limits)
        return await _supervise(command, env, workdir, input_json, rlimits, limits, policy, started_at)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def _supervise(
    command: list[str],
    env: dict[str, str],
    workdir: str,
    input_json: bytes,
    rlimits: list[tuple[int, int]],
    limits: Limits,
    policy: ExecutorPolicy,
    started_at: float,
) -> ExecResult:
    stdout, stderr = BoundedBuffer(policy.stdout_cap), BoundedBuffer(policy.stderr_cap)
    try:
        process = await trio.lowlevel.open_process(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=workdir,
            start_new_session=True,  # its own process group, so a timeout kills its children too
            preexec_fn=_preexec(rlimits),
        )
    except OSError as exc:
        return ExecResult(ok=False, stderr=f"cannot start {command[0]}: {exc}", error_kind=ErrorKind.EXECUTION_FAILED)
    try:
        with trio.move_on_after(limits.timeout_ms / 1000) as deadline:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_feed, process.stdin, input_json)
                nursery.start_soon(_drain, process.stdout, stdout)
                nursery.start_soon(_drain, process.stderr, stderr)
                await process.wait()
                # Orphans still holding the pipes die with the group, as they do with a container's PID 1.
                _kill_group(process.pid)
    finally:
        with trio.CancelScope(shield=True):
            _kill_group(process.pid)
            await process.wait()
            for stream in (process.stdin, process.stdout, process.stderr):
                if stream is not None:
                    await stream.aclose()
    elapsed = int((trio.current_time() - started_at) * 1000)
    if deadline.cancelled_caught:
        return _result(stdout, stderr, TIMEOUT_EXIT_CODE, elapsed, ErrorKind.TIMEOUT)
    status = process.returncode
    assert status is not None
    # A signal death is reported as the shell (and Docker) would: 128 + signal number.
    exit_code = status if status >= 0 else 128 - status
    return _result(stdout, stderr, exit_code, elapsed, None if exit_code == 0 else ErrorKind.EXECUTION_FAILED)


async def _feed(stream: trio.abc.SendStream | None, data: bytes) -> None:
    if stream is None:
        return
    try:
        await stream.send_all(data)
        await stream.aclose()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the program exited (or closed stdin) without reading all its input: its choice


async def _drain(stream: trio.abc.ReceiveStream | None, into: BoundedBuffer) -> None:
    if stream is None:
        return
    try:
        while data := await stream.receive_some(READ_CHUNK):
            into.append(data)
    except trio.ClosedResourceError:
        pass


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _result(
    stdout: BoundedBuffer, stderr: BoundedBuffer, exit_code: int, elapsed_ms: int, kind: ErrorKind | None
) -> ExecResult:
    timed_out = kind is ErrorKind.TIMEOUT
    return ExecResult(
        ok=kind is None,
        stdout=stdout.text(),
        stderr=stderr.text(),
        exit_code=exit_code,
        duration_ms=elapsed_ms,
        queue_for_cloud=timed_out,
        queue_reason=QueueReason.TIMEOUT if timed_out else None,
        error_kind=kind,
        stdout_truncated=stdout.truncated,
        stderr_truncated=stderr.truncated,
    )
