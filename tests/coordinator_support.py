"""A real coordinator process and a signing HTTP client, for tests and demos (loopback only).

The process is `python -m mesh.coordinator`, started with port 0 so that concurrent runs never collide; its URL is
read from the ready line it prints on stdout.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from transports.wire import agent_requests as signing
from transports.wire.identity import NodeIdentity

LOOPBACK = "127.0.0.1"


class CoordinatorProcess:
    def __init__(self, db: Path, *options: str, ready_timeout: float = 20.0) -> None:
        self.db = db
        self.options = options
        self.ready_timeout = ready_timeout
        self.url = ""
        self.ready: dict[str, Any] = {}
        # stderr goes to a file, not a pipe: a pipe nobody reads fills up and stalls the coordinator mid-test.
        self.log_path = db.with_name(db.name + ".log")
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        command = [sys.executable, "-m", "mesh.coordinator", "--db", str(self.db), "--listen", f"{LOOPBACK}:0"]
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [*command, *self.options],
                stdout=subprocess.PIPE,
                stderr=log,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self.ready = json.loads(self._read_ready_line())
        self.url = str(self.ready["url"])
        return self.url

    def _read_ready_line(self) -> bytes:
        assert self._proc is not None and self._proc.stdout is not None
        deadline = time.monotonic() + self.ready_timeout
        line = b""
        with selectors.DefaultSelector() as selector:
            selector.register(self._proc.stdout, selectors.EVENT_READ)
            while not line.endswith(b"\n"):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    self.kill()
                    raise TimeoutError(f"coordinator printed no ready line within {self.ready_timeout} s")
                chunk = os.read(self._proc.stdout.fileno(), 1)  # one byte: never read past the ready line
                if not chunk:
                    self.kill()  # reaped, and our end of its stdout closed
                    log = self.log_path.read_text(errors="replace")
                    raise RuntimeError(f"coordinator exited before it was ready:\n{log}")
                line += chunk
        return line

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, and wait: the coordinator's own clean shutdown."""
        if self._proc is None:
            return 0
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
        try:
            code = self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self._close_pipes()
        return code

    def kill(self) -> None:
        """SIGKILL: a crash, for proving that state survives one."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._close_pipes()

    def _close_pipes(self) -> None:
        if self._proc is not None and self._proc.stdout is not None:
            self._proc.stdout.close()

    def __enter__(self) -> CoordinatorProcess:
        self.start()
        return self

    def __exit__(self, *exc: object | TracebackType) -> None:
        self.stop()  # a clean SIGTERM shutdown, so every test also exercises it; SIGKILL if that hangs


def read_task(url: str, task_id: str, offerer: NodeIdentity, **forge: Any) -> httpx.Response:
    """`GET /tasks/{id}`, signed by the task's offerer: the only key the coordinator tells a task's state to."""
    path = f"/tasks/{task_id}"
    headers = signing.sign_request(offerer, "GET", path, b"")
    headers.update(forge.get("headers", {}))
    return httpx.get(f"{url}{path}", headers=headers, timeout=10)


class AgentClient:
    """A synchronous agent: signs each request with its identity. Keyword overrides forge the parts under test."""

    def __init__(self, url: str, identity: NodeIdentity | None = None) -> None:
        self.identity = identity or NodeIdentity.generate()
        self.http = httpx.Client(base_url=url, timeout=10.0)

    @property
    def agent(self) -> str:
        return self.identity.public_key.hex()

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object | TracebackType) -> None:
        self.close()

    def post(self, path: str, body: bytes | dict[str, Any] = b"", **forge: Any) -> httpx.Response:
        raw = json.dumps(body).encode() if isinstance(body, dict) else body
        headers = signing.sign_request(
            self.identity, "POST", path, raw, timestamp_ms=forge.get("timestamp_ms"), nonce=forge.get("nonce")
        )
        headers.update(forge.get("headers", {}))
        return self.http.post(path, content=raw, headers=headers)

    def register(self, mode: str = "docker") -> httpx.Response:
        return self.post("/agents/register", {"sandboxMode": mode})

    def pull(self, mode: str | None = "docker", **forge: Any) -> httpx.Response:
        return self.post("/pull", {} if mode is None else {"sandboxMode": mode}, **forge)
