"""A stateful model of the intake: under any interleaving of deliveries, gate changes, queue pops and time, each
offer is admitted at most once, `replayed` is said only of an offer that was admitted, and the queue keeps its
bounds per offerer (unfinished: queued or running) and the fresh offerers' share of places and workers. The first
property is the one the burned-id bug broke (a refusal spent the id)."""

from __future__ import annotations

import trio
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from mesh.intake import Intake, IntakePolicy, Job
from tests.strategies import NOW
from transports.base import Admitted, Delivery
from transports.wire.identity import NodeIdentity
from transports.wire.offers import TaskOffer
from transports.wire.reasons import Reason, Rejection

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
            self.policy, participating=lambda: self.open, clock_ms=lambda: NOW, monotonic=lambda: self.t, workers=2
        )
        self.admitted: set[int] = set()
        self.taken: list[Job] = []  # in a worker's hands

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
            self.taken.append(self.intake.jobs.receive_nowait())
        except trio.WouldBlock:
            pass

    @rule(k=st.integers(0, 7), ran=st.booleans())
    def finish(self, k: int, ran: bool) -> None:
        if not self.taken:
            return
        job = self.taken.pop(k % len(self.taken))
        self.intake.finished(job)
        if ran:
            self.intake.served(job)

    @rule(seconds=st.floats(0.1, 3.0))
    def wait(self, seconds: float) -> None:
        self.t += seconds

    @invariant()
    def bounds(self) -> None:
        assert self.intake.queue_depth <= self.policy.queue_size
        queue = self.intake.jobs.classes
        assert len(queue.fresh) <= self.policy.fresh_places()
        assert queue.fresh.running() == sum(not job.established for job in self.taken) <= self.policy.fresh_workers(2)
        for identity in IDENTITIES:
            key = identity.public_key
            assert queue.established.held(key) + queue.fresh.held(key) <= self.policy.per_offerer(2)


TestIntakeModel = IntakeModel.TestCase
TestIntakeModel.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
