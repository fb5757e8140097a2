"""The parent's side of `simulations.worker`: start worker processes and ask them things, one request at a time."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent


class WorkerError(RuntimeError):
    pass


class WorkerProcess:
    def __init__(self, index: int, process: trio.Process) -> None:
        self.index = index
        self.process = process
        self.peer_ids: list[str] = []
        self._buffer = b""
        self._lock = trio.Lock()  # one request in flight at a time
        # Every request carries a number the worker echoes. A request cancelled while its answer was on the way (a
        # `move_on_after` around a wait) leaves that answer in the pipe; it is skipped by its number, instead of
        # being taken for the answer to the next request.
        self._next_id = 0

    async def request(self, op: str, **arguments: Any) -> Any:
        assert self.process.stdin is not None and self.process.stdout is not None
        async with self._lock:
            self._next_id += 1
            request_id = self._next_id
            await self.process.stdin.send_all(json.dumps({"op": op, "id": request_id, **arguments}).encode() + b"\n")
            while True:
                while b"\n" not in self._buffer:
                    chunk = await self.process.stdout.receive_some(1 << 20)
                    if not chunk:
                        raise WorkerError(f"worker {self.index} exited (code {self.process.returncode})")
                    self._buffer += chunk
                line, self._buffer = self._buffer.split(b"\n", 1)
                answer = json.loads(line)
                if answer.get("id") == request_id:
                    break
        if "error" in answer:
            raise WorkerError(f"worker {self.index}: {answer['error']}")
        return answer["ok"]

    async def add(self, role: str, peers: list[str], behaviour: str = "honest") -> tuple[str, str]:
        answer = await self.request("add", role=role, peers=peers, behaviour=behaviour)
        self.peer_ids.append(answer["peer_id"])
        return answer["peer_id"], answer["addr"]


@contextlib.asynccontextmanager
async def open_workers(count: int) -> AsyncIterator[list[WorkerProcess]]:
    """`count` worker processes, ended (stdin closed, then killed if need be) when the block exits."""
    async with trio.open_nursery() as nursery:
        workers = []
        for i in range(count):
            process = await nursery.start(
                lambda task_status: trio.run_process(
                    [sys.executable, "-m", "simulations.worker"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    cwd=ROOT,
                    check=False,
                    task_status=task_status,
                )
            )
            workers.append(WorkerProcess(i, process))
        try:
            yield workers
        finally:
            for worker in workers:
                if worker.process.stdin is not None:
                    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                        await worker.process.stdin.aclose()
            # A worker closes its nodes when stdin closes; give it a moment, then the nursery's cancel kills it.
            with trio.move_on_after(5):
                for worker in workers:
                    await worker.process.wait()
            nursery.cancel_scope.cancel()
