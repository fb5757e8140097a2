"""The node's pull worker (`transports.coordinator`) against the real coordinator process, under trio."""

from __future__ import annotations

import base64
import gc
import hashlib
import sqlite3
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from executor.contract import ExecResult
from mesh.intake import Intake, IntakePolicy
from tests.coordinator_support import CoordinatorProcess, read_task
from transports.base import Admitted, Delivery, Verdict
from transports.coordinator import CoordinatorPullTransport
from transports.wire.identity import NodeIdentity
from transports.wire.offers import TaskOffer, parse_offer
from transports.wire.reasons import Reason, Rejection
from transports.wire.results import TaskResult

FAST: dict[str, Any] = {"poll_interval": 0.05, "heartbeat_interval": 0.1}


class RecordingSink:
    """Records each delivery; admits it, or answers with `verdict` (say, a Rejection)."""

    def __init__(self, verdict: Callable[[Delivery], Verdict] | None = None, *, participating: bool = True) -> None:
        self.deliveries: list[Delivery] = []
        self.participating = participating
        self._verdict = verdict

    async def deliver(self, delivery: Delivery) -> Verdict:
        self.deliveries.append(delivery)
        if self._verdict is not None:
            return self._verdict(delivery)
        return Admitted(parse_offer(delivery.raw).offer.offer_id)

    def delivery_of(self, task_id: str) -> Delivery | None:
        return next((d for d in self.deliveries if parse_offer(d.raw).offer.offer_id.hex() == task_id), None)


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordinatorProcess]:
    db = tmp_path_factory.mktemp("coordinator") / "state.db"
    with CoordinatorProcess(db, "--rate", "1000", "--burst", "1000") as proc:
        yield proc


def one(db: Path, sql: str, *args: Any) -> Any:
    with sqlite3.connect(db) as conn:
        row = conn.execute(sql, args).fetchone()
    return None if row is None else row[0] if len(row) == 1 else row


OFFERER = NodeIdentity.generate()  # the key that may read these tests' tasks back


def enqueue(coordinator: CoordinatorProcess) -> tuple[str, bytes]:
    raw = TaskOffer.create(OFFERER, language="python", code="print(6 * 7)").sign(OFFERER)
    response = httpx.post(f"{coordinator.url}/tasks", content=raw)
    assert response.status_code == 201, response.text
    return str(response.json()["taskId"]), raw


def signed_result(offer_raw: bytes, executor: NodeIdentity) -> bytes:
    return TaskResult(
        offer_id=parse_offer(offer_raw).offer.offer_id,
        offer_digest=hashlib.sha256(offer_raw).digest(),
        executor=executor.public_key,
        result=ExecResult(ok=True, stdout="42\n", exit_code=0, duration_ms=3),
    ).sign(executor)


async def eventually(condition: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    with trio.fail_after(timeout):
        while not (value := condition()):
            await trio.sleep(0.02)
    return value


async def heartbeats_seen(db: Path, agent: str, count: int) -> None:
    """Wait until the coordinator has recorded `count` more signs of life from this agent."""
    for _ in range(count):
        before = one(db, "SELECT last_seen FROM agents WHERE agent = ?", agent)

        def beat_after(b: int = before) -> bool:
            return bool(one(db, "SELECT last_seen FROM agents WHERE agent = ?", agent) > b)

        await eventually(beat_after, "heartbeat")


def run_with_worker(
    coordinator: CoordinatorProcess,
    sink: Any,
    body: Callable[[CoordinatorPullTransport], Awaitable[None]],
    **options: Any,
) -> CoordinatorPullTransport:
    transport = CoordinatorPullTransport(coordinator.url, NodeIdentity.generate(), **{**FAST, **options})

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(transport.run, sink)
            with trio.fail_after(10):
                await transport.registered.wait()
            await body(transport)
            nursery.cancel_scope.cancel()  # and run() must stop cleanly on cancellation

    trio.run(main)
    return transport


def test_pulled_task_is_delivered_and_its_result_posted(coordinator: CoordinatorProcess) -> None:
    task_id, offer_raw = enqueue(coordinator)
    sink = RecordingSink()

    async def body(transport: CoordinatorPullTransport) -> None:
        delivery = await eventually(lambda: sink.delivery_of(task_id), "the delivery")
        assert delivery.raw == offer_raw
        assert delivery.transport == "coordinator"
        assert delivery.sender == coordinator.url
        assert await delivery.claim() is True
        assert (
            one(coordinator.db, "SELECT claimed_by FROM tasks WHERE task_id = ?", task_id)
            == transport.identity.public_key.hex()
        )
        await delivery.reply(signed_result(offer_raw, transport.identity))
        assert transport.results_posted >= 1

    run_with_worker(coordinator, sink, body)
    status = read_task(coordinator.url, task_id, OFFERER).json()
    assert status["state"] == "done"
    assert parse_offer(offer_raw).offer.offer_id.hex() == task_id
    assert base64.b64decode(status["result"])


def test_worker_without_sandbox_registers_and_heartbeats_but_never_pulls(coordinator: CoordinatorProcess) -> None:
    task_id, _ = enqueue(coordinator)
    sink = RecordingSink(participating=False)  # the gate says this node cannot sandbox

    async def body(transport: CoordinatorPullTransport) -> None:
        agent = transport.identity.public_key.hex()
        await heartbeats_seen(coordinator.db, agent, 3)  # dozens of poll intervals
        assert one(coordinator.db, "SELECT sandbox_mode, pull_requests FROM agents WHERE agent = ?", agent) == (
            "none",
            0,
        )
        assert transport.pull_requests == 0

    run_with_worker(coordinator, sink, body)
    assert sink.deliveries == []
    assert one(coordinator.db, "SELECT state FROM tasks WHERE task_id = ?", task_id) in ("queued", "claimed")


def test_worker_pulls_only_while_the_sink_participates(coordinator: CoordinatorProcess) -> None:
    sink = RecordingSink(participating=False)

    async def body(transport: CoordinatorPullTransport) -> None:
        agent = transport.identity.public_key.hex()
        pulls = lambda: one(coordinator.db, "SELECT pull_requests FROM agents WHERE agent = ?", agent)  # noqa: E731
        await heartbeats_seen(coordinator.db, agent, 3)
        assert pulls() == 0 and transport.pull_requests == 0

        sink.participating = True  # the gate admits the node: pulling starts
        task_id, _ = enqueue(coordinator)
        await eventually(lambda: sink.delivery_of(task_id), "a delivery once participating")

        sink.participating = False  # Docker went away, the gate withdraws: pulling stops, and the heartbeat says so
        await eventually(lambda: pulls() == transport.pull_requests, "in-flight pulls to land")
        stopped_at = pulls()
        await heartbeats_seen(coordinator.db, agent, 3)
        assert pulls() == stopped_at == transport.pull_requests
        assert one(coordinator.db, "SELECT sandbox_mode FROM agents WHERE agent = ?", agent) == "none"

    run_with_worker(coordinator, sink, body)


@pytest.mark.parametrize(
    ("reason", "state"),
    # The coordinator checks the offer itself before it fails a task that an agent blames on the offer: this offer is
    # good (it asks for docker), so it is only kept from that agent.
    [(Reason.SANDBOX_REQUIRED, "queued"), (Reason.BUSY, "queued"), (Reason.OFFERER_DENIED, "queued")],
)
def test_sink_rejection_is_reported_back(coordinator: CoordinatorProcess, reason: Reason, state: str) -> None:
    task_id, _ = enqueue(coordinator)
    sink = RecordingSink(lambda d: Rejection(reason, "said the sink"))

    async def body(transport: CoordinatorPullTransport) -> None:
        await eventually(lambda: sink.delivery_of(task_id), "the delivery")
        await eventually(
            lambda: one(coordinator.db, "SELECT reason FROM tasks WHERE task_id = ?", task_id) == str(reason),
            "the release to land",
        )

    run_with_worker(coordinator, sink, body)
    # A requeued task may already be claimed again by another test's worker; a failed one stays failed.
    found = one(coordinator.db, "SELECT state, detail FROM tasks WHERE task_id = ?", task_id)
    assert found[1] == "said the sink"
    assert found[0] == state or (state == "queued" and found[0] == "claimed")


def test_real_intake_admits_a_pulled_offer(coordinator: CoordinatorProcess) -> None:
    task_id, offer_raw = enqueue(coordinator)
    intake = Intake(IntakePolicy(), participating=lambda: True)

    async def body(transport: CoordinatorPullTransport) -> None:
        # The node's worker would take jobs from here, run them in Docker and reply; we reply by hand.
        with trio.fail_after(10):
            while True:
                job = await intake.jobs.receive()
                if job.received.offer.offer_id.hex() == task_id:
                    break
                intake.finished(job)  # another test's task: a worker done with it takes the next
        assert job.origin == "remote"
        assert job.received.raw == offer_raw
        assert job.delivery.transport == "coordinator"
        await job.delivery.reply(signed_result(job.received.raw, transport.identity))

    run_with_worker(coordinator, intake, body)
    assert read_task(coordinator.url, task_id, OFFERER).json()["state"] == "done"
    assert intake.admitted["coordinator"] >= 1


def test_worker_keeps_retrying_an_unreachable_coordinator_and_cancels_cleanly() -> None:
    # Port 1 on loopback: nothing listens there, so every connection is refused at once.
    transport = CoordinatorPullTransport("http://127.0.0.1:1", NodeIdentity.generate(), **FAST)

    async def main() -> None:
        with trio.move_on_after(0.5):
            await transport.run(RecordingSink())

    trio.run(main)
    assert not transport.registered.is_set()


def test_pinned_coordinator_key(tmp_path: Path) -> None:
    key = tmp_path / "coordinator.key"
    coordinator_identity = NodeIdentity.generate()
    coordinator_identity.save(key)
    with CoordinatorProcess(tmp_path / "state.db", "--key", str(key)) as coordinator:
        assert coordinator.ready["publicKey"] == coordinator_identity.public_key.hex()
        impostor_pinned = RecordingSink()
        task_id, _ = enqueue(coordinator)

        async def refuses(transport: CoordinatorPullTransport) -> None:
            await eventually(lambda: transport.pull_requests >= 3, "a few pulls")

        # Pinned to another key: the coordinator's answers do not verify, so nothing is delivered.
        run_with_worker(coordinator, impostor_pinned, refuses, coordinator_key=NodeIdentity.generate().public_key)
        assert impostor_pinned.deliveries == []

        task_id, _ = enqueue(coordinator)
        pinned = RecordingSink()

        async def delivers(transport: CoordinatorPullTransport) -> None:
            await eventually(lambda: pinned.delivery_of(task_id), "the delivery")

        run_with_worker(coordinator, pinned, delivers, coordinator_key=coordinator_identity.public_key)


def test_a_request_cancelled_while_its_body_is_sent_leaves_nothing_unfinalised() -> None:
    """The node stopping mid-request (a big result being posted, say) cancels httpcore while it sends the body. The
    body's iterator must not be an async generator left suspended at its `yield`: trio would report it as garbage
    collected before it was exhausted, as test_pinned_coordinator_key once did. pytest turns that report into an
    error (pyproject.toml's filterwarnings), so this test fails if it happens."""

    async def main() -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        transport = CoordinatorPullTransport(f"http://127.0.0.1:{port}", NodeIdentity.generate(), **FAST)
        async with trio.open_nursery() as nursery, httpx.AsyncClient(base_url=transport.url) as client:
            nursery.start_soon(trio.serve_listeners, never_read, listeners)
            transport._client = client
            with trio.move_on_after(1.0) as sending:
                # Far more than the socket buffers hold: the send blocks until it is cancelled.
                await transport._send("POST", "/tasks/x/result", b"\0" * (32 << 20), "application/octet-stream")
            assert sending.cancelled_caught
            nursery.cancel_scope.cancel()
        gc.collect()
        await trio.sleep(0.05)  # trio finalises what the collector found on one of its next ticks

    async def never_read(stream: trio.SocketStream) -> None:
        async with stream:
            await trio.sleep_forever()

    trio.run(main)
    gc.collect()
