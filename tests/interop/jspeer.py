"""Drive the js-libp2p peer (`tests/interop/js/peer.mjs`) from Trio: one Node.js process per peer, JSON lines.

`JsPeer.open(**config)` starts the process and waits for its `ready` line; `await peer.call("dial", addr=...)` sends
one command and returns its answer (a `JsPeerError` when the peer answered `ok: false`). Leaving the block stops the
peer (and kills it if it does not stop). The peer's stderr goes to a file that a failing test can print.

`interop_problem()` says why the js peer cannot run here (no Node.js, too old, packages not installed), or None.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

JS_DIR = Path(__file__).parent / "js"
PEER_SCRIPT = JS_DIR / "peer.mjs"
MIN_NODE_MAJOR = 20
# A command answers within this (dials and identify carry their own shorter timeouts inside the peer).
CALL_TIMEOUT = 20.0
START_TIMEOUT = 20.0


class JsPeerError(Exception):
    """The js peer refused a command or failed it; the message is the peer's own."""


@functools.cache
def interop_problem() -> str | None:
    """Checked once per session, like the Docker daemon."""
    node = shutil.which("node")
    if node is None:
        return "node (Node.js 20+) is not installed: the js-libp2p interop peer cannot run"
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    try:
        major = int(version.lstrip("v").split(".")[0])
    except ValueError:
        return f"could not read the Node.js version ({version!r})"
    if major < MIN_NODE_MAJOR:
        return f"Node.js {version} is too old for js-libp2p 2.x (needs {MIN_NODE_MAJOR}+)"
    installed = JS_DIR / "node_modules" / ".package-lock.json"
    if not installed.exists():
        return f"the js peer's packages are not installed: run `npm ci` in {JS_DIR} (scripts/setup.sh does)"
    if (JS_DIR / "package-lock.json").stat().st_mtime > installed.stat().st_mtime:
        return f"the js peer's packages are older than its package-lock.json: run `npm ci` in {JS_DIR}"
    return None


def summed(table: dict[str, dict[str, int]]) -> Counter[str]:
    """`{peer: {key: n}}` (one kind of the peer's control counts) summed over peers: `{key: n}`."""
    total: Counter[str] = Counter()
    for per_peer in table.values():
        total.update(per_peer)
    return total


class JsPeer:
    def __init__(self, process: trio.Process, stderr_path: Path) -> None:
        self.process = process
        self.stderr_path = stderr_path
        self.peer_id = ""
        self.addrs: list[str] = []
        self._buffer = b""
        self._next_id = 0
        self._lock = trio.Lock()

    @classmethod
    @asynccontextmanager
    async def open(cls, **config: Any) -> AsyncIterator[JsPeer]:
        """A running js peer. `config` is the peer's own (see peer.mjs): `muxer`, `gossip` options."""
        problem = interop_problem()
        if problem is not None:
            raise RuntimeError(problem)
        with tempfile.NamedTemporaryFile(prefix="jspeer-", suffix=".log", delete=False) as stderr:
            stderr_path = Path(stderr.name)
            process = await trio.lowlevel.open_process(
                ["node", str(PEER_SCRIPT), json.dumps(config)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                cwd=JS_DIR,
                env={**os.environ, "NODE_NO_WARNINGS": "1"},
            )
        peer = cls(process, stderr_path)
        try:
            with trio.fail_after(START_TIMEOUT):
                ready = await peer._read_answer()
            if ready.get("event") != "ready":
                raise JsPeerError(f"js peer did not start: {ready}\n{peer.stderr()}")
            peer.peer_id, peer.addrs = ready["peerId"], ready["addrs"]
            yield peer
        finally:
            with trio.CancelScope(shield=True):
                await peer._stop()

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-4000:]

    async def call(self, cmd: str, *, timeout: float = CALL_TIMEOUT, **args: Any) -> dict[str, Any]:
        async with self._lock:
            self._next_id += 1
            request = {"id": self._next_id, "cmd": cmd, **args}
            assert self.process.stdin is not None
            await self.process.stdin.send_all((json.dumps(request) + "\n").encode())
            with trio.fail_after(timeout):
                while True:
                    answer = await self._read_answer()
                    if answer.get("id") == self._next_id:
                        break
        if not answer.get("ok"):
            raise JsPeerError(f"{cmd}: {answer.get('error')}")
        return answer

    async def _read_answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        while b"\n" not in self._buffer:
            chunk = await self.process.stdout.receive_some(65536)
            if not chunk:
                raise JsPeerError(f"js peer exited (code {self.process.poll()}):\n{self.stderr()}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def _stop(self) -> None:
        if self.process.returncode is None:
            with trio.move_on_after(5):
                try:
                    assert self.process.stdin is not None
                    await self.process.stdin.aclose()  # end of stdin stops the peer
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                await self.process.wait()
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        self.stderr_path.unlink(missing_ok=True)

    # -- conveniences used by several tests -------------------------------------------------------------------

    async def dial(self, addr: str) -> dict[str, Any]:
        return await self.call("dial", addr=addr)

    async def mesh(self, topic: str) -> list[str]:
        answer = await self.call("mesh", topic=topic)
        mesh: list[str] = answer["mesh"]
        return mesh

    async def received(self, topic: str | None = None) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = (await self.call("received"))["messages"]
        return [m for m in messages if topic is None or m["topic"] == topic]

    async def control(self) -> dict[str, Any]:
        return await self.call("control")
