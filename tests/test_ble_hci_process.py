"""BLE across processes, through the real CLI and a real HCI transport.

`python -m bumble.apps.controllers tcp-server:127.0.0.1:P1 tcp-server:127.0.0.1:P2` runs two virtual controllers on
one link. `edgecoder node --ble-hci tcp-client:127.0.0.1:P1` takes offers in one process, `edgecoder offer --ble-hci
tcp-client:127.0.0.1:P2` advertises one in another: bumble's host stack on each side, HCI over TCP between host and
controller, which is the code path of a USB dongle. Ports are picked free; every process is stopped at the end.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from tests.conftest import containers_of

CLI = [sys.executable, "-m", "mesh.cli"]
SUM = "import json, sys\nprint(sum(json.load(sys.stdin)['xs']))\n"
READY_S = 60


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def stop(process: subprocess.Popen[Any], sig: int = signal.SIGTERM) -> int:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            return process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait(timeout=30)


class Controllers:
    """Two virtual controllers on one link, each behind its own TCP port."""

    def __init__(self) -> None:
        self.ports = free_ports(2)
        specs = [f"tcp-server:127.0.0.1:{p}" for p in self.ports]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bumble.apps.controllers", *specs],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + READY_S
        for port in self.ports:  # ready when both ports listen; the probe sends nothing and leaves
            while True:
                assert self.process.poll() is None, "the controllers app exited"
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, "the controllers never listened"
                    time.sleep(0.05)

    def spec(self, i: int) -> str:
        return f"tcp-client:127.0.0.1:{self.ports[i]}"


class Logged:
    """A process whose stderr (JSON log lines) goes to a file that tests can wait on."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._log_file: IO[str] = log.open("w")
        self.process: subprocess.Popen[str] = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=self._log_file, text=True, env=env
        )

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text().splitlines():
            with_json = line[line.find("{") :] if "{" in line else ""
            try:
                out.append(json.loads(with_json))
            except json.JSONDecodeError:
                continue
        return out

    def wait_text(self, text: str, timeout: float = READY_S) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log.read_text():
            assert self.process.poll() is None, f"{self.log.name}: process ended: {self.log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"{self.log.name}: no {text!r} in {timeout} s"
            time.sleep(0.05)

    def close(self, sig: int = signal.SIGTERM) -> int:
        try:
            return stop(self.process, sig)
        finally:
            self._log_file.close()
            if self.process.stdout is not None:
                self.process.stdout.close()


class BleNode(Logged):
    def __init__(self, key: Path, spec: str, log: Path, env: dict[str, str] | None = None) -> None:
        args = [*CLI, "node", "--key", str(key), "--listen", "/ip4/127.0.0.1/tcp/0", "--log-json", "--ble-hci", spec]
        super().__init__(args, log, env)
        assert self.process.stdout is not None
        try:
            first = self.process.stdout.readline()  # the contract: the first stdout line is the ready event
            if not first:
                code = self.process.wait(timeout=30)
                raise AssertionError(f"the node exited ({code}) before ready: {log.read_text()[-2000:]!r}")
            self.ready = json.loads(first)
            assert self.ready["event"] == "ready", first
        except BaseException:
            self.close(signal.SIGKILL)
            raise

    def sessions(self) -> list[dict[str, Any]]:
        return [e for e in self.events() if e.get("event") == "ble session"]


def keygen(path: Path) -> Path:
    result = subprocess.run([*CLI, "keygen", "--out", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return path


def offer_args(key: Path, spec: str, code: Path, *extra: str) -> list[str]:
    return [
        *CLI,
        "offer",
        "--key",
        str(key),
        "--ble-hci",
        spec,
        "--language",
        "python",
        "--code-file",
        str(code),
        "--log-level",
        "info",  # the tests wait on the offerer's "node connected"
        *extra,
    ]


def offer(key: Path, spec: str, code: Path, *extra: str, timeout: float = 120) -> tuple[int, dict[str, Any], str]:
    done = subprocess.run(offer_args(key, spec, code, *extra), capture_output=True, text=True, timeout=timeout)
    lines = done.stdout.strip().splitlines()
    return done.returncode, (json.loads(lines[-1]) if lines else {}), done.stderr


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ble-hci")
    (path / "sum.py").write_text(SUM)
    keygen(path / "node.key")
    keygen(path / "none-node.key")  # a node of its own: one key runs one node at a time
    keygen(path / "offerer.key")
    return path


@pytest.fixture(scope="module")
def docker_node(workdir: Path, docker_api: Any) -> Iterator[tuple[BleNode, Controllers]]:
    """One node with a working sandbox on controller 0, for the tests that run offers; offerers use controller 1."""
    controllers = Controllers()
    node: BleNode | None = None
    try:
        node = BleNode(workdir / "node.key", controllers.spec(0), workdir / "node.log")
        assert node.ready["sandboxMode"] == "docker"
        yield node, controllers
    finally:
        if node is not None:
            assert node.close() == 0
            assert containers_of(docker_api, node.ready["peerId"]) == []
        stop(controllers.process)


def executor_of(node: BleNode) -> str:
    from transports.wire.identity import public_key_of_peer_id

    return public_key_of_peer_id(node.ready["peerId"]).hex()


@pytest.mark.docker
def test_an_offer_over_hci_runs_on_the_node_and_the_offerer_prints_the_verified_result(
    docker_node: tuple[BleNode, Controllers], workdir: Path
) -> None:
    node, controllers = docker_node
    code, result, err = offer(
        workdir / "offerer.key", controllers.spec(1), workdir / "sum.py", "--input", '{"xs": [1, 2, 3]}'
    )
    assert code == 0, err
    assert result["ok"] is True and result["stdout"] == "6\n" and result["exitCode"] == 0
    # The same JSON as the other offer paths, and signed by the node that claimed it (checked by the offerer).
    assert set(result) >= {"ok", "stdout", "stderr", "exitCode", "durationMs", "offerId", "executor"}
    assert result["executor"] == executor_of(node)


@pytest.mark.docker
def test_two_offers_in_a_row_from_two_offerer_processes(
    docker_node: tuple[BleNode, Controllers], workdir: Path
) -> None:
    _, controllers = docker_node
    outputs = []
    for xs in ([10, 20], [5, 6, 7]):
        code, result, err = offer(
            workdir / "offerer.key", controllers.spec(1), workdir / "sum.py", "--input", json.dumps({"xs": xs})
        )
        assert code == 0, err
        outputs.append(result["stdout"])
    assert outputs == ["30\n", "18\n"]


@pytest.mark.docker
def test_a_host_request_over_ble_is_refused_sandbox_required(
    docker_node: tuple[BleNode, Controllers], workdir: Path, docker_api: Any
) -> None:
    node, controllers = docker_node
    code, answer, err = offer(
        workdir / "offerer.key", controllers.spec(1), workdir / "sum.py", "--sandbox", "host", "--wait-s", "30"
    )
    # The intake refuses it before any claim and says so over BLE: a typed refusal (exit 3), never a run anywhere.
    assert code == 3, err
    # The seed's shape, with the reason code beside it.
    assert answer["ok"] is False and answer["refusal"] == "sandbox_required_for_remote_task"
    assert answer["stderr"] == "sandbox_required_for_remote_task" and answer["exitCode"] is None
    assert answer["queueForCloud"] is True and answer["queueReason"] == "sandbox_required_for_remote_task"
    assert node.process.poll() is None


def test_a_sandbox_mode_none_node_takes_nothing_over_ble(workdir: Path) -> None:
    controllers = Controllers()
    node: BleNode | None = None
    try:
        env = {**os.environ, "SANDBOX_MODE": "none"}
        node = BleNode(workdir / "none-node.key", controllers.spec(0), workdir / "none.log", env=env)
        assert node.ready["sandboxMode"] == "none"
        code, answer, err = offer(workdir / "offerer.key", controllers.spec(1), workdir / "sum.py", "--wait-s", "4")
        assert code == 3, err
        assert answer["ok"] is False and answer["refusal"] == "timeout"
        assert "0 node link(s)" in answer["detail"]  # the node never connected: it does not even scan
        assert node.sessions() == []
    finally:
        if node is not None:
            assert node.close() == 0
        stop(controllers.process)


@pytest.mark.docker
def test_an_offerer_that_disconnects_mid_transfer_leaves_the_node_serving(
    docker_node: tuple[BleNode, Controllers], workdir: Path
) -> None:
    node, controllers = docker_node
    big = workdir / "big.py"
    big.write_text(SUM + "#" * 6000)  # ~6 KB: about 17 s on a Linux-default link (see docs/ble.md)
    before = len(node.sessions())
    leaving = Logged(
        offer_args(workdir / "offerer.key", controllers.spec(1), big, "--ble-link-model", "linux", "--wait-s", "60"),
        workdir / "leaving.log",
    )
    try:
        leaving.wait_text("node connected")
    finally:
        # Ctrl-C mid-transfer: the offerer stops advertising, drops its link and exits 130 (no traceback).
        assert leaving.close(signal.SIGINT) == 130
    assert "Traceback" not in leaving.log.read_text() and "interrupted" in leaving.log.read_text()
    deadline = time.monotonic() + READY_S
    while len(node.sessions()) == before:
        assert time.monotonic() < deadline, "the node never ended the broken session"
        time.sleep(0.05)
    broken = node.sessions()[before]
    assert broken["fault"] is not None and broken["fault"].split(":")[0] in ("ble/disconnected", "ble/timeout")
    assert broken["verdict"] is None and not broken["claimed"]  # nothing half-received reached the intake
    assert node.process.poll() is None
    code, result, err = offer(
        workdir / "offerer.key", controllers.spec(1), workdir / "sum.py", "--input", '{"xs": [2]}'
    )
    assert code == 0 and result["stdout"] == "2\n", err
