"""The node's coordinator client against a hostile or overloaded coordinator: no answer crashes it, and a result is
retried through 429 and 5xx as `Retry-After` advises, but not through a refusal that will not change."""

from __future__ import annotations

import base64
import itertools
import json
from typing import Any

import pytest
import trio

from tests.hostile_http import Answer, HostileHTTP
from transports.base import Admitted, Delivery, Verdict
from transports.coordinator import CoordinatorPullTransport
from transports.wire.identity import NodeIdentity
from transports.wire.offers import TaskOffer, parse_offer

DEEP = b"[" * 100_000 + b"]" * 100_000
JSON_HEADERS = [("content-type", "application/json")]


class ReplyingSink:
    """Admits every delivery and answers it at once with fixed bytes (the transport only carries them)."""

    participating = True

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.deliveries: list[Delivery] = []

    async def deliver(self, delivery: Delivery) -> Verdict:
        self.deliveries.append(delivery)
        self.nursery.start_soon(delivery.reply, b"signed result bytes")
        return Admitted(parse_offer(delivery.raw).offer.offer_id)


def ok(body: dict[str, Any]) -> Answer:
    return 200, JSON_HEADERS, json.dumps(body).encode()


def refused(status: int, reason: str, retry_after: str | None = None) -> Answer:
    headers = [*JSON_HEADERS, *([("retry-after", retry_after)] if retry_after else [])]
    return status, headers, json.dumps({"reason": reason, "detail": "scripted"}).encode()


def one_task_then_none(task_id: str, offer: bytes) -> Any:
    handed: list[int] = []

    def pull() -> Answer:
        if handed:
            return ok({"task": None})
        handed.append(1)
        return ok({"task": {"taskId": task_id, "offer": base64.b64encode(offer).decode()}})

    return pull


def fresh_offer() -> tuple[str, bytes]:
    offerer = NodeIdentity.generate()
    raw = TaskOffer.create(offerer, language="python", code="print(1)").sign(offerer)
    return parse_offer(raw).offer.offer_id.hex(), raw


async def run_against(
    server: HostileHTTP, until: Any, *, timeout: float = 20.0
) -> tuple[CoordinatorPullTransport, Any]:
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        sink = ReplyingSink(nursery)
        transport = CoordinatorPullTransport(server.url, NodeIdentity.generate(), poll_interval=0.05, max_backoff=2.0)
        await nursery.start(transport.run, sink)  # an exception here would fail the test: the nursery re-raises it
        with trio.fail_after(timeout):
            while not until(server, transport):
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    return transport, sink


def test_deeply_nested_json_in_every_answer_never_crashes_the_client() -> None:
    server = HostileHTTP(lambda method, path, body: (200, JSON_HEADERS, DEEP))

    async def main() -> None:
        transport, sink = await run_against(server, lambda s, _: len(s.requests) >= 4)
        assert not transport.registered.is_set() and not sink.deliveries

    trio.run(main)


def test_a_pull_answer_of_the_wrong_shape_is_survived() -> None:
    shapes = iter([{"task": [1, 2]}, {"task": {"taskId": {"x": 1}, "offer": 5}}, {"task": "x"}, [], 7])

    def script(method: str, path: str, body: bytes) -> Answer:
        if path == "/pull":
            return ok(next(shapes, {"task": None}))  # type: ignore[arg-type]
        return ok({"heartbeatMs": 60_000})

    server = HostileHTTP(script)

    async def main() -> None:
        _, sink = await run_against(server, lambda s, _: len(s.paths("/pull")) >= 6)
        assert not sink.deliveries

    trio.run(main)


@pytest.mark.parametrize("status", [429, 503])
def test_a_result_is_retried_through_429_and_503_as_retry_after_advises(status: int) -> None:
    """A 429 is the coordinator's rate limit, a 503 its overload: both say "later". Were either dropped from the
    retryable statuses, the result would be posted once and lost: `results_posted` never reaches 1 and the wait times
    out (checked: 429 taken out of RETRYABLE_STATUSES fails the [429] case with TooSlowError)."""
    task_id, offer = fresh_offer()
    pull = one_task_then_none(task_id, offer)
    result_posts = []

    def script(method: str, path: str, body: bytes) -> Answer:
        if path == "/pull":
            return pull()
        if path.endswith("/result"):
            result_posts.append(1)
            return refused(status, "busy", "1") if len(result_posts) <= 2 else ok({"state": "done"})
        return ok({"heartbeatMs": 60_000})

    server = HostileHTTP(script)

    async def main() -> None:
        # Until the client counted the result posted (the server having had three posts is not that yet).
        transport, _ = await run_against(server, lambda _, t: t.results_posted >= 1)
        posts = [r for r in server.requests if r.path.endswith("/result")]
        assert len(posts) == 3 and all(p.body == b"signed result bytes" for p in posts)
        assert all(b.at - a.at >= 1.0 for a, b in itertools.pairwise(posts))  # Retry-After: 1 held
        assert transport.results_posted == 1 and transport.deferred["result"] == 2

    trio.run(main)


def test_a_refusal_that_will_not_change_is_not_retried() -> None:
    task_id, offer = fresh_offer()
    pull = one_task_then_none(task_id, offer)

    def script(method: str, path: str, body: bytes) -> Answer:
        if path == "/pull":
            return pull()
        if path.endswith("/result"):
            return refused(409, "not_claimed")
        return ok({"heartbeatMs": 60_000})

    server = HostileHTTP(script)

    async def main() -> None:
        transport, _ = await run_against(server, lambda s, _: len(s.paths("/pull")) >= 20)
        assert len(server.paths(f"/tasks/{task_id}/result")) == 1 and transport.results_posted == 0

    trio.run(main)


def test_a_coordinator_cannot_make_the_client_flood_it_with_heartbeats() -> None:
    server = HostileHTTP(lambda method, path, body: ok({"heartbeatMs": 1, "task": None}))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            transport = CoordinatorPullTransport(server.url, NodeIdentity.generate(), poll_interval=0.5)
            await nursery.start(transport.run, ReplyingSink(nursery))
            await transport.registered.wait()
            await trio.sleep(1.0)
            nursery.cancel_scope.cancel()
        # Clamped to one every 50 ms at most: about 20 a second, not the 1,000 a 1 ms interval would be.
        assert len(server.paths("/agents/heartbeat")) <= 25

    trio.run(main)
