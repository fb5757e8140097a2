"""The intake: one entry point, origin always remote, every rejection typed, counted and cheap-first."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from executor.contract import SANDBOX_REQUIRED
from mesh.intake import Intake, IntakePolicy
from tests.strategies import NOW, OFFERER, offers
from transports.base import Admitted, Delivery
from transports.wire.codec import pack
from transports.wire.identity import NodeIdentity
from transports.wire.needs import Capabilities, Needs, Resources
from transports.wire.offers import Audience, TaskOffer
from transports.wire.reasons import Reason, Rejection

OTHER = NodeIdentity(bytes(range(100, 132)))


async def _no_reply(_: bytes) -> None:
    return None


def delivery(raw: bytes, transport: str = "gossip") -> Delivery:
    # As the transports do: only the direct protocol delivers offers addressed to this node.
    return Delivery(raw=raw, transport=transport, sender="12D3KooWtest", reply=_no_reply, direct=transport == "direct")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


ME = NodeIdentity(bytes(range(200, 232))).peer_id


def make_intake(
    participating: bool = True, *, peer_id: str = ME, tiers: tuple[str, ...] = ("runc",), **policy: Any
) -> tuple[Intake, Clock]:
    clock = Clock()
    intake = Intake(
        IntakePolicy(**policy),
        participating=lambda: participating,
        clock_ms=lambda: NOW,
        monotonic=clock,
        peer_id=peer_id,
        tiers=lambda: tiers,
    )
    return intake, clock


def offer(identity: NodeIdentity = OFFERER, **changes: Any) -> bytes:
    fields: dict[str, Any] = {"language": "python", "code": "print(1)", "issued_at_ms": NOW}
    fields.update(changes)
    return TaskOffer.create(identity, **fields).sign(identity)


def run(fn: Callable[[], Any]) -> Any:
    return trio.run(fn)


def deliver(intake: Intake, raw: bytes, transport: str = "gossip") -> Admitted | Rejection:
    async def go() -> Admitted | Rejection:
        return await intake.deliver(delivery(raw, transport))

    return trio.run(go)


def reason(verdict: object) -> Reason:
    assert isinstance(verdict, Rejection), verdict
    return verdict.reason


def expected_route_refusal(task: TaskOffer, transport: str, me: str, tiers: tuple[str, ...]) -> Reason | None:
    """What the queue deadline, the audience, the sandbox kind and the tier say of this offer reaching `me` by
    `transport`."""
    if task.queue_deadline_ms is not None and task.queue_deadline_ms <= NOW:
        return Reason.QUEUE_DEADLINE  # checked with the clock, before the rest
    audience = task.audience
    if audience is not None:
        if audience.to is not None and (transport != "direct" or audience.to != me):
            return Reason.WRONG_AUDIENCE
        if audience.to is None and transport == "direct":
            return Reason.WRONG_AUDIENCE
        if audience.to is None and audience.invited and me not in audience.invited:
            return Reason.NOT_INVITED
    if task.sandbox == "host":  # refused at the intake, before any claim could be taken
        return Reason.SANDBOX_REQUIRED
    if task.min_isolation == "gvisor" and "gvisor" not in tiers:
        return Reason.ISOLATION_INSUFFICIENT
    return None


@settings(max_examples=100)
@given(
    offers(),
    st.sampled_from(["direct", "gossip", "ble", "coordinator"]),
    st.sampled_from([("runc",), ("gvisor",), ("runc", "gvisor")]),
    st.booleans(),
)
def test_admitted_offers_are_remote_and_run_only_where_their_audience_says(
    task: TaskOffer, transport: str, tiers: tuple[str, ...], addressed: bool
) -> None:
    """Whatever the offer says it is `origin=remote`; it is admitted only by the node its audience names, only on
    the route its audience allows (a v1 offer names none), and only where its minimum tier is met."""
    audience = task.audience
    me = ME
    if addressed and audience is not None:  # this node is the one it was sent to, or an invitee
        me = audience.to or (audience.invited[0] if audience.invited else ME)
    intake, _ = make_intake(peer_id=me, tiers=tiers)
    verdict = deliver(intake, task.sign(OFFERER), transport)
    expected = expected_route_refusal(task, transport, me, tiers)
    if expected is not None:
        assert reason(verdict) == expected
        return
    if isinstance(verdict, Rejection):  # otherwise only the clock may refuse a generated offer
        assert verdict.reason in (Reason.EXPIRED, Reason.TTL_TOO_LONG, Reason.NOT_YET_VALID)
        return
    job = intake.jobs.receive_nowait()
    assert job.origin == "remote"
    assert job.received.offer == task


@settings(max_examples=200)
@given(st.binary(max_size=600))
def test_garbage_gets_a_typed_rejection_and_the_intake_keeps_serving(raw: bytes) -> None:
    intake, _ = make_intake()
    assert isinstance(deliver(intake, raw), Rejection)
    assert isinstance(deliver(intake, offer()), Admitted)


@settings(max_examples=100)
@given(st.data())
def test_a_tampered_offer_is_rejected_and_never_queued(data: st.DataObject) -> None:
    intake, _ = make_intake()
    raw = bytearray(offer())
    index = data.draw(st.integers(0, len(raw) - 1))
    raw[index] ^= data.draw(st.integers(1, 255))
    assert isinstance(deliver(intake, bytes(raw)), Rejection)
    with pytest.raises(trio.WouldBlock):
        intake.jobs.receive_nowait()


def test_every_rejection_path_has_its_reason_and_is_counted() -> None:
    intake, _ = make_intake(
        languages=frozenset({"python"}), deny_offerers=frozenset({OTHER.public_key}), max_message_bytes=4096
    )
    good = offer()
    body, signature = msgpack.unpackb(good)
    cases = {
        Reason.TOO_LARGE: b"\x00" * 5000,
        Reason.MALFORMED: b"\xc1garbage",
        Reason.UNSUPPORTED_VERSION: pack([pack({"version": 9}), signature]),
        Reason.EXPIRED: offer(issued_at_ms=NOW - 200_000),
        Reason.NOT_YET_VALID: offer(issued_at_ms=NOW + 100_000),
        Reason.TTL_TOO_LONG: offer(ttl_ms=11 * 60_000),
        Reason.BAD_SIGNATURE: pack([body, bytes(64)]),
        Reason.LANGUAGE_NOT_ALLOWED: offer(language="javascript"),
        Reason.OFFERER_DENIED: offer(OTHER),
        Reason.SANDBOX_REQUIRED: offer(sandbox="host"),
        Reason.WRONG_AUDIENCE: offer(audience=Audience.direct(OTHER.peer_id)),
        Reason.NOT_INVITED: offer(audience=Audience.claimed([OTHER.peer_id])),
        Reason.ISOLATION_INSUFFICIENT: offer(min_isolation="gvisor"),
        # Queued until a time already past: a deadline in the past is refused, not queued.
        Reason.QUEUE_DEADLINE: offer(issued_at_ms=NOW - 10_000, queue_deadline_ms=NOW - 1),
    }
    for expected, raw in cases.items():
        assert reason(deliver(intake, raw, "gossip")) == expected, expected
        assert intake.rejected[("gossip", str(expected))] == 1
    assert isinstance(deliver(intake, good), Admitted)
    assert reason(deliver(intake, good)) == Reason.REPLAYED
    text = intake.metrics.exposition().decode()
    assert 'edgecoder_offers_rejected_total{reason="replayed",transport="gossip"} 1.0' in text


def test_a_queue_deadline_still_ahead_is_admitted() -> None:
    intake, _ = make_intake()
    assert isinstance(deliver(intake, offer(queue_deadline_ms=NOW + 5_000)), Admitted)
    at_deadline = offer(issued_at_ms=NOW - 1_000, queue_deadline_ms=NOW)
    assert reason(deliver(intake, at_deadline)) == Reason.QUEUE_DEADLINE  # at the deadline: too late


def test_allow_list() -> None:
    intake, _ = make_intake(allow_offerers=frozenset({OTHER.public_key}))
    assert reason(deliver(intake, offer())) == Reason.OFFERER_DENIED
    assert isinstance(deliver(intake, offer(OTHER)), Admitted)


def test_not_participating_refuses_with_sandbox_unavailable() -> None:
    intake, _ = make_intake(participating=False)
    assert reason(deliver(intake, offer(), "ble")) == Reason.SANDBOX_UNAVAILABLE
    assert not intake.participating


TRUSTED = frozenset({OFFERER.public_key, OTHER.public_key})


def take(intake: Intake) -> Any:
    """What a worker does with a job: take it from the queue, and tell the intake it is done with it."""
    job = intake.jobs.receive_nowait()
    intake.finished(job)
    return job


def test_a_full_queue_refuses_with_busy_and_loses_nothing_admitted() -> None:
    intake, _ = make_intake(queue_size=3, queue_per_offerer=3, burst_per_offerer=100, trusted_offerers=TRUSTED)
    verdicts = [deliver(intake, offer()) for _ in range(5)]
    assert [type(v).__name__ for v in verdicts] == ["Admitted"] * 3 + ["Rejection"] * 2
    assert all(reason(v) == Reason.BUSY for v in verdicts[3:])
    admitted = [take(intake).received.offer.offer_id for _ in range(3)]
    assert admitted == [v.offer_id for v in verdicts[:3] if isinstance(v, Admitted)]


def test_one_offerer_holds_at_most_its_share_of_the_queue_and_others_still_get_in() -> None:
    intake, _ = make_intake(queue_size=8, queue_per_offerer=2, burst_per_offerer=100)
    flood = [deliver(intake, offer()) for _ in range(10)]
    assert sum(isinstance(v, Admitted) for v in flood) == 2
    assert all(reason(v) == Reason.BUSY for v in flood[2:])
    assert isinstance(deliver(intake, offer(OTHER)), Admitted)


def test_the_queue_serves_offerers_in_turn() -> None:
    intake, _ = make_intake(queue_size=32, queue_per_offerer=16, burst_per_offerer=100)
    for _ in range(5):
        deliver(intake, offer())
    deliver(intake, offer(OTHER))
    order = [take(intake).received.offer.offerer for _ in range(6)]
    # The other offerer's one job is served second, not behind the first offerer's backlog.
    assert order[1] == OTHER.public_key and order.count(OFFERER.public_key) == 5


def test_an_offer_refused_busy_rate_limited_or_unavailable_can_be_sent_again() -> None:
    """The id is spent only on admission: a refusal that says "not now" must not turn the retry into `replayed`."""
    participating = [False]
    clock = Clock()
    intake = Intake(
        IntakePolicy(queue_size=1, queue_per_offerer=1, rate_per_offerer=1, burst_per_offerer=1),
        participating=lambda: participating[0],
        clock_ms=lambda: NOW,
        monotonic=clock,
    )
    unavailable, busy, limited = offer(), offer(), offer()
    assert reason(deliver(intake, unavailable)) == Reason.SANDBOX_UNAVAILABLE
    participating[0] = True
    assert isinstance(deliver(intake, unavailable), Admitted)  # the same bytes, sent again
    assert reason(deliver(intake, busy)) == Reason.BUSY  # the queue holds one
    take(intake)
    clock.t += 1.0
    assert isinstance(deliver(intake, busy), Admitted)
    take(intake)
    assert reason(deliver(intake, limited)) == Reason.RATE_LIMITED  # the bucket was emptied by `busy`
    clock.t += 1.0
    assert isinstance(deliver(intake, limited), Admitted)
    assert [reason(deliver(intake, raw)) for raw in (unavailable, busy, limited)] == [Reason.REPLAYED] * 3


def test_a_rate_limited_flood_cannot_make_the_intake_forget_another_offerers_ids() -> None:
    """One key's flood used to evict other offerers' ids from a shared cache, so a captured offer got in again."""
    intake, clock = make_intake(replay_capacity=64, rate_per_offerer=1000, burst_per_offerer=1000, queue_size=1000)
    captured = offer(OTHER)
    assert isinstance(deliver(intake, captured), Admitted)
    for _ in range(500):  # far past the whole memory's capacity
        deliver(intake, offer())
        clock.t += 0.01
    assert reason(deliver(intake, captured)) == Reason.REPLAYED


def test_a_full_replay_memory_refuses_rather_than_forgetting() -> None:
    intake, _ = make_intake(replay_capacity=3, burst_per_offerer=100, queue_size=100, queue_per_offerer=100)
    first = offer()
    verdicts = [deliver(intake, raw) for raw in [first, offer(), offer(), offer(OTHER)]]
    assert [isinstance(v, Admitted) for v in verdicts] == [True, True, True, False]
    assert reason(verdicts[3]) == Reason.BUSY
    assert reason(deliver(intake, first)) == Reason.REPLAYED


def test_a_flooding_offerer_is_rate_limited_while_another_is_served() -> None:
    intake, clock = make_intake(rate_per_offerer=2, burst_per_offerer=5, queue_size=1000, queue_per_offerer=100)
    flood = [deliver(intake, offer()) for _ in range(50)]
    assert sum(isinstance(v, Admitted) for v in flood) == 5
    assert intake.rejected[("gossip", "rate_limited")] == 45
    assert isinstance(deliver(intake, offer(OTHER)), Admitted)
    clock.t += 1.0  # two more tokens a second
    assert [isinstance(deliver(intake, offer()), Admitted) for _ in range(3)] == [True, True, False]


def test_forgeries_cannot_burn_a_real_offerers_offer_id() -> None:
    intake, _ = make_intake()
    good = offer()
    body, _ = msgpack.unpackb(good)
    assert reason(deliver(intake, pack([body, bytes(64)]))) == Reason.BAD_SIGNATURE
    assert isinstance(deliver(intake, good), Admitted)


def test_garbage_costs_no_signature_work(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0
    import transports.wire.codec

    real = transports.wire.codec.verify

    def counting(*args: Any) -> bool:
        nonlocal calls
        calls += 1
        return real(*args)

    monkeypatch.setattr(transports.wire.codec, "verify", counting)
    intake, _ = make_intake()
    for raw in (b"", b"\x00" * 300_000, b"\x92\xc4\x01a\xc4\x01b", offer(issued_at_ms=NOW - 10**6)):
        assert isinstance(deliver(intake, raw), Rejection)
    assert calls == 0


def test_the_gossip_validator_is_stateless_and_spares_the_second_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    intake, _ = make_intake()
    good = offer()
    assert intake.validate(good) is None
    assert intake.validate(good) is None  # no replay state consumed
    import transports.wire.codec

    monkeypatch.setattr(transports.wire.codec, "verify", lambda *a: pytest.fail("verified twice"))
    assert isinstance(deliver(intake, good, "gossip"), Admitted)
    body, _ = msgpack.unpackb(good)
    monkeypatch.undo()
    assert reason(intake.validate(pack([body, bytes(64)]))) == Reason.BAD_SIGNATURE


def test_a_closed_intake_refuses_with_shutting_down() -> None:
    intake, _ = make_intake()
    intake.close()
    assert reason(deliver(intake, offer())) == Reason.SHUTTING_DOWN


def test_a_direct_offer_runs_only_on_the_node_it_names_and_only_when_sent_directly() -> None:
    intake, _ = make_intake()
    to_me = offer(audience=Audience.direct(ME))
    assert reason(deliver(intake, to_me, "gossip")) == Reason.WRONG_AUDIENCE  # heard, not sent to us
    assert reason(deliver(intake, offer(audience=Audience.direct(OTHER.peer_id)), "direct")) == Reason.WRONG_AUDIENCE
    assert isinstance(deliver(intake, to_me, "direct"), Admitted)  # refused above without spending its id


def test_a_claimed_offer_re_sent_directly_is_refused_and_can_still_be_claimed() -> None:
    """The attack of issue 11: a gossip offer sent straight to another node ran there without any claim."""
    intake, _ = make_intake()
    claimed = offer()
    assert reason(deliver(intake, claimed, "direct")) == Reason.WRONG_AUDIENCE
    assert isinstance(deliver(intake, claimed, "gossip"), Admitted)


def test_an_offer_for_invitees_is_claimed_only_by_them() -> None:
    invited, outsider = make_intake()[0], make_intake(peer_id=OTHER.peer_id)[0]
    raw = offer(audience=Audience.claimed([ME]))
    assert reason(deliver(outsider, raw)) == Reason.NOT_INVITED
    assert isinstance(deliver(invited, raw), Admitted)


def test_a_minimum_tier_is_met_by_that_tier_or_a_stronger_one_and_a_closed_gate_runs_none() -> None:
    needs_gvisor, needs_runc = offer(min_isolation="gvisor"), offer(min_isolation="runc")
    assert reason(deliver(make_intake(tiers=("runc",))[0], needs_gvisor)) == Reason.ISOLATION_INSUFFICIENT
    assert isinstance(deliver(make_intake(tiers=("gvisor",))[0], needs_gvisor), Admitted)
    assert isinstance(deliver(make_intake(tiers=("gvisor",))[0], needs_runc), Admitted)
    assert reason(deliver(make_intake(tiers=())[0], needs_runc)) == Reason.ISOLATION_INSUFFICIENT


def test_a_version_1_offer_is_still_taken_on_any_route() -> None:
    import dataclasses

    v1 = dataclasses.replace(
        TaskOffer.create(OFFERER, language="python", code="print(1)", issued_at_ms=NOW), version=1, audience=None
    ).sign(OFFERER)
    assert isinstance(deliver(make_intake()[0], v1, "direct"), Admitted)
    assert isinstance(deliver(make_intake()[0], v1, "gossip"), Admitted)


def test_a_host_request_is_refused_before_any_claim_with_the_seeds_run_result() -> None:
    """The seed's contract: ok false, stderr `sandbox_required_for_remote_task`, no process; refused by the intake
    itself, so the transport never asks the offerer for a claim, and the reason code stays beside the result."""
    intake, _ = make_intake()
    claims: list[None] = []

    async def claim() -> bool:
        claims.append(None)
        return True

    async def go() -> Admitted | Rejection:
        raw = offer(sandbox="host")
        return await intake.deliver(Delivery(raw, "gossip", "12D3KooWtest", _no_reply, claim=claim))

    verdict = trio.run(go)
    assert isinstance(verdict, Rejection) and verdict.reason is Reason.SANDBOX_REQUIRED
    assert verdict.result is not None
    assert verdict.result.to_json() == {
        "ok": False,
        "stdout": "",
        "stderr": "sandbox_required_for_remote_task",
        "exitCode": None,
        "durationMs": 0,
        "queueForCloud": True,
        "queueReason": "sandbox_required_for_remote_task",
        "errorKind": "sandbox-violation",
        "stdoutTruncated": False,
        "stderrTruncated": False,
    }
    assert claims == [] and len(intake.jobs) == 0 and intake.rejected[("gossip", SANDBOX_REQUIRED)] == 1


def test_an_offer_needing_a_runtime_or_resources_this_node_lacks_is_refused_before_any_claim() -> None:
    science = "cd" * 32
    caps = Capabilities({"python": "ab" * 32, "python-science": science}, cores=1, memory_mb=512, arch="x86_64")
    intake, _ = make_intake()
    intake._capabilities = lambda: caps
    assert isinstance(deliver(intake, offer(needs=Needs("python-science"))), Admitted)
    assert isinstance(deliver(intake, offer(needs=Needs("python-science", science))), Admitted)
    assert reason(deliver(intake, offer(needs=Needs("python-science", "ef" * 32)))) == Reason.RUNTIME_UNAVAILABLE
    assert reason(deliver(intake, offer(needs=Needs("geo")))) == Reason.RUNTIME_UNAVAILABLE
    assert reason(deliver(intake, offer(needs=Needs(resources=Resources(cores=2))))) == Reason.RESOURCES_INSUFFICIENT
    # A node without an executor (or from before runtimes) runs what needs nothing but python.
    bare, _ = make_intake()
    assert isinstance(deliver(bare, offer()), Admitted)
    assert reason(deliver(bare, offer(needs=Needs("python-science")))) == Reason.RUNTIME_UNAVAILABLE
    assert intake.rejected[("gossip", "runtime_unavailable")] == 2
