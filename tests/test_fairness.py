"""Fairness against one flooding key and against a Sybil swarm of fresh keys, on the real intake.

Each test drives `Intake` as the node's workers do: take a job (`receive_nowait`), finish it (`finished`), and,
when its code ran, `served`. The honest offerer has been served before (it is established); the attackers' keys are
fresh, as any key an attacker makes is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from mesh.intake import Intake, IntakePolicy, Job
from mesh.standing import Standing
from tests.strategies import NOW
from transports.base import Admitted, Delivery
from transports.wire.identity import NodeIdentity
from transports.wire.offers import TaskOffer
from transports.wire.reasons import Reason, Rejection

HONEST = NodeIdentity(bytes([7]) * 32)
WORKERS = 2


async def _no_reply(_: bytes) -> None:
    return None


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make_intake(workers: int = WORKERS, **policy: Any) -> tuple[Intake, Clock]:
    clock = Clock()
    intake = Intake(
        IntakePolicy(**policy), participating=lambda: True, clock_ms=lambda: NOW, monotonic=clock, workers=workers
    )
    return intake, clock


def offer(identity: NodeIdentity) -> bytes:
    return TaskOffer.create(identity, language="python", code="print(1)", issued_at_ms=NOW).sign(identity)


def deliver(intake: Intake, raw: bytes) -> Admitted | Rejection:
    async def go() -> Admitted | Rejection:
        return await intake.deliver(Delivery(raw=raw, transport="direct", sender=None, reply=_no_reply))

    return trio.run(go)


def take(intake: Intake) -> Job | None:
    try:
        return intake.jobs.receive_nowait()
    except trio.WouldBlock:
        return None


def serve(intake: Intake, job: Job) -> None:
    """A worker's end of a job whose code ran: finished, and its offerer served."""
    intake.finished(job)
    intake.served(job)


def establish(intake: Intake, identity: NodeIdentity, clock: Clock) -> None:
    """Served, and served again once the tenure has passed: what an offerer that uses this node does."""
    for _ in range(2):
        assert isinstance(deliver(intake, offer(identity)), Admitted)
        job = take(intake)
        assert job is not None and job.offerer == identity.public_key and not job.established
        serve(intake, job)
        assert intake.standing.established(identity.public_key) == (_ == 1)
        clock.t += intake.policy.established_after_s


def sybils(n: int) -> list[NodeIdentity]:
    return [NodeIdentity.generate() for _ in range(n)]


def test_honest_offers_are_served_through_a_swarm_of_300_fresh_keys() -> None:
    """The finding: 0 of 29 honest offers served with 300 Sybil keys. Now the swarm fills only the fresh share."""
    intake, clock = make_intake()
    establish(intake, HONEST, clock)
    swarm = sybils(300)
    verdicts = [deliver(intake, offer(key)) for key in swarm]
    admitted = sum(isinstance(v, Admitted) for v in verdicts)
    assert admitted == intake.policy.fresh_places() == 16
    busy = [v for v in verdicts if isinstance(v, Rejection)]
    assert all(v.reason == Reason.BUSY and "new offerers' share" in v.detail for v in busy)
    # The fresh share of the workers (one of two) is running a Sybil job.
    running = take(intake)
    assert running is not None and not running.established
    served = 0
    for _ in range(29):
        clock.t += 0.5  # an honest offerer, within its rate
        assert isinstance(deliver(intake, offer(HONEST)), Admitted)
        job = take(intake)  # the other worker: it takes the honest job, not the next of the 15 Sybil jobs waiting
        assert job is not None and job.offerer == HONEST.public_key and job.established
        serve(intake, job)
        served += 1
        # The swarm keeps the fresh share of the queue full.
        for key in swarm:
            if isinstance(deliver(intake, offer(key)), Rejection):
                break
    assert served == 29
    assert take(intake) is None  # the fresh share of the workers is taken; the Sybil backlog waits
    serve(intake, running)
    nxt = take(intake)
    assert nxt is not None and not nxt.established  # once it is free, the swarm is served too


def test_one_flooding_key_holds_its_budget_and_the_honest_offer_is_next() -> None:
    """The finding: one key's burst of 20 then 5/s exceeded what two workers serve, and starved everyone."""
    intake, clock = make_intake(burst_per_offerer=1000, rate_per_offerer=1000)
    establish(intake, HONEST, clock)
    flooder = NodeIdentity.generate()
    verdicts = [deliver(intake, offer(flooder)) for _ in range(50)]
    budget = intake.policy.per_offerer(WORKERS)
    assert budget == 2 * WORKERS
    assert sum(isinstance(v, Admitted) for v in verdicts) == budget
    assert all(isinstance(v, Rejection) and "offers unfinished" in v.detail for v in verdicts[budget:])
    first = take(intake)
    assert first is not None and first.offerer == flooder.public_key
    assert isinstance(deliver(intake, offer(HONEST)), Admitted)
    honest = take(intake)
    assert honest is not None and honest.offerer == HONEST.public_key


def test_an_established_flooder_yields_its_turn_while_it_has_a_run_going() -> None:
    """An offerer with a job running waits behind offerers that have none, while there are any."""
    flooder = NodeIdentity.generate()
    intake, _ = make_intake(trusted_offerers=frozenset({flooder.public_key, HONEST.public_key}))
    for _ in range(intake.policy.per_offerer(WORKERS)):
        assert isinstance(deliver(intake, offer(flooder)), Admitted)
    running = take(intake)
    assert running is not None and running.offerer == flooder.public_key
    assert isinstance(deliver(intake, offer(HONEST)), Admitted)
    nxt = take(intake)
    assert nxt is not None and nxt.offerer == HONEST.public_key  # the honest offer jumps the flooder's backlog
    alone = take(intake)
    assert alone is not None and alone.offerer == flooder.public_key  # alone, it gets idle workers anyway


def test_the_budget_follows_the_workers_and_refills_as_they_finish() -> None:
    for workers in (1, 2, 4):
        intake, clock = make_intake(workers=workers, burst_per_offerer=1000, rate_per_offerer=1000)
        establish(intake, HONEST, clock)
        budget = intake.policy.per_offerer(workers)
        assert budget == max(2, 2 * workers)
        assert [isinstance(deliver(intake, offer(HONEST)), Admitted) for _ in range(budget + 1)] == [True] * budget + [
            False
        ]
        job = take(intake)
        assert job is not None
        assert isinstance(deliver(intake, offer(HONEST)), Rejection)  # running still counts
        serve(intake, job)
        assert isinstance(deliver(intake, offer(HONEST)), Admitted)  # finished: room for one more


def test_fresh_jobs_wait_for_the_fresh_share_of_the_workers() -> None:
    intake, _ = make_intake(workers=4)
    assert intake.policy.fresh_workers(4) == 2
    for key in sybils(5):
        assert isinstance(deliver(intake, offer(key)), Admitted)
    first, second = take(intake), take(intake)
    assert first is not None and second is not None
    assert take(intake) is None  # three fresh jobs queued, two running: the other two workers stay for others
    intake.finished(first)
    assert take(intake) is not None


def test_fresh_offerers_are_slowed_by_established_work_never_shut_out() -> None:
    regulars = sybils(8)
    intake, _ = make_intake(workers=2, trusted_offerers=frozenset(k.public_key for k in regulars))
    for key in regulars:
        assert isinstance(deliver(intake, offer(key)), Admitted)
    newcomer = NodeIdentity.generate()
    assert isinstance(deliver(intake, offer(newcomer)), Admitted)
    order = []
    for _ in range(9):
        job = take(intake)
        assert job is not None
        order.append(job.established)
        intake.finished(job)
    assert order.index(False) == 3  # after three established jobs in a row, the waiting fresh one


def test_with_one_worker_fresh_offerers_share_it_and_established_ones_go_first() -> None:
    intake, clock = make_intake(workers=1)
    establish(intake, HONEST, clock)
    for key in sybils(3):
        deliver(intake, offer(key))
    running = take(intake)
    assert running is not None and not running.established
    assert isinstance(deliver(intake, offer(HONEST)), Admitted)
    intake.finished(running)
    nxt = take(intake)
    assert nxt is not None and nxt.established  # no worker to keep aside, but the queue puts it first


def test_a_flooding_key_stays_fresh_for_its_tenure() -> None:
    """Served at once and again and again, a new key is still fresh until its first run here is ten minutes old."""
    intake, clock = make_intake(burst_per_offerer=1000, rate_per_offerer=1000)
    flooder = NodeIdentity.generate()
    for _ in range(50):
        assert isinstance(deliver(intake, offer(flooder)), Admitted)
        job = take(intake)
        assert job is not None and not job.established
        serve(intake, job)
        clock.t += 10
    assert not intake.standing.established(flooder.public_key)
    clock.t += 100  # 600 s since its first run
    assert isinstance(deliver(intake, offer(flooder)), Admitted)
    job = take(intake)
    assert job is not None
    serve(intake, job)
    assert intake.standing.established(flooder.public_key)


def test_promotion_is_rate_limited_node_wide() -> None:
    """A swarm that waits out the tenure becomes established only at the promotion budget's pace."""
    intake, clock = make_intake(workers=2, queue_size=1000, promotions_per_hour=60)
    swarm = sybils(100)
    for _ in range(2):
        for key in swarm:
            assert isinstance(deliver(intake, offer(key)), Admitted)
        for _ in swarm:
            job = take(intake)
            assert job is not None
            serve(intake, job)
        clock.t += 600
    assert intake.standing.promoted == 16 and intake.standing.deferred == 84  # the burst; then one a minute
    for key in swarm:
        intake.standing.served(key.public_key)
    assert intake.standing.promoted == 26  # the ten minutes since


def test_trusted_and_allowed_offerers_are_established_from_the_first_offer() -> None:
    trusted, allowed = NodeIdentity.generate(), NodeIdentity.generate()
    policies: list[tuple[NodeIdentity, dict[str, Any]]] = [
        (trusted, {"trusted_offerers": frozenset({trusted.public_key})}),
        (allowed, {"allow_offerers": frozenset({allowed.public_key})}),
    ]
    for identity, policy in policies:
        intake, _ = make_intake(**policy)
        assert isinstance(deliver(intake, offer(identity)), Admitted)
        job = take(intake)
        assert job is not None and job.established
        assert isinstance(
            deliver(intake, offer(NodeIdentity.generate())), Admitted if "trusted_offerers" in policy else Rejection
        )


def test_established_offerers_survive_a_restart(tmp_path: Path) -> None:
    journal = tmp_path / "offerers"
    clock = Clock()
    first = Standing(monotonic=clock, journal=journal, tenure_s=0)
    keys = [k.public_key for k in sybils(5)]
    for key in keys:
        assert first.served(key)
    first.close()
    with open(journal, "ab") as torn:
        torn.write(b"\x01" * 7)  # a crash mid-append
    again = Standing(monotonic=clock, journal=journal, capacity=3, tenure_s=0)
    assert [again.established(k) for k in keys] == [False, False, True, True, True]  # the newest three
    again.close()
    assert journal.stat().st_size == 3 * 32


@pytest.mark.parametrize("share", [0.0, 1.5])
def test_a_fresh_share_outside_0_to_1_is_refused(share: float) -> None:
    with pytest.raises(ValueError):
        IntakePolicy(fresh_share=share)


def test_a_promotion_does_not_give_an_offerer_a_second_budget() -> None:
    """Promoted while work of its fresh days is still queued, an offerer's budget spans both of its lanes."""
    newcomer = NodeIdentity.generate()
    intake, _ = make_intake(workers=1, burst_per_offerer=1000, rate_per_offerer=1000, established_after_s=0)
    budget = intake.policy.per_offerer(1)
    for _ in range(budget):
        assert isinstance(deliver(intake, offer(newcomer)), Admitted)
    job = take(intake)
    assert job is not None
    serve(intake, job)  # promoted, with budget - 1 offers still in its fresh lane
    assert intake.standing.established(newcomer.public_key)
    verdicts = [deliver(intake, offer(newcomer)) for _ in range(budget)]
    assert sum(isinstance(v, Admitted) for v in verdicts) == 1


def test_the_last_warm_container_is_kept_from_fresh_offerers_only_while_they_crowd_in() -> None:
    """A new user alone on a quiet node gets the warm container (spare 0): keeping it always from fresh keys made
    every run of a new offerer cold on a pool of one. While fresh work crowds in (a second fresh run, or fresh work
    queued), a fresh run leaves the last one (spare 1) to established offerers; an established offerer with no
    other run going may take it."""
    intake, clock = make_intake()
    establish(intake, HONEST, clock)
    newcomer, other, third = sybils(3)
    assert isinstance(deliver(intake, offer(newcomer)), Admitted)
    alone = take(intake)
    assert alone is not None and not alone.established
    assert intake.spare_warm(alone) == 0
    assert isinstance(deliver(intake, offer(other)), Admitted)  # fresh work queued behind it: crowded
    assert intake.spare_warm(alone) == 1
    serve(intake, alone)
    second = take(intake)
    assert second is not None and intake.spare_warm(second) == 0  # alone again
    assert isinstance(deliver(intake, offer(third)), Admitted)
    assert intake.spare_warm(second) == 1
    clock.t += 0.5
    assert isinstance(deliver(intake, offer(HONEST)), Admitted)
    honest = take(intake)
    assert honest is not None and honest.established and intake.spare_warm(honest) == 0
