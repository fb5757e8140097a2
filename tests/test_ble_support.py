"""Shared fixtures for the BLE tests (no tests here): identities, signed offers and fake sinks.

The fake sinks stand in for the node's intake, which is tested on its own: they decode the offer with the real codec,
claim it, "run" it and reply with a real signed result, or refuse the way the intake does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from executor.contract import ExecResult
from transports.base import Admitted, Delivery, Verdict
from transports.ble.policy import ProximityPolicy
from transports.wire.identity import NodeIdentity
from transports.wire.offers import TaskOffer, open_offer
from transports.wire.reasons import Reason, Rejected, Rejection
from transports.wire.results import TaskResult

OFFERER = NodeIdentity.generate()
NODE = NodeIdentity.generate()

# Short deadlines: the fault tests must end in well under a second each.
FAST = ProximityPolicy(
    min_rssi=-80,
    max_peers=8,
    max_sessions=2,
    retry_after_s=60.0,
    connect_timeout_s=2.0,
    idle_timeout_s=0.5,
    transfer_timeout_s=5.0,
    claim_timeout_s=1.0,
    result_timeout_s=5.0,
    participation_poll_s=0.02,
)


def signed_offer(code: str = "print('hello from ble')", *, sandbox: str = "docker", pad: int = 0) -> bytes:
    offer = TaskOffer.create(
        OFFERER,
        language="python",
        code=code + ("#" * pad),
        sandbox=sandbox,  # type: ignore[arg-type]
    )
    return offer.sign(OFFERER)


def signed_result(raw_offer: bytes, executor: NodeIdentity = NODE, stdout: str = "hello from ble\n") -> bytes:
    received = open_offer(raw_offer)
    result = TaskResult(
        received.offer.offer_id, received.digest, executor.public_key, ExecResult(ok=True, stdout=stdout)
    )
    return result.sign(executor)


@dataclass
class FakeIntake:
    """Mimics the intake: codec checks, the sandbox-required refusal, claim, run, reply."""

    participating: bool = True
    executor: NodeIdentity = NODE
    deliveries: list[Delivery] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    reply_errors: list[BaseException] = field(default_factory=list)
    decided: trio.Event = field(default_factory=trio.Event)
    # Set to run the "task" after `deliver` returns (as a real intake with a work queue does).
    background: trio.Nursery | None = None
    before_reply: Callable[[], Awaitable[None]] | None = None

    async def deliver(self, delivery: Delivery) -> Verdict:
        self.deliveries.append(delivery)
        verdict = await self._decide(delivery)
        self.verdicts.append(verdict)
        self.decided.set()
        return verdict

    async def _decide(self, delivery: Delivery) -> Verdict:
        try:
            received = open_offer(delivery.raw)
        except Rejected as rejected:
            return rejected.rejection
        if received.offer.sandbox != "docker":
            return Rejection(Reason.SANDBOX_REQUIRED, "remote tasks run only in the sandbox")
        if not await delivery.claim():
            return Rejection(Reason.CLAIM_REFUSED, "offerer did not grant the claim")
        if self.background is not None:
            self.background.start_soon(self._run_and_reply, delivery)
        else:
            await self._run_and_reply(delivery)
        return Admitted(received.offer.offer_id)

    async def _run_and_reply(self, delivery: Delivery) -> None:
        if self.before_reply is not None:
            await self.before_reply()
        try:
            await delivery.reply(signed_result(delivery.raw, self.executor))
        except Exception as exc:
            self.reply_errors.append(exc)
