"""SubsetChecker: `check_subset` in a long-lived child process, off the node's Trio thread, with bounded CPU and memory.

Parsing is the costly part of the check, and its cost grows with the code: 128 KiB of dense Python (the mesh's
largest offer) takes about 0.3 s of CPU and 130 MiB of memory, 1 MiB (the executor's largest) 3 s and 930 MiB. On
the Trio thread that froze the node for the whole check; in a worker thread the GIL is still held by `ast.parse`
(C code) for most of it, and neither the CPU nor the memory can be bounded. A child process can be bounded and
killed, and it runs on another core (benchmarks/bench_subset.py prints the three side by side).

The child is `python -I -S` loading executor/subset.py by path, so it imports nothing but the standard library. It
sets, for itself:
- RLIMIT_AS (`memory_bytes`): past it, allocations fail, and check_subset answers "code too complex to check";
- RLIMIT_CPU, moved before each check to the CPU used so far plus `cpu_s` (plus up to 1 s, the limit's
  granularity): past it the kernel ends the child with SIGXCPU;
- nice 10, no core files, SIGINT ignored (a Ctrl-C on the node's terminal is the node's to handle).

The host holds the child's only pipes. A check that ends the child, takes longer than `wall_s` or is cancelled
midway discards the child (killed and reaped); the next check starts a new one. A child that ended is never an
answer of "fine": the code is refused with a typed violation saying why it could not be checked.

Wire format (both ways over the child's stdin/stdout):
    request: >B language length, >I code length, language (ASCII), code (UTF-8, surrogates passed through)
    reply:   >I length, JSON: null, or [construct, line]
"""

from __future__ import annotations

import json
import signal
import struct
import subprocess
import sys
from pathlib import Path

import trio

from executor import lazylog
from executor.subset import SubsetViolation

log = lazylog.get_logger(__name__)

CHECK_CPU_S = 5
CHECK_WALL_S = 15.0
CHECK_MEMORY_BYTES = 384 << 20
MAX_REPLY_BYTES = 4096
_REQUEST = struct.Struct(">BI")
_REPLY = struct.Struct(">I")
SUBSET_MODULE = Path(__file__).resolve().with_name("subset.py")

WORKER = r"""
import importlib.util, json, os, resource, signal, struct, sys
path, cpu_s, memory = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
spec = importlib.util.spec_from_file_location("edgecoder_subset", path)
subset = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = subset  # dataclasses looks the module up while the class is made
spec.loader.exec_module(subset)
signal.signal(signal.SIGINT, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
os.nice(10)
cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
def read_exact(n):
    data = bytearray()
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            sys.exit(0)  # the host closed our stdin: done
        data += chunk
    return bytes(data)
def write_all(data):
    while data:
        data = data[os.write(1, data):]
while True:
    language_len, code_len = struct.unpack(">BI", read_exact(5))
    language = read_exact(language_len).decode("ascii", "replace")
    code = read_exact(code_len).decode("utf-8", "surrogatepass")
    used = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(used.ru_utime + used.ru_stime) + 1 + cpu_s
    if cpu_hard != resource.RLIM_INFINITY:
        soft = min(soft, cpu_hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, cpu_hard))
    violation = subset.check_subset(language, code)
    del code
    reply = json.dumps(None if violation is None else [violation.construct, violation.line]).encode()
    write_all(struct.pack(">I", len(reply)) + reply)
"""


class _CheckerEnded(Exception):
    """The child closed its stdout or answered something that is not the protocol."""


class SubsetChecker:
    def __init__(
        self, *, cpu_s: int = CHECK_CPU_S, memory_bytes: int = CHECK_MEMORY_BYTES, wall_s: float = CHECK_WALL_S
    ) -> None:
        self.cpu_s = cpu_s
        self.memory_bytes = memory_bytes
        self.wall_s = wall_s
        self._lock = trio.Lock()  # one check at a time per child: requests and replies are not tagged
        self._process: trio.Process | None = None
        self.started = 0  # children started so far (a restart after a child ended counts)

    async def start(self) -> None:
        """Start the child now, so the first check does not pay for it (about 20 ms)."""
        async with self._lock:
            await self._ensure_started()

    async def check(self, language: str, code: str) -> SubsetViolation | None:
        """check_subset(language, code), answered by the child. Never raises but Cancelled."""
        encoded_language = language.encode("ascii", "replace")[:255]
        encoded_code = code.encode("utf-8", errors="surrogatepass")
        request = _REQUEST.pack(len(encoded_language), len(encoded_code)) + encoded_language + encoded_code
        async with self._lock:
            try:
                with trio.move_on_after(self.wall_s):
                    return await self._exchange(request)
            except (_CheckerEnded, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                status = await self._discard()
                log.warning("subset_checker.ended", status=status, error=repr(exc))
                return SubsetViolation(f"code could not be checked: {self._why_ended(status)}", None)
            except BaseException:
                # Cancelled midway: where the child is in the protocol is unknown, so it goes.
                await self._discard()
                raise
            await self._discard()
            log.warning("subset_checker.too_slow", wall_s=self.wall_s)
            return SubsetViolation(f"code took more than {self.wall_s:g} s to check", None)

    async def aclose(self) -> None:
        """End the child: its stdin closes and it exits; killed if it has not within a second."""
        with trio.CancelScope(shield=True):
            async with self._lock:
                process, self._process = self._process, None
                if process is None:
                    return
                assert process.stdin is not None and process.stdout is not None
                await process.stdin.aclose()
                with trio.move_on_after(1.0):
                    await process.wait()
                await _reap(process)

    # ------------------------------------------------------------------------------------------------------------

    async def _ensure_started(self) -> trio.Process:
        if self._process is None:
            command = [
                sys.executable,
                "-I",
                "-S",
                "-c",
                WORKER,
                str(SUBSET_MODULE),
                str(self.cpu_s),
                str(self.memory_bytes),
            ]
            self._process = await trio.lowlevel.open_process(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
            )
            self.started += 1
        return self._process

    async def _exchange(self, request: bytes) -> SubsetViolation | None:
        process = await self._ensure_started()
        assert process.stdin is not None and process.stdout is not None
        await process.stdin.send_all(request)
        (size,) = _REPLY.unpack(await _receive_exact(process.stdout, _REPLY.size))
        if size > MAX_REPLY_BYTES:
            raise _CheckerEnded(f"reply of {size} bytes")
        try:
            reply = json.loads(await _receive_exact(process.stdout, size))
        except ValueError as exc:
            raise _CheckerEnded("unreadable reply") from exc
        if reply is None:
            return None
        construct, line = reply
        return SubsetViolation(str(construct), line if isinstance(line, int) else None)

    async def _discard(self) -> int | None:
        """Kill and reap the child (shielded: it must not outlive a cancelled caller). Its exit status."""
        with trio.CancelScope(shield=True):
            process, self._process = self._process, None
            if process is None:
                return None
            return await _reap(process)

    def _why_ended(self, status: int | None) -> str:
        if status == -signal.SIGXCPU:
            return f"it used more than {self.cpu_s} s of CPU"
        if status is not None and status < 0:
            return f"the checker was killed by signal {-status}"
        return f"the checker ended with status {status}"


async def _reap(process: trio.Process) -> int | None:
    if process.returncode is None:
        process.kill()
    status = await process.wait()
    for pipe in (process.stdin, process.stdout):
        if pipe is not None:
            await pipe.aclose()
    return status


async def _receive_exact(stream: trio.abc.ReceiveStream, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = await stream.receive_some(size - len(data))
        if not chunk:
            raise _CheckerEnded("end of stream")
        data += chunk
    return bytes(data)
