"""A node logs each peer that comes and goes: two `edgecoder node` processes on loopback, read from stderr."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

CLI = [sys.executable, "-m", "mesh.cli"]
# No sandbox: this is about connections, and a SANDBOX_MODE=none node needs no Docker.
ENV = {k: v for k, v in os.environ.items() if not k.startswith("EDGECODER_") or k == "EDGECODER_STATE_DIR"}
ENV["EDGECODER_SANDBOX_MODE"] = "none"


class Node:
    def __init__(self, tmp_path: Path, name: str, *args: str) -> None:
        key = tmp_path / f"{name}.key"
        made = subprocess.run([*CLI, "keygen", "--out", str(key)], capture_output=True, text=True, timeout=60, env=ENV)
        assert made.returncode == 0, made.stderr
        self.peer_id = made.stdout.strip()
        self.process = subprocess.Popen(
            [*CLI, "node", "--key", str(key), "--listen", "/ip4/127.0.0.1/tcp/0", "--log-json", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        assert self.process.stdout is not None and self.process.stderr is not None
        self.ready = json.loads(self.process.stdout.readline())
        assert self.ready["event"] == "ready"
        self.records: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, args=(self.process.stderr,), daemon=True).start()

    def _read(self, stream: Any) -> None:
        with stream:  # the only reader of the node's stderr: closed at its end of file
            for line in stream:
                try:
                    self.records.put(json.loads(line))
                except ValueError:
                    self.records.put({"event": "not json", "line": line})

    def wait_for(self, event: str, peer: str, timeout: float = 30.0) -> dict[str, Any]:
        seen: list[object] = []
        while True:
            try:
                record = self.records.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no {event!r} for {peer} within {timeout} s; saw {seen}") from None
            seen.append(record.get("event"))
            if record.get("event") == event and record.get("peer") == peer:
                return record

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        finally:
            assert self.process.stdout is not None
            self.process.stdout.close()


def test_a_node_logs_a_peer_connecting_and_disconnecting(tmp_path: Path) -> None:
    a = Node(tmp_path, "a")
    try:
        b = Node(tmp_path, "b", "--bootstrap", a.ready["addrs"][0])
        try:
            connected = a.wait_for("peer connected", b.peer_id)
            assert connected["level"] == "info" and connected["direction"] == "inbound"
            assert connected["relayed"] is False
            assert b.wait_for("peer connected", a.peer_id)["direction"] == "outbound"
        finally:
            b.stop()
        assert a.wait_for("peer disconnected", b.peer_id)["level"] == "info"
    finally:
        a.stop()
