"""A stateful model of the intake: under any interleaving of deliveries, gate changes, queue pops and time, each
offer is admitted at most once, `replayed` is said only of an offer that was admitted, and the queue keeps its
bounds per offerer. This is the property the burned-id bug broke (a refusal spent the id)."""

from __future__ import annotations

import trio
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from mesh.identity import NodeIdentity
from mesh.intake import Intake, IntakePolicy
from mesh.offers import TaskOffer
from mesh.reasons import Reason, Rejection
from tests.strategies import NOW
from transports.base import Admitted, Delivery

IDENTITIES = [NodeIdentity(bytes([n]) * 32) for n in (1, 2, 3)]
OFFERS = [
    TaskOffer.create(identity, language="python", code=f"print({n})", issued_at_ms=NOW).sign(identity)
    for identity in IDENTITIES
    for n in range(4)
]


async def _no_reply(_: bytes) -> None:
    return None


class IntakeModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.t = 0.0
        self.open = True
        self.policy = IntakePolicy(queue_size=4, queue_per_offerer=2, rate_per_offerer=1.0, burst_per_offerer=2)
        self.intake = Intake(
            self.policy, participating=lambda: self.open, clock_ms=lambda: NOW, monotonic=lambda: self.t
        )
        self.admitted: set[int] = set()

    @rule(index=st.integers(0, len(OFFERS) - 1))
    def deliver(self, index: int) -> None:
        async def go() -> Admitted | Rejection:
            return await self.intake.deliver(Delivery(OFFERS[index], "direct", None, _no_reply))

        verdict = trio.run(go)
        if isinstance(verdict, Admitted):
            assert index not in self.admitted, "an offer was admitted twice"
            self.admitted.add(index)
        elif verdict.reason == Reason.REPLAYED:
            assert index in self.admitted, "replayed said of an offer that was never admitted"
        else:
            assert verdict.reason in (Reason.BUSY, Reason.RATE_LIMITED, Reason.SANDBOX_UNAVAILABLE), verdict
            assert index not in self.admitted

    @rule(participating=st.booleans())
    def gate(self, participating: bool) -> None:
        self.open = participating

    @rule()
    def pop(self) -> None:
        try:
            self.intake.jobs.receive_nowait()
        except trio.WouldBlock:
            pass

    @rule(seconds=st.floats(0.1, 3.0))
    def wait(self, seconds: float) -> None:
        self.t += seconds

    @invariant()
    def bounds(self) -> None:
        assert self.intake.queue_depth <= self.policy.queue_size


TestIntakeModel = IntakeModel.TestCase
TestIntakeModel.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
