"""Shared fakes and helpers for the p2p transport tests, and the tests that they behave as those tests assume.

Plain pytest: each test calls `run_trio`, which runs one coroutine under `trio.run` with an overall deadline, so a
hang fails the test instead of the suite.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from transports.base import Admitted, Delivery, Verdict
from transports.wire.reasons import Reason, Rejection

LOOPBACK = "/ip4/127.0.0.1/tcp/0"


def run_trio(fn: Callable[[], Awaitable[None]], *, deadline: float = 60.0) -> None:
    async def bounded() -> None:
        with trio.fail_after(deadline):
            await fn()

    trio.run(bounded)


async def wait_until(predicate: Callable[[], bool], *, timeout: float = 30.0, what: str = "condition") -> None:
    """Poll instead of sleeping a fixed time: returns as soon as `predicate` holds. The timeout only turns a hang
    into a failure; it is generous so that a loaded machine never fails a test that would have passed."""
    with trio.move_on_after(timeout):
        while not predicate():
            await trio.sleep(0.01)
        return
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class RecordingSink:
    """An `OfferSink` that records deliveries. With `reply_with` set, it replies from a task of `nursery`."""

    def __init__(self, *, participating: bool = True, rejection: Rejection | None = None) -> None:
        self.participating = participating
        self.rejection = rejection
        self.deliveries: list[Delivery] = []
        self.delivered_at: list[float] = []  # time.perf_counter() of each delivery, for latency figures
        self.reply_with: bytes | None = None
        self.reply_delay = 0.0
        self.nursery: trio.Nursery | None = None

    async def deliver(self, delivery: Delivery) -> Verdict:
        self.deliveries.append(delivery)
        self.delivered_at.append(time.perf_counter())
        if self.rejection is not None:
            return self.rejection
        if self.reply_with is not None and self.nursery is not None:
            self.nursery.start_soon(self._reply_later, delivery, self.reply_with)
        return Admitted(offer_id=b"\x00" * 16)

    async def _reply_later(self, delivery: Delivery, result: bytes) -> None:
        await trio.sleep(self.reply_delay)
        await delivery.reply(result)

    def raws(self) -> list[bytes]:
        return [d.raw for d in self.deliveries]


class FakeDesk:
    """An `OfferDesk` that records its calls and answers with `claim_answer` / `result_answer`."""

    def __init__(self) -> None:
        self.claims: list[tuple[bytes, str]] = []
        self.statuses: list[dict[str, Any] | None] = []
        self.results: list[tuple[bytes, str]] = []
        self.claim_answer: Rejection | None = None
        self.result_answer: Rejection | None = None

    async def grant_claim(
        self, offer_id: bytes, claimant: str, status: dict[str, Any] | None = None
    ) -> Rejection | None:
        self.claims.append((offer_id, claimant))
        self.statuses.append(status)
        return self.claim_answer

    async def accept_result(self, raw: bytes, sender: str) -> Rejection | None:
        self.results.append((raw, sender))
        return self.result_answer


# -- the fakes do what the transport tests rely on ----------------------------------------------------------------


def test_the_recording_sink_admits_records_and_replies_from_its_nursery() -> None:
    replies: list[bytes] = []

    async def reply(raw: bytes) -> None:
        replies.append(raw)

    async def main() -> None:
        sink = RecordingSink()
        async with trio.open_nursery() as nursery:
            sink.nursery, sink.reply_with = nursery, b"result"
            verdict = await sink.deliver(Delivery(raw=b"offer", transport="direct", sender="peer", reply=reply))
            assert verdict == Admitted(offer_id=b"\x00" * 16)
            assert replies == []  # the reply comes from a task of the nursery, after the verdict
        assert replies == [b"result"]
        assert sink.raws() == [b"offer"] and len(sink.delivered_at) == 1

    run_trio(main)


def test_the_recording_sink_answers_with_its_rejection_and_never_replies() -> None:
    replies: list[bytes] = []

    async def reply(raw: bytes) -> None:
        replies.append(raw)

    async def main() -> None:
        busy = Rejection(Reason.BUSY, "full")
        sink = RecordingSink(rejection=busy, participating=False)
        async with trio.open_nursery() as nursery:
            sink.nursery, sink.reply_with = nursery, b"result"
            assert await sink.deliver(Delivery(raw=b"x", transport="gossip", sender=None, reply=reply)) is busy
        assert replies == [] and sink.raws() == [b"x"] and sink.participating is False

    run_trio(main)


def test_the_fake_desk_records_each_call_and_gives_its_set_answers() -> None:
    async def main() -> None:
        desk = FakeDesk()
        assert await desk.grant_claim(b"\x01" * 16, "claimant", {"freeSlots": 1}) is None
        desk.claim_answer = desk.result_answer = Rejection(Reason.NOT_INVITED, "no")
        assert await desk.grant_claim(b"\x02" * 16, "other") is desk.claim_answer
        assert await desk.accept_result(b"result", "runner") is desk.result_answer
        assert desk.claims == [(b"\x01" * 16, "claimant"), (b"\x02" * 16, "other")]
        assert desk.statuses == [{"freeSlots": 1}, None]
        assert desk.results == [(b"result", "runner")]

    run_trio(main)


def test_run_trio_turns_a_hang_into_a_failure_and_wait_until_says_what_it_waited_for() -> None:
    with pytest.raises(trio.TooSlowError):
        run_trio(trio.sleep_forever, deadline=0.01)

    async def never() -> None:
        await wait_until(lambda: False, timeout=0.01, what="a condition that never holds")

    with pytest.raises(AssertionError, match="waiting for a condition that never holds"):
        run_trio(never)
