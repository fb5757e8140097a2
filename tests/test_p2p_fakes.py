"""Shared fakes and helpers for the p2p transport tests (no tests of its own).

Plain pytest: each test calls `run_trio`, which runs one coroutine under `trio.run` with an overall deadline, so a
hang fails the test instead of the suite.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from transports.base import Admitted, Delivery, Verdict
from transports.wire.reasons import Rejection

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


def test_fakes_are_importable() -> None:
    # Keeps pytest from reporting this module as collected-but-empty; the fakes are exercised by the other suites.
    sink: Any = RecordingSink()
    assert sink.participating
