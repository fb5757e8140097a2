"""`edgecoder coordinator submit` against a real coordinator, and a node that pins the coordinator's key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.coordinator_support import CoordinatorProcess
from tests.test_cli_process import NodeProcess
from transports.wire.identity import NodeIdentity

CLI = [sys.executable, "-m", "mesh.cli"]
SUM = "import json, sys\nprint(sum(json.load(sys.stdin)['xs']))\n"


def submit(url: str, key: Path, code: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [*CLI, "coordinator", "submit", "--url", url, "--key", str(key), "--language", "python"]
    return subprocess.run(
        [*command, "--code-file", str(code), *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )


def keys(tmp_path: Path, *names: str) -> list[Path]:
    paths = []
    for name in names:
        path = tmp_path / f"{name}.key"
        NodeIdentity.generate().save(path)
        paths.append(path)
    return paths


def test_submit_enqueues_and_a_duplicate_is_a_typed_refusal(tmp_path: Path) -> None:
    (me,) = keys(tmp_path, "me")
    code = tmp_path / "sum.py"
    code.write_text(SUM)
    coordinator = CoordinatorProcess(tmp_path / "tasks.sqlite")
    url = coordinator.start()
    try:
        queued = submit(url, me, code, "--input", '{"xs": [1, 2]}')
        assert queued.returncode == 0, queued.stderr
        task_id = json.loads(queued.stdout)["taskId"]
        assert len(task_id) == 32
        # Nobody pulls: --wait gives up at --wait-s with a typed refusal, and says what state the task is in.
        waited = submit(url, me, code, "--wait", "--wait-s", "0.5")
        assert waited.returncode == 3, waited.stderr
        lines = [json.loads(line) for line in waited.stdout.splitlines()]
        assert lines[-1]["refusal"] == "timeout" and "queued" in lines[-1]["detail"]
    finally:
        coordinator.stop()


@pytest.mark.docker
def test_submit_wait_verifies_the_result_of_a_node_that_pins_the_coordinator(tmp_path: Path) -> None:
    me, node_key, coordinator_key = keys(tmp_path, "me", "node", "coordinator")
    code = tmp_path / "sum.py"
    code.write_text(SUM)
    coordinator = CoordinatorProcess(tmp_path / "tasks.sqlite", "--key", str(coordinator_key))
    url = coordinator.start()
    pinned = coordinator.ready["peerId"]  # the ready line's PeerID; its hex publicKey works as well
    assert pinned == NodeIdentity.load(coordinator_key).peer_id
    node = NodeProcess(node_key, "--coordinator", url, "--coordinator-key", pinned, "--state-dir", str(tmp_path / "s"))
    try:
        assert node.ready["coordinator"] == url
        done = submit(url, me, code, "--input", '{"xs": [4, 5]}', "--wait", "--wait-s", "60")
        assert done.returncode == 0, (done.stdout, done.stderr)
        task, result = (json.loads(line) for line in done.stdout.splitlines())
        assert len(task["taskId"]) == 32
        assert result["ok"] is True and result["stdout"] == "9\n"
        assert result["executorPeerId"] == node.ready["peerId"]
    finally:
        assert node.stop() == 0
        coordinator.stop()


def test_ctrl_c_while_waiting_is_exit_130_in_one_line(tmp_path: Path) -> None:
    import signal

    (me,) = keys(tmp_path, "me")
    code = tmp_path / "sum.py"
    code.write_text(SUM)
    coordinator = CoordinatorProcess(tmp_path / "tasks.sqlite")
    url = coordinator.start()
    try:
        waiting = subprocess.Popen(
            [*CLI, "coordinator", "submit", "--url", url, "--key", str(me), "--language", "python"]  # noqa: RUF005
            + ["--code-file", str(code), "--wait", "--wait-s", "120"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert waiting.stdout is not None
        assert "taskId" in waiting.stdout.readline()  # queued; now it polls
        waiting.send_signal(signal.SIGINT)
        _, err = waiting.communicate(timeout=30)
        assert waiting.returncode == 130
        assert err.strip() == "interrupted" and "Traceback" not in err
    finally:
        coordinator.stop()
