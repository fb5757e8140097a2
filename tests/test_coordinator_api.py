"""The coordinator's HTTP API against the real process on loopback: every refusal, and the task life cycle."""

from __future__ import annotations

import base64
import hashlib
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from executor.contract import ExecResult
from mesh.coordinator import signing
from mesh.identity import NodeIdentity
from mesh.offers import TaskOffer, TaskResult
from tests.coordinator_support import AgentClient, CoordinatorProcess


def rows(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql, args).fetchall()


def signed_offer(offerer: NodeIdentity | None = None, **kw: Any) -> bytes:
    offerer = offerer or NodeIdentity.generate()
    return TaskOffer.create(offerer, language="python", code="print(6 * 7)", **kw).sign(offerer)


def signed_result(offer_raw: bytes, executor: NodeIdentity, *, signer: NodeIdentity | None = None) -> bytes:
    from mesh.offers import parse_offer

    offer = parse_offer(offer_raw).offer
    result = TaskResult(
        offer_id=offer.offer_id,
        offer_digest=hashlib.sha256(offer_raw).digest(),
        executor=executor.public_key,
        result=ExecResult(ok=True, stdout="42\n", exit_code=0, duration_ms=5),
    )
    if signer is None:
        return result.sign(executor)
    # A forgery: the fields name the executor, the signature is someone else's.
    from mesh.codec import Domain, seal

    return seal(Domain.RESULT, result.to_wire_fields(), signer)


def refusal(response: httpx.Response, status: int, reason: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["reason"] == reason, body
    assert isinstance(body["detail"], str)


def wait_until(condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordinatorProcess]:
    db = tmp_path_factory.mktemp("coordinator") / "state.db"
    with CoordinatorProcess(db, "--rate", "1000", "--burst", "1000") as proc:
        yield proc


@pytest.fixture
def agent(coordinator: CoordinatorProcess) -> Iterator[AgentClient]:
    client = AgentClient(coordinator.url)
    assert client.register().status_code == 200
    yield client
    client.close()


def enqueue(coordinator: CoordinatorProcess, raw: bytes) -> str:
    response = httpx.post(f"{coordinator.url}/tasks", content=raw)
    assert response.status_code == 201, response.text
    return str(response.json()["taskId"])


def claim_one(coordinator: CoordinatorProcess, agent: AgentClient) -> tuple[str, bytes]:
    """Enqueue a fresh offer and pull until this agent holds it (other tests' leftovers may come first)."""
    task_id = enqueue(coordinator, signed_offer())
    while True:
        task = agent.pull().json()["task"]
        assert task is not None, "the queue ran dry before our task came up"
        if task["taskId"] == task_id:
            return task_id, base64.b64decode(task["offer"])


# -- request signing ---------------------------------------------------------------------------------------------


def test_unsigned_request_is_refused(coordinator: CoordinatorProcess) -> None:
    refusal(httpx.post(f"{coordinator.url}/pull", json={"sandboxMode": "docker"}), 401, "unsigned")


def test_tampered_body_and_wrong_key_are_bad_signatures(agent: AgentClient) -> None:
    raw = b'{"sandboxMode": "docker"}'
    headers = signing.sign_request(agent.identity, "POST", "/pull", raw)
    tampered = agent.http.post("/pull", content=b'{"sandboxMode": "none"}', headers=headers)
    refusal(tampered, 401, "bad_signature")
    # Signed by one key, presented as another agent's request.
    other = NodeIdentity.generate().public_key.hex()
    refusal(agent.pull(headers={signing.AGENT: other}), 401, "bad_signature")
    # Signed for another path.
    moved = agent.http.post("/agents/heartbeat", content=raw, headers=headers)
    refusal(moved, 401, "bad_signature")


def test_replayed_nonce_is_refused(agent: AgentClient) -> None:
    nonce = b"\x01" * 16
    assert agent.pull(nonce=nonce).status_code == 200
    refusal(agent.pull(nonce=nonce), 401, "replayed_nonce")


def test_exact_replay_of_a_request_is_refused(agent: AgentClient) -> None:
    raw = b'{"sandboxMode": "docker"}'
    headers = signing.sign_request(agent.identity, "POST", "/agents/heartbeat", raw)
    assert agent.http.post("/agents/heartbeat", content=raw, headers=headers).status_code == 200
    refusal(agent.http.post("/agents/heartbeat", content=raw, headers=headers), 401, "replayed_nonce")


@pytest.mark.parametrize("offset_ms", [-(signing.MAX_SKEW_MS + 5_000), signing.MAX_SKEW_MS + 5_000])
def test_skewed_timestamp_is_refused(agent: AgentClient, offset_ms: int) -> None:
    refusal(agent.pull(timestamp_ms=signing.now_ms() + offset_ms), 401, "skewed")


def test_malformed_signature_headers_are_refused(agent: AgentClient) -> None:
    refusal(agent.pull(headers={signing.SIGNATURE: "zz"}), 400, "malformed")
    refusal(agent.pull(headers={signing.TIMESTAMP: "-5"}), 400, "malformed")


def test_oversized_requests_are_refused_before_anything_else(
    coordinator: CoordinatorProcess, agent: AgentClient
) -> None:
    refusal(agent.post("/agents/heartbeat", b" " * 5_000), 413, "too_large")
    refusal(agent.post(f"/tasks/{'ab' * 16}/result", b"\x00" * (600 * 1024)), 413, "too_large")
    refusal(httpx.post(f"{coordinator.url}/tasks", content=b"\x00" * (300 * 1024)), 413, "too_large")

    # A lying Content-Length is no way around the cap: the body is counted as it streams in.
    def chunks() -> Iterator[bytes]:
        for _ in range(10):
            yield b" " * 1024

    headers = signing.sign_request(agent.identity, "POST", "/agents/heartbeat", b"")
    refusal(agent.http.post("/agents/heartbeat", content=chunks(), headers=headers), 413, "too_large")


def test_unknown_agent_is_refused(coordinator: CoordinatorProcess) -> None:
    stranger = AgentClient(coordinator.url)
    refusal(stranger.pull(), 403, "unknown_agent")
    refusal(stranger.post("/agents/heartbeat", {"sandboxMode": "docker"}), 403, "unknown_agent")
    stranger.close()


def test_bad_json_and_bad_mode_are_malformed(agent: AgentClient) -> None:
    refusal(agent.post("/agents/heartbeat", b"not json"), 400, "malformed")
    refusal(agent.post("/agents/heartbeat", {"sandboxMode": "host"}), 400, "malformed")
    refusal(agent.post("/agents/heartbeat", {"sandboxMode": "docker", "extra": 1}), 400, "malformed")


# -- enqueueing ----------------------------------------------------------------------------------------------------


def test_enqueue_verifies_the_offer(coordinator: CoordinatorProcess) -> None:
    offerer = NodeIdentity.generate()
    raw = signed_offer(offerer)
    forged = bytearray(raw)
    forged[-1] ^= 1  # the last byte is inside the signature
    refusal(httpx.post(f"{coordinator.url}/tasks", content=bytes(forged)), 422, "bad_signature")
    refusal(httpx.post(f"{coordinator.url}/tasks", content=b"\x93\x01\x02"), 422, "malformed")
    stale = signed_offer(offerer, issued_at_ms=signing.now_ms() - 600_000, ttl_ms=60_000)
    refusal(httpx.post(f"{coordinator.url}/tasks", content=stale), 422, "expired")
    task_id = enqueue(coordinator, raw)
    refusal(httpx.post(f"{coordinator.url}/tasks", content=raw), 409, "duplicate_task")
    status = httpx.get(f"{coordinator.url}/tasks/{task_id}").json()
    assert status["state"] == "queued"


# -- results -------------------------------------------------------------------------------------------------------


def test_full_cycle_pull_then_post_result(coordinator: CoordinatorProcess, agent: AgentClient) -> None:
    task_id, offer_raw = claim_one(coordinator, agent)
    result = signed_result(offer_raw, agent.identity)
    answer = agent.post(f"/tasks/{task_id}/result", result)
    assert answer.status_code == 200, answer.text
    status = httpx.get(f"{coordinator.url}/tasks/{task_id}").json()
    assert status["state"] == "done"
    assert base64.b64decode(status["result"]) == result
    # A second post finds nothing left to complete.
    refusal(agent.post(f"/tasks/{task_id}/result", result), 409, "not_claimed")


def test_result_for_a_task_never_claimed_is_refused(coordinator: CoordinatorProcess, agent: AgentClient) -> None:
    offer = signed_offer()
    task_id = enqueue(coordinator, offer)
    refusal(agent.post(f"/tasks/{task_id}/result", signed_result(offer, agent.identity)), 409, "not_claimed")
    refusal(agent.post(f"/tasks/{'00' * 16}/result", signed_result(offer, agent.identity)), 404, "unknown_task")
    assert rows(coordinator.db, "SELECT state FROM tasks WHERE task_id = ?", task_id) == [("queued",)]


def test_result_for_a_task_claimed_by_another_agent_is_refused(
    coordinator: CoordinatorProcess, agent: AgentClient
) -> None:
    task_id, offer_raw = claim_one(coordinator, agent)
    other = AgentClient(coordinator.url)
    assert other.register().status_code == 200
    refusal(other.post(f"/tasks/{task_id}/result", signed_result(offer_raw, other.identity)), 409, "claimed_by_other")
    refusal(other.post(f"/tasks/{task_id}/release", {"reason": "busy"}), 409, "claimed_by_other")
    other.close()
    assert rows(coordinator.db, "SELECT state, claimed_by FROM tasks WHERE task_id = ?", task_id) == [
        ("claimed", agent.agent)
    ]


def test_forged_and_misdirected_results_are_refused(coordinator: CoordinatorProcess, agent: AgentClient) -> None:
    task_id, offer_raw = claim_one(coordinator, agent)
    forged = signed_result(offer_raw, agent.identity, signer=NodeIdentity.generate())
    refusal(agent.post(f"/tasks/{task_id}/result", forged), 422, "bad_signature")
    # Honestly signed, but by another executor than the claimant.
    stranger_result = signed_result(offer_raw, NodeIdentity.generate())
    refusal(agent.post(f"/tasks/{task_id}/result", stranger_result), 422, "wrong_executor")
    # A result for some other offer, posted against this task.
    refusal(
        agent.post(f"/tasks/{task_id}/result", signed_result(signed_offer(), agent.identity)), 422, "result_mismatch"
    )
    assert rows(coordinator.db, "SELECT state FROM tasks WHERE task_id = ?", task_id) == [("claimed",)]


# -- releases (the node refused the offer) -------------------------------------------------------------------------


def test_release_dispositions(coordinator: CoordinatorProcess, agent: AgentClient) -> None:
    task_id, _ = claim_one(coordinator, agent)
    assert (
        agent.post(f"/tasks/{task_id}/release", {"reason": "malformed", "detail": "x"}).json()["disposition"]
        == "failed"
    )
    assert rows(coordinator.db, "SELECT state, reason FROM tasks WHERE task_id = ?", task_id) == [
        ("failed", "malformed")
    ]

    task_id, _ = claim_one(coordinator, agent)
    answer = agent.post(f"/tasks/{task_id}/release", {"reason": "language_not_allowed"}).json()
    assert answer["disposition"] == "requeue_elsewhere"
    assert rows(coordinator.db, "SELECT state FROM tasks WHERE task_id = ?", task_id) == [("queued",)]
    # Never handed back to the agent that refused it; another agent gets it.
    pulled = []
    while (task := agent.pull().json()["task"]) is not None:
        pulled.append(task["taskId"])
    assert task_id not in pulled
    other = AgentClient(coordinator.url)
    other.register()
    assert other.pull().json()["task"]["taskId"] == task_id
    other.close()

    refusal(agent.post(f"/tasks/{task_id}/release", {"reason": "no_such_reason"}), 400, "malformed")


# -- the sandbox rule ----------------------------------------------------------------------------------------------


def test_pull_from_agent_without_sandbox_claims_nothing(coordinator: CoordinatorProcess) -> None:
    task_id = enqueue(coordinator, signed_offer())
    before = rows(coordinator.db, "SELECT task_id, state, claimed_by, claims, updated_at FROM tasks ORDER BY seq")
    unsandboxed = AgentClient(coordinator.url)
    assert unsandboxed.register("none").status_code == 200
    refusal(unsandboxed.pull(mode=None), 403, "sandbox_unavailable")  # as registered
    refusal(unsandboxed.pull(mode="none"), 403, "sandbox_unavailable")  # as reported with the pull
    after = rows(coordinator.db, "SELECT task_id, state, claimed_by, claims, updated_at FROM tasks ORDER BY seq")
    assert after == before  # not claimed-then-requeued: untouched, row for row
    assert rows(coordinator.db, "SELECT count(*) FROM tasks WHERE claimed_by = ?", unsandboxed.agent) == [(0,)]
    assert rows(coordinator.db, "SELECT state FROM tasks WHERE task_id = ?", task_id) == [("queued",)]
    assert rows(
        coordinator.db,
        "SELECT sandbox_mode, pull_requests, refused_pulls FROM agents WHERE agent = ?",
        unsandboxed.agent,
    ) == [("none", 2, 2)]
    unsandboxed.close()


def test_unknown_paths_get_typed_refusals(coordinator: CoordinatorProcess) -> None:
    refusal(httpx.get(f"{coordinator.url}/nope"), 404, "not_found")
    refusal(httpx.get(f"{coordinator.url}/tasks/not-hex"), 400, "malformed")
