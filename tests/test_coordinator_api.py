"""The coordinator's HTTP API against the real process on loopback: every refusal, and the task life cycle."""

from __future__ import annotations

import base64
import hashlib
import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from executor.contract import ExecResult
from tests.coordinator_support import AgentClient, CoordinatorProcess, read_task
from transports.wire import agent_requests as signing
from transports.wire.identity import NodeIdentity
from transports.wire.offers import TaskOffer
from transports.wire.results import TaskResult


def rows(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql, args).fetchall()


# The offerer of the tasks these tests enqueue (unless one says otherwise): the one key that may read them back.
OFFERER = NodeIdentity.generate()


def signed_offer(offerer: NodeIdentity | None = None, **kw: Any) -> bytes:
    offerer = offerer or OFFERER
    return TaskOffer.create(offerer, language="python", code="print(6 * 7)", **kw).sign(offerer)


def signed_result(offer_raw: bytes, executor: NodeIdentity, *, signer: NodeIdentity | None = None) -> bytes:
    from transports.wire.offers import parse_offer

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
    from transports.wire.codec import Domain, seal

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
    # The budgets for keys nobody knows get tests of their own; here every test brings fresh agents and offerers.
    budgets = ("--new-agent-rate", "1000", "--fresh-offer-rate", "1000")
    with CoordinatorProcess(db, "--rate", "1000", "--burst", "1000", *budgets) as proc:
        yield proc


@pytest.fixture
def agent(coordinator: CoordinatorProcess) -> Iterator[AgentClient]:
    with AgentClient(coordinator.url) as client:
        assert client.register().status_code == 200
        yield client


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
    # Deep nesting used to answer 500 and log a traceback (RecursionError); it is a typed refusal like any other.
    refusal(agent.post("/agents/heartbeat", b"[" * 1500 + b"]" * 1500), 400, "malformed")
    refusal(agent.post("/agents/heartbeat", b'{"sandboxMode": [[["docker"]]]}'), 400, "malformed")
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
    asks_host = signed_offer(offerer, sandbox="host")
    refusal(httpx.post(f"{coordinator.url}/tasks", content=asks_host), 422, "sandbox_required_for_remote_task")
    task_id = enqueue(coordinator, raw)
    refusal(httpx.post(f"{coordinator.url}/tasks", content=raw), 409, "duplicate_task")
    status = read_task(coordinator.url, task_id, offerer).json()
    assert status["state"] == "queued"


# -- results -------------------------------------------------------------------------------------------------------


def test_full_cycle_pull_then_post_result(coordinator: CoordinatorProcess, agent: AgentClient) -> None:
    task_id, offer_raw = claim_one(coordinator, agent)
    result = signed_result(offer_raw, agent.identity)
    answer = agent.post(f"/tasks/{task_id}/result", result)
    assert answer.status_code == 200, answer.text
    status = read_task(coordinator.url, task_id, OFFERER).json()
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


@pytest.mark.parametrize("blame", ["bad_signature", "malformed", "expired", "sandbox_required_for_remote_task"])
def test_an_agent_cannot_fail_a_good_task_by_blaming_the_offer(
    coordinator: CoordinatorProcess, agent: AgentClient, blame: str
) -> None:
    """The coordinator checks the offer again: a good offer is only kept from the agent that lied about it."""
    task_id, _ = claim_one(coordinator, agent)
    answer = agent.post(f"/tasks/{task_id}/release", {"reason": blame, "detail": "trust me"}).json()
    assert answer["disposition"] == "requeue_elsewhere"
    assert rows(coordinator.db, "SELECT state FROM tasks WHERE task_id = ?", task_id) == [("queued",)]
    other = AgentClient(coordinator.url)
    other.register()
    while (task := other.pull().json()["task"]) is not None and task["taskId"] != task_id:
        pass
    assert task is not None  # another agent still gets it
    other.close()


def test_a_release_that_blames_a_really_bad_offer_fails_the_task(tmp_path: Path) -> None:
    with CoordinatorProcess(tmp_path / "state.db", "--offer-skew", "0") as coordinator:
        agent = AgentClient(coordinator.url)
        agent.register()
        raw = signed_offer(ttl_ms=1500)
        task_id = enqueue(coordinator, raw)
        assert agent.pull().json()["task"]["taskId"] == task_id
        from transports.wire.offers import parse_offer

        expires = parse_offer(raw).offer.expires_at_ms
        wait_until(lambda: signing.now_ms() > expires + 50, what="the offer to expire")
        answer = agent.post(f"/tasks/{task_id}/release", {"reason": "expired"}).json()
        assert answer["disposition"] == "failed"
        ((state, reason, detail),) = rows(coordinator.db, "SELECT state, reason, detail FROM tasks")
        assert (state, reason) == ("failed", "expired") and detail.startswith("confirmed by the coordinator")
        agent.close()


def test_tables_are_capped_and_the_refusal_says_when_to_retry(tmp_path: Path) -> None:
    options = ("--max-queued-per-offerer", "2", "--max-queued", "3", "--max-agents", "2", "--fresh-share", "1")
    with CoordinatorProcess(tmp_path / "state.db", *options) as coordinator:
        offerer = NodeIdentity.generate()
        for _ in range(2):
            enqueue(coordinator, signed_offer(offerer))
        response = httpx.post(f"{coordinator.url}/tasks", content=signed_offer(offerer))
        refusal(response, 503, "busy")
        assert response.headers["retry-after"] == "5"
        enqueue(coordinator, signed_offer())  # another offerer still gets in, up to the total
        refusal(httpx.post(f"{coordinator.url}/tasks", content=signed_offer()), 503, "busy")
        agents = [AgentClient(coordinator.url) for _ in range(3)]
        assert [a.register().status_code for a in agents] == [200, 200, 503]
        assert agents[0].register().status_code == 200  # a known agent may always register again
        for a in agents:
            a.close()


def test_stats_are_aggregate_counts_that_name_nobody(coordinator: CoordinatorProcess, agent: AgentClient) -> None:
    stats = httpx.get(f"{coordinator.url}/stats").json()
    assert set(stats) == {"tasks", "agents"}
    assert set(stats["agents"]) == {"bySandboxMode", "pullRequests", "refusedPulls"}
    assert stats["agents"]["bySandboxMode"]["docker"] >= 1
    assert agent.agent not in json.dumps(stats)


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


def test_retention_deletes_finished_tasks_and_silent_agents_but_never_an_unexpired_offer(tmp_path: Path) -> None:
    from mesh.coordinator.store import Store

    store = Store(tmp_path / "state.db")
    now = 10_000_000
    for n, (state, expires_at) in enumerate([("done", now - 100_000), ("failed", now + 100_000), ("queued", 0)]):
        store.enqueue(f"{n:032x}", b"offer", b"d" * 32, "aa", expires_at, expires_at, now - 200_000)
        if state != "queued":
            store._db.execute("UPDATE tasks SET state = ?, updated_at = ? WHERE seq = ?", (state, now - 200_000, n + 1))
    store.register("silent", "docker", now - 10**9)
    store.register("recent", "docker", now)
    deleted = store.purge(now, retention_ms=100_000, agent_retention_ms=1_000_000, skew_ms=30_000)
    assert deleted == 1  # the done task whose offer expired long ago; not the failed one whose offer is still valid
    remaining = {r[0] for r in store._db.execute("SELECT state FROM tasks")}
    assert remaining == {"failed", "queued"}
    assert {r[0] for r in store._db.execute("SELECT agent FROM agents")} == {"recent"}
    store.close()


def test_a_state_file_of_the_previous_schema_is_migrated(tmp_path: Path) -> None:
    from mesh.coordinator.store import Store

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE tasks (seq INTEGER PRIMARY KEY AUTOINCREMENT, task_id TEXT NOT NULL UNIQUE, offer BLOB NOT "
            "NULL, offer_digest BLOB NOT NULL, offerer TEXT NOT NULL, expires_at INTEGER NOT NULL, deadline INTEGER "
            "NOT NULL, state TEXT NOT NULL, claimed_by TEXT, claimed_at INTEGER, claims INTEGER NOT NULL DEFAULT 0, "
            "lapses INTEGER NOT NULL DEFAULT 0, result BLOB, reason TEXT, detail TEXT, enqueued_at INTEGER NOT NULL, "
            "updated_at INTEGER NOT NULL)"
        )
        conn.execute("CREATE INDEX tasks_by_state ON tasks (state, seq)")
        conn.execute(
            "INSERT INTO tasks (task_id, offer, offer_digest, offerer, expires_at, deadline, state, enqueued_at, "
            "updated_at) VALUES ('ab', x'00', x'00', 'o', 1, 1, 'queued', 77, 77)"
        )
    store = Store(path)
    assert store._db.execute("SELECT ready_at FROM tasks").fetchone() == (77,)
    store.close()


# -- fresh keys: signed reads, shares, turns, budgets (issue 11) ----------------------------------------------------


def test_a_task_is_read_only_by_its_offerer(coordinator: CoordinatorProcess) -> None:
    offerer = NodeIdentity.generate()
    task_id = enqueue(coordinator, signed_offer(offerer))
    assert read_task(coordinator.url, task_id, offerer).json()["state"] == "queued"
    refusal(read_task(coordinator.url, task_id, NodeIdentity.generate()), 404, "unknown_task")  # as if there were none
    refusal(httpx.get(f"{coordinator.url}/tasks/{task_id}"), 401, "unsigned")
    forged = read_task(
        coordinator.url, task_id, NodeIdentity.generate(), headers={"x-edgecoder-agent": offerer.public_key.hex()}
    )
    refusal(forged, 401, "bad_signature")


def test_fresh_offerers_hold_their_share_and_trusted_ones_still_get_in(tmp_path: Path) -> None:
    trusted = NodeIdentity.generate()
    options = ("--max-queued", "4", "--fresh-share", "0.5", "--trusted-offerer", trusted.peer_id)
    with CoordinatorProcess(tmp_path / "state.db", *options) as coordinator:
        for _ in range(2):
            enqueue(coordinator, signed_offer(NodeIdentity.generate()))
        response = httpx.post(f"{coordinator.url}/tasks", content=signed_offer(NodeIdentity.generate()))
        refusal(response, 503, "busy")
        assert "not served" in response.json()["detail"] and response.headers["retry-after"] == "5"
        enqueue(coordinator, signed_offer(trusted))
        enqueue(coordinator, signed_offer(trusted))


def test_pull_serves_established_offerers_first_then_offerers_in_turn(tmp_path: Path) -> None:
    trusted = NodeIdentity.generate()
    flooder, other = NodeIdentity.generate(), NodeIdentity.generate()
    options = ("--trusted-offerer", trusted.peer_id, "--rate", "1000", "--burst", "1000")
    with CoordinatorProcess(tmp_path / "state.db", *options) as coordinator:
        order = {enqueue(coordinator, signed_offer(flooder)): "flooder" for _ in range(3)}
        order[enqueue(coordinator, signed_offer(other))] = "other"
        order[enqueue(coordinator, signed_offer(trusted))] = "trusted"  # enqueued last, claimed first
        agent = AgentClient(coordinator.url)
        assert agent.register().status_code == 200
        pulled = [order[agent.pull().json()["task"]["taskId"]] for _ in range(5)]
        assert pulled == ["trusted", "flooder", "other", "flooder", "flooder"]
        assert agent.pull().json()["task"] is None
        agent.close()


def test_an_offerer_served_over_its_tenure_is_established(tmp_path: Path) -> None:
    options = ("--established-after", "0", "--max-queued", "2", "--fresh-share", "0.5", "--rate", "1000")
    with CoordinatorProcess(tmp_path / "state.db", *options, "--burst", "1000") as coordinator:
        regular = NodeIdentity.generate()
        agent = AgentClient(coordinator.url)
        assert agent.register().status_code == 200
        raw = signed_offer(regular)
        task_id = enqueue(coordinator, raw)
        assert agent.pull().json()["task"]["taskId"] == task_id
        assert agent.post(f"/tasks/{task_id}/result", signed_result(raw, agent.identity)).status_code == 200
        # Done: its offer is dropped (the digest and the result stay), and its offerer is established.
        assert rows(coordinator.db, "SELECT length(offer), length(result) > 0 FROM tasks") == [(0, 1)]
        enqueue(coordinator, signed_offer(NodeIdentity.generate()))  # the one fresh place
        refusal(httpx.post(f"{coordinator.url}/tasks", content=signed_offer(NodeIdentity.generate())), 503, "busy")
        enqueue(coordinator, signed_offer(regular))  # established: not in the fresh share
        agent.close()


def test_new_agents_and_fresh_offers_draw_on_budgets_for_all(tmp_path: Path) -> None:
    options = ("--new-agent-rate", "0.1", "--fresh-offer-rate", "0.2")
    with CoordinatorProcess(tmp_path / "state.db", *options) as coordinator:
        first, second = AgentClient(coordinator.url), AgentClient(coordinator.url)
        assert first.register().status_code == 200  # the burst: one
        busy = second.register()
        refusal(busy, 503, "busy")
        assert busy.headers["retry-after"] == "10"
        assert first.register().status_code == 200  # a known agent is not new
        enqueue(coordinator, signed_offer(NodeIdentity.generate()))
        refused = httpx.post(f"{coordinator.url}/tasks", content=signed_offer(NodeIdentity.generate()))
        refusal(refused, 503, "busy")
        assert refused.headers["retry-after"] == "1"
        first.close()
        second.close()


def test_queued_offers_are_capped_in_bytes(tmp_path: Path) -> None:
    with CoordinatorProcess(tmp_path / "state.db", "--max-queued-mib", "1", "--rate", "1000", "--burst", "1000") as c:
        big = [signed_offer(input="x" * (250 * 1024)) for _ in range(5)]
        for raw in big[:4]:
            enqueue(c, raw)
        response = httpx.post(f"{c.url}/tasks", content=big[4])
        refusal(response, 503, "busy")
        assert "bytes" in response.json()["detail"]
        enqueue(c, signed_offer())  # a small one still fits


async def _hold_upload(url: str, path: str, length: int) -> trio.SocketStream:
    """A request that declares `length` bytes of body and sends only its headers: it holds that much of the
    coordinator's body budget until the socket closes."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    head = f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-length: {length}\r\n\r\n"
    await stream.send_all(head.encode() + b"\x00")
    return stream


async def _busy_when_held(url: str) -> bool:
    async with httpx.AsyncClient() as client:
        answer = await client.post(f"{url}/tasks", content=signed_offer())
    return answer.status_code == 503 and answer.json()["reason"] == "busy"


def test_request_bodies_in_memory_are_bounded_and_come_back(tmp_path: Path) -> None:
    with CoordinatorProcess(tmp_path / "state.db", "--max-body-mib", "1") as coordinator:

        async def main() -> None:
            held = [await _hold_upload(coordinator.url, "/tasks", 256 * 1024) for _ in range(4)]
            with trio.fail_after(10):
                while not await _busy_when_held(coordinator.url):
                    await trio.sleep(0.05)
            answer = httpx.post(f"{coordinator.url}/tasks", content=signed_offer())
            assert answer.headers["retry-after"] == "1" and "bodies" in answer.json()["detail"]
            for stream in held:
                await stream.aclose()
            with trio.fail_after(10):
                while await _busy_when_held(coordinator.url):
                    await trio.sleep(0.05)

        trio.run(main)
        enqueue(coordinator, signed_offer())
    assert "internal_error" not in coordinator.log_path.read_text()
