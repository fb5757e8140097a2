"""The CLI contract, as separate processes: `edgecoder node` twice, then `edgecoder offer`, `exec` and `doctor`."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import httpx
import pytest

from tests.conftest import containers_of

pytestmark = pytest.mark.docker

CLI = [sys.executable, "-m", "mesh.cli"]
SUM = "import json, sys\nprint(sum(json.load(sys.stdin)['xs']))\n"


def edgecoder(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=env)


def last_json(output: str) -> dict[str, Any]:
    return json.loads(output.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NodeProcess:
    def __init__(self, key: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [*CLI, "node", "--key", str(key), "--listen", "/ip4/127.0.0.1/tcp/0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        assert self.process.stdout is not None
        try:
            first = self.process.stdout.readline()  # the contract: the first stdout line is the ready event
            self.ready = json.loads(first)
            assert self.ready["event"] == "ready", first
        except BaseException:
            self.stop(signal.SIGKILL)
            raise

    @property
    def addr(self) -> str:
        return str(self.ready["addrs"][0])

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Signal the node, wait for it and close our end of its stdout. Its exit status; stopping twice is fine."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=30)
        finally:
            assert self.process.stdout is not None
            self.process.stdout.close()


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    paths = {}
    for name in ("a", "b", "offerer", "refuser"):
        paths[name] = tmp_path / f"{name}.key"
        result = edgecoder("keygen", "--out", str(paths[name]))
        assert result.returncode == 0 and result.stdout.startswith("12D3KooW"), result.stderr
    return paths


@pytest.fixture
def code(tmp_path: Path) -> Path:
    path = tmp_path / "sum.py"
    path.write_text(SUM)
    return path


@pytest.fixture
def two_nodes(keys: dict[str, Path]) -> Iterator[tuple[NodeProcess, NodeProcess, int]]:
    port = free_port()
    a = NodeProcess(keys["a"], "--metrics-port", str(port))
    try:
        b = NodeProcess(keys["b"], "--peer", a.addr, "--log-json")
        try:
            yield a, b, port
        finally:
            b.stop()
    finally:
        a.stop()


def test_two_nodes_and_an_offer_through_the_cli(
    two_nodes: tuple[NodeProcess, NodeProcess, int], keys: dict[str, Path], code: Path, docker_api: Any
) -> None:
    a, b, metrics_port = two_nodes
    assert a.ready["sandboxMode"] == "docker" and a.ready["peerId"].startswith("12D3KooW")

    direct = edgecoder(
        "offer",
        "--key",
        str(keys["offerer"]),
        "--to",
        b.addr,
        "--language",
        "python",
        "--code-file",
        str(code),
        "--input",
        '{"xs": [1, 2, 3]}',
    )
    assert direct.returncode == 0, direct.stderr
    result = last_json(direct.stdout)
    assert result["ok"] is True and result["stdout"] == "6\n" and result["exitCode"] == 0
    assert set(result) >= {"ok", "stdout", "stderr", "exitCode", "durationMs", "queueForCloud", "queueReason"}

    gossip = edgecoder(
        "offer",
        "--key",
        str(keys["offerer"]),
        "--gossip",
        "--peer",
        a.addr,
        "--language",
        "python",
        "--code-file",
        str(code),
        "--input",
        '{"xs": [10, 20]}',
    )
    assert gossip.returncode == 0, gossip.stderr
    assert last_json(gossip.stdout)["stdout"] == "30\n"

    host = edgecoder(
        "offer",
        "--key",
        str(keys["offerer"]),
        "--to",
        a.addr,
        "--language",
        "python",
        "--code-file",
        str(code),
        "--sandbox",
        "host",
    )
    assert host.returncode == 3  # a typed refusal, before the offer was admitted
    refused = last_json(host.stdout)
    assert refused["ok"] is False and refused["refusal"] == "sandbox_required_for_remote_task"
    assert refused["stderr"] == "sandbox_required_for_remote_task" and refused["exitCode"] is None  # the seed's shape
    assert refused["queueForCloud"] is True and refused["queueReason"] == "sandbox_required_for_remote_task"

    metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    assert "edgecoder_offers_admitted_total" in metrics and "edgecoder_participating 1.0" in metrics

    labels = [a.ready["peerId"], b.ready["peerId"]]
    assert a.stop() == 0 and b.stop() == 0
    for label in labels:  # SIGTERM: runs finished or aborted, pools removed, nothing left behind
        assert containers_of(docker_api, label) == []


def test_sigterm_mid_run_aborts_the_run_answers_the_offerer_and_leaves_no_container(
    keys: dict[str, Path], tmp_path: Path, docker_api: Any
) -> None:
    slow = tmp_path / "slow.py"
    slow.write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    port = free_port()
    node = NodeProcess(keys["a"], "--metrics-port", str(port))
    with subprocess.Popen(
        [*CLI, "offer", "--key", str(keys["offerer"]), "--to", node.addr, "--language", "python",
         "--code-file", str(slow), "--timeout-ms", "30000"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    ) as offer:  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while "edgecoder_runs_in_flight 1.0" not in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text:
                assert time.monotonic() < deadline, "the offer never started running"
                time.sleep(0.1)
            assert node.stop(signal.SIGTERM) == 0  # within stop()'s grace, or it is killed and this fails
            out, _ = offer.communicate(timeout=30)
        finally:
            offer.kill()  # leaving `with` closes its stdout and reaps it
            node.stop(signal.SIGKILL)
    answer = last_json(out)
    assert answer["ok"] is False
    assert answer.get("errorKind") == "aborted" or answer.get("refusal") in ("shutting_down", "unreachable")
    assert containers_of(docker_api, node.ready["peerId"]) == []


def test_a_sandbox_mode_none_node_refuses_and_says_so(keys: dict[str, Path], code: Path) -> None:
    env = {**os.environ, "SANDBOX_MODE": "none"}
    refuser = NodeProcess(keys["refuser"], env=env)
    try:
        assert refuser.ready["sandboxMode"] == "none"
        offer = edgecoder(
            "offer",
            "--key",
            str(keys["offerer"]),
            "--to",
            refuser.addr,
            "--language",
            "python",
            "--code-file",
            str(code),
        )
        assert offer.returncode == 3
        assert last_json(offer.stdout)["refusal"] == "sandbox_unavailable"
        doctor = edgecoder("doctor", "--json", env=env)
        assert doctor.returncode == 1 and last_json(doctor.stdout)["ok"] is False
    finally:
        assert refuser.stop(signal.SIGINT) == 0


def test_exec_runs_local_code_on_the_host_or_in_docker(code: Path) -> None:
    for sandbox in ("host", "docker"):
        result = edgecoder(
            "exec", "--code-file", str(code), "--language", "python", "--sandbox", sandbox, "--input", '{"xs": [2, 2]}'
        )
        assert result.returncode == 0, result.stderr
        assert last_json(result.stdout)["stdout"] == "4\n"


def test_exec_subset_check_and_its_switch(tmp_path: Path) -> None:
    path = tmp_path / "evil.py"
    path.write_text("print(eval('1 + 1'))\n")
    checked = edgecoder("exec", "--code-file", str(path), "--language", "python")
    assert checked.returncode == 1
    assert last_json(checked.stdout)["queueReason"] == "outside_subset"
    unchecked = edgecoder("exec", "--code-file", str(path), "--language", "python", "--no-subset")
    assert unchecked.returncode == 0 and last_json(unchecked.stdout)["stdout"] == "2\n"


def test_doctor_says_this_machine_can_sandbox() -> None:
    result = edgecoder("doctor", "--json")
    assert result.returncode == 0, result.stdout
    report = last_json(result.stdout)
    assert report["ok"] is True and all(check["ok"] for check in report["checks"])
    names = [check["name"] for check in report["checks"]]
    for name in ("docker daemon", "runc", "runsc (gVisor)", "cgroups", "userns-remap", "seccomp", "canary runc"):
        assert name in names
    assert report["tiers"]["runc"] == {
        "offered": True,
        "ok": True,
        "reason": "ready",
        "detail": ANY,
        "missing": [],
        "platform": None,
    }
    text = edgecoder("doctor")
    assert "[ok  ] canary runc: proven: memory 128 MiB, pids 50, cpus 0.5" in text.stdout
    assert "image and mounts: an offer carries only language, code, JSON input, limits and a runtime's name" in (
        text.stdout
    )
    # Every declared runtime is named: built with its digest and packages, or not built with the command that builds it.
    runtimes = {c["name"]: c for c in report["checks"] if c["name"].startswith("runtime ")}
    assert set(runtimes) == {"runtime python", "runtime python-science"}
    assert runtimes["runtime python"]["level"] == "ok" and "python3=" in runtimes["runtime python"]["detail"]
    science = runtimes["runtime python-science"]
    assert science["level"] == "ok" or science["fix"] == "edgecoder image build --runtime python-science"


@pytest.mark.gvisor
def test_exec_runs_under_the_isolation_it_is_given(code: Path, tmp_path: Path) -> None:
    kernel = tmp_path / "kernel.py"
    kernel.write_text("import os\nprint(os.uname().release)\n")
    runs = {
        tier: edgecoder("exec", "--code-file", str(kernel), "--language", "python", "--isolation", tier)
        for tier in ("runc", "gvisor")
    }
    assert last_json(runs["gvisor"].stdout)["stdout"] == "4.4.0\n", runs["gvisor"].stderr
    assert last_json(runs["runc"].stdout)["stdout"] == os.uname().release + "\n", runs["runc"].stderr


def test_cli_refuses_bad_usage_without_a_traceback(tmp_path: Path, code: Path) -> None:
    loose = tmp_path / "loose.key"
    loose.write_bytes(b"\x01" * 32)
    loose.chmod(0o644)
    result = edgecoder(
        "offer", "--key", str(loose), "--to", "/ip4/127.0.0.1/tcp/1", "--language", "python", "--code-file", str(code)
    )
    assert result.returncode == 2 and "loose permissions" in result.stderr and "Traceback" not in result.stderr
    both = edgecoder("offer", "--key", str(loose), "--language", "python", "--code-file", str(code))
    assert both.returncode == 2 and "exactly one of" in both.stderr


def test_a_node_pulls_from_a_coordinator_and_runs_the_task_in_docker(
    tmp_path: Path, keys: dict[str, Path], docker_api: Any
) -> None:
    from executor.contract import Limits
    from tests.coordinator_support import CoordinatorProcess, read_task
    from transports.wire.identity import NodeIdentity
    from transports.wire.offers import TaskOffer
    from transports.wire.results import open_result

    coordinator = CoordinatorProcess(tmp_path / "tasks.sqlite")
    url = coordinator.start()
    submitter = NodeIdentity.generate()
    node = NodeProcess(keys["a"], "--coordinator", url)
    try:
        raw = TaskOffer.create(
            submitter, language="python", code=SUM, input={"xs": [4, 5]}, limits=Limits(timeout_ms=5000)
        ).sign(submitter)
        created = httpx.post(f"{url}/tasks", content=raw, timeout=10)
        assert created.status_code == 201, created.text
        task_id = created.json()["taskId"]
        deadline = time.monotonic() + 60
        while True:
            status = read_task(url, task_id, submitter).json()
            if status["state"] not in ("queued", "claimed") or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert status["state"] == "done", status
        result = open_result(
            base64.b64decode(status["result"]), expect_executor=NodeIdentity.load(keys["a"]).public_key
        )
        assert result.result.ok and result.result.stdout == "9\n"
    finally:
        assert node.stop() == 0
        coordinator.stop()
    assert containers_of(docker_api, node.ready["peerId"]) == []


def test_an_offer_refused_for_want_of_room_says_when_to_retry(keys: dict[str, Path], tmp_path: Path) -> None:
    """Two slow offers from two other offerers hold the node's one worker and one queue place; a third offer is
    refused `busy` with the node's retry hint, printed for the user as `retryAfterMs` (an offer sent before it ends
    is answered unparsed: tests/test_hardening_holdoff.py). It carries no queueDeadlineMs, so the node does not hold it.

    The slow offers hold their places until the test ends, not for some seconds: with the default 5 s run they once
    timed out while the third offer's process was still starting (at load 19), and the third offer found room.
    (--wait-s 300: the offer's lifetime is twice the wait, and a node takes none over 10 minutes.)"""
    port = free_port()
    hold = ["--max-timeout-ms", "600000"]
    node = NodeProcess(keys["a"], "--metrics-port", str(port), "--concurrency", "1", "--queue-size", "1", *hold)
    slow = tmp_path / "slow.py"
    slow.write_text("import time\ntime.sleep(3600)\n")
    fast = tmp_path / "fast.py"
    fast.write_text("print(1)\n")
    offer = [*CLI, "offer", "--to", node.addr, "--language", "python"]
    holders = [
        subprocess.Popen(
            [*offer, "--key", str(keys[who]), "--code-file", str(slow), "--timeout-ms", "600000", "--wait-s", "300"],
            stdout=subprocess.DEVNULL,
        )
        for who in ("b", "refuser")
    ]
    try:
        deadline = time.monotonic() + 240  # a guard against a hang only: at load 19 two offers took 34 s to arrive
        while httpx.get(f"http://127.0.0.1:{port}/status", timeout=10).json()["queueFresh"] < 1:
            assert time.monotonic() < deadline, "the second slow offer never queued"
            time.sleep(0.1)
        busy = edgecoder(*offer[len(CLI) :], "--key", str(keys["offerer"]), "--code-file", str(fast))
        assert busy.returncode == 3, busy.stderr
        answer = last_json(busy.stdout)
        assert answer["ok"] is False and answer["refusal"] == "busy" and answer["retryAfterMs"] == 500, answer
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()
        assert node.stop() == 0


def test_edgecoder_cancel_stops_a_job_and_prints_its_signed_aborted_result(
    keys: dict[str, Path], tmp_path: Path
) -> None:
    """`edgecoder offer` in one process, `edgecoder cancel` with the same key in another: the offer gets the aborted
    result with the program's first line, and so does the cancel; another key's cancel is refused (exit 3)."""
    # Time enough for two more CLI processes to start on a loaded machine before the run's own timeout ends it.
    node = NodeProcess(keys["a"], "--max-timeout-ms", "240000")
    talker = tmp_path / "talker.py"
    first_line = "started " + "x" * 100
    talker.write_text(f"import time\nprint({first_line!r}, flush=True)\ntime.sleep(300)\n")
    try:
        offer = subprocess.Popen(
            [*CLI, "offer", "--key", str(keys["offerer"]), "--to", node.addr, "--language", "python"]  # noqa: RUF005
            + ["--code-file", str(talker), "--timeout-ms", "240000", "--wait-s", "250", "--follow"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert offer.stdout is not None
        header = json.loads(offer.stdout.readline())  # --follow: the offer's id first, then its output as it comes
        offer_id = header["offerId"]
        assert offer.stdout.readline() == first_line + "\n"  # the first line, before the program ends
        refused = edgecoder("cancel", "--key", str(keys["refuser"]), "--to", node.addr, offer_id)
        assert refused.returncode == 3 and last_json(refused.stdout)["refusal"] == "not_offerer", refused
        cancelled = edgecoder("cancel", "--key", str(keys["offerer"]), "--to", node.addr, offer_id)
        assert cancelled.returncode == 0, cancelled.stderr
        shown = last_json(cancelled.stdout)
        assert (shown["ok"], shown["errorKind"], shown["stdout"]) == (False, "aborted", first_line + "\n")
        out, err = offer.communicate(timeout=60)
        assert offer.returncode == 1, (out, err)
        followed = last_json(out)
        assert followed["streamed"] >= 1 and followed["streamVerified"] is True  # what it showed is what was signed
        assert {k: followed[k] for k in shown} == shown
    finally:
        node.stop()
