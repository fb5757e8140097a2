"""Coordinator behaviour that needs its own process: leases, restarts, rate limits."""

from __future__ import annotations

import base64
import sqlite3
import time
from pathlib import Path

import httpx

from tests.coordinator_support import AgentClient, CoordinatorProcess, read_task
from transports.wire.identity import NodeIdentity
from transports.wire.offers import TaskOffer

OFFERER = NodeIdentity.generate()  # the key that may read these tests' tasks back


def offer() -> bytes:
    return TaskOffer.create(OFFERER, language="python", code="print(1)").sign(OFFERER)


def enqueue(url: str, raw: bytes) -> str:
    response = httpx.post(f"{url}/tasks", content=raw)
    assert response.status_code == 201, response.text
    return str(response.json()["taskId"])


def task_row(db: Path, task_id: str) -> tuple[str, str | None, int, int]:
    with sqlite3.connect(db) as conn:
        row = conn.execute(
            "SELECT state, claimed_by, claims, lapses FROM tasks WHERE task_id = ?", (task_id,)
        ).fetchone()
    return row


def test_silent_agents_task_is_requeued_after_its_lease(tmp_path: Path) -> None:
    with CoordinatorProcess(
        tmp_path / "state.db", "--lease", "0.5", "--rate", "1000", "--burst", "1000"
    ) as coordinator:
        task_id = enqueue(coordinator.url, offer())
        with AgentClient(coordinator.url) as silent, AgentClient(coordinator.url) as live:
            silent.register()
            live.register()
            assert silent.pull().json()["task"]["taskId"] == task_id
            assert live.pull().json()["task"] is None  # held by the silent agent while its lease runs

            # The live agent keeps pulling (which is also its heartbeat); the silent one sends nothing.
            deadline = time.monotonic() + 10
            while (task := live.pull().json()["task"]) is None:
                assert time.monotonic() < deadline, "the silent agent's claim never lapsed"
                time.sleep(0.05)
            assert task["taskId"] == task_id
            assert task_row(coordinator.db, task_id) == ("claimed", live.agent, 2, 1)
            # The silent agent's late result is refused: the claim is someone else's now.
            late = silent.post(f"/tasks/{task_id}/result", b"\x92\xc4\x00\xc4\x00")
            assert late.status_code == 409 and late.json()["reason"] == "claimed_by_other"


def test_heartbeats_keep_a_claim_alive(tmp_path: Path) -> None:
    with CoordinatorProcess(
        tmp_path / "state.db", "--lease", "0.5", "--rate", "1000", "--burst", "1000"
    ) as coordinator:
        task_id = enqueue(coordinator.url, offer())
        with AgentClient(coordinator.url) as agent:
            agent.register()
            assert agent.pull().json()["task"]["taskId"] == task_id
            until = time.monotonic() + 1.5  # three leases
            while time.monotonic() < until:
                assert agent.post("/agents/heartbeat", {"sandboxMode": "docker"}).status_code == 200
                time.sleep(0.1)
            assert task_row(coordinator.db, task_id) == ("claimed", agent.agent, 1, 0)


def test_queued_and_claimed_tasks_survive_a_crash(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    raws = [offer() for _ in range(3)]
    agent = NodeIdentity.generate()
    with CoordinatorProcess(db) as first:
        ids = [enqueue(first.url, raw) for raw in raws]
        with AgentClient(first.url, agent) as client:
            client.register()
            assert client.pull().json()["task"]["taskId"] == ids[0]
        first.kill()  # SIGKILL: no clean shutdown to lean on
    with CoordinatorProcess(db) as second:
        status = [read_task(second.url, i, OFFERER).json()["state"] for i in ids]
        assert status == ["claimed", "queued", "queued"]
        with AgentClient(second.url, agent) as client:
            pulled = client.pull().json()["task"]  # still registered: its record survived too
        assert pulled["taskId"] == ids[1]
        assert base64.b64decode(pulled["offer"]) == raws[1]
        # The offer dedupe survives as well: an offer runs at most once, restart or not.
        assert httpx.post(f"{second.url}/tasks", content=raws[2]).json()["reason"] == "duplicate_task"
        assert second.stop() == 0  # SIGTERM is a clean exit


def test_rate_limit_is_per_agent(tmp_path: Path) -> None:
    with (
        CoordinatorProcess(tmp_path / "state.db", "--rate", "0.01", "--burst", "3") as coordinator,
        AgentClient(coordinator.url) as greedy,
        AgentClient(coordinator.url) as polite,
    ):
        assert greedy.register().status_code == 200
        assert polite.register().status_code == 200
        assert greedy.pull().status_code == 200
        assert greedy.pull().status_code == 200
        limited = greedy.pull()
        assert limited.status_code == 429 and limited.json()["reason"] == "rate_limited"
        assert polite.pull().status_code == 200
        # An unsigned request in the greedy agent's name cannot drain the polite agent's bucket, nor anyone's.
        forged = polite.pull(headers={"x-edgecoder-agent": NodeIdentity.generate().public_key.hex()})
        assert forged.json()["reason"] == "bad_signature"
        assert polite.pull().status_code == 200


def test_task_fails_after_its_last_allowed_lapse(tmp_path: Path) -> None:
    options = ("--lease", "0.3", "--max-lapses", "1", "--rate", "1000", "--burst", "1000")
    with CoordinatorProcess(tmp_path / "state.db", *options) as coordinator:
        task_id = enqueue(coordinator.url, offer())
        with AgentClient(coordinator.url) as agent:
            agent.register()
            assert agent.pull().json()["task"]["taskId"] == task_id
            # Nobody pulls now: the reaper alone must notice the silence.
            deadline = time.monotonic() + 10
            while (status := read_task(coordinator.url, task_id, OFFERER).json())["state"] == "claimed":
                assert time.monotonic() < deadline, "the reaper never took the claim back"
                time.sleep(0.05)
            assert (status["state"], status["reason"]) == ("failed", "lease_expired")
            assert task_row(coordinator.db, task_id) == ("failed", None, 1, 1)
