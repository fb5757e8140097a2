"""Bad input and faults over the simulated radio: each ends in a typed rejection or a clean retry, never a hang."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import trio

from tests.test_ble_support import FAST, NODE, OFFERER, FakeIntake, signed_offer
from transports.base import Admitted
from transports.ble import BleReason, BleTransport, ProximityPolicy, SessionOutcome
from transports.ble.peripheral import PeripheralFaults
from transports.ble.sim import open_simulated_radio
from transports.wire.identity import NodeIdentity
from transports.wire.reasons import Reason

DEADLINE_S = 60  # a failure guard for readiness waits, never a speed assertion


async def run_one_session(
    faults: PeripheralFaults | None = None,
    *,
    policy: ProximityPolicy = FAST,
    offer: bytes | None = None,
    intake: FakeIntake | None = None,
) -> tuple[SessionOutcome, FakeIntake]:
    intake = intake or FakeIntake()
    with trio.fail_after(DEADLINE_S):
        async with open_simulated_radio() as radio:
            await radio.add_offering_peer(OFFERER, offer or signed_offer(pad=3000), faults=faults)
            backend = await radio.central_backend()
            async with BleTransport.open(intake, policy, claimant=NODE, backend=backend) as ble:
                (outcome,) = await ble.outcomes.wait_for(lambda items: len(items) >= 1)
    return outcome, intake


def fault_code(outcome: SessionOutcome) -> str:
    assert outcome.fault is not None, outcome
    return outcome.fault.detail.split(":")[0]


def tampered(edit: Callable[[list[bytes]], list[bytes]]) -> PeripheralFaults:
    return PeripheralFaults(tamper_offer=edit)


def corrupt_one_byte(frames: list[bytes]) -> list[bytes]:
    frame = bytearray(frames[2])
    frame[-1] ^= 0x5A
    return [*frames[:2], bytes(frame), *frames[3:]]


@pytest.mark.parametrize(
    ("edit", "code"),
    [
        (lambda f: f[:2] + f[3:], BleReason.OUT_OF_ORDER),  # missing chunk
        (lambda f: [f[0], f[2], f[1], *f[3:]], BleReason.OUT_OF_ORDER),  # reordered
        (lambda f: [*f[:3], f[2], *f[3:]], BleReason.DUPLICATE_CHUNK),  # duplicated
        (corrupt_one_byte, BleReason.DIGEST_MISMATCH),
    ],
    ids=["missing", "reordered", "duplicated", "corrupted"],
)
def test_damaged_offer_transfer_is_a_typed_rejection(edit: Callable[[list[bytes]], list[bytes]], code: str) -> None:
    outcome, intake = trio.run(run_one_session, tampered(edit))
    assert fault_code(outcome) == f"ble/{code}"
    assert intake.deliveries == []  # damaged bytes never reach the intake


def test_offer_over_the_length_cap_is_refused_before_buffering() -> None:
    policy = dataclasses.replace(FAST, max_offer_bytes=1024)
    outcome, intake = trio.run(lambda: run_one_session(policy=policy, offer=signed_offer(pad=4000)))
    assert fault_code(outcome) == "ble/too_large"
    assert outcome.fault is not None and outcome.fault.reason == Reason.TOO_LARGE
    assert intake.deliveries == []


def test_peripheral_that_stalls_mid_transfer_times_out() -> None:
    outcome, intake = trio.run(run_one_session, PeripheralFaults(stall_offer_after=3))
    assert fault_code(outcome) == "ble/timeout"
    assert outcome.fault is not None and outcome.fault.reason == Reason.TIMEOUT
    assert intake.deliveries == []


def test_peer_that_disconnects_during_the_claim() -> None:
    outcome, intake = trio.run(run_one_session, PeripheralFaults(disconnect_on_claim=True))
    # The node saw the offer, its claim came back False (not a hang), and it refused the work.
    assert len(intake.deliveries) == 1
    assert intake.verdicts[0].reason == Reason.CLAIM_REFUSED  # type: ignore[union-attr]
    assert fault_code(outcome) == "ble/disconnected"
    assert not outcome.claimed and not outcome.replied


def test_offer_asking_for_host_execution_is_refused_by_the_intake() -> None:
    outcome, intake = trio.run(lambda: run_one_session(offer=signed_offer(sandbox="host")))
    assert len(intake.deliveries) == 1
    assert outcome.verdict is not None and outcome.verdict.reason == Reason.SANDBOX_REQUIRED  # type: ignore[union-attr]
    assert outcome.fault is None and not outcome.claimed


def test_result_signed_by_someone_else_is_refused_by_the_offerer() -> None:
    impostor = FakeIntake(executor=NodeIdentity.generate())  # claims as NODE, signs as another key
    outcome, intake = trio.run(lambda: run_one_session(intake=impostor))
    assert isinstance(outcome.verdict, Admitted) and outcome.claimed and not outcome.replied
    assert fault_code(outcome) == "ble/result_refused"
    assert "WRONG_EXECUTOR" in outcome.fault.detail.upper()  # type: ignore[union-attr]
    assert len(intake.reply_errors) == 1


def test_reply_after_deliver_returns_keeps_the_link_until_the_result_is_back() -> None:
    async def main() -> None:
        async with trio.open_nursery() as work:
            release = trio.Event()
            intake = FakeIntake(background=work, before_reply=release.wait)
            with trio.fail_after(DEADLINE_S):
                async with open_simulated_radio() as radio:
                    laptop = await radio.add_offering_peer(OFFERER, signed_offer())
                    backend = await radio.central_backend()
                    async with BleTransport.open(intake, FAST, claimant=NODE, backend=backend) as ble:
                        await intake.decided.wait()
                        assert isinstance(intake.verdicts[0], Admitted)
                        release.set()
                        result = await laptop.wait_result()
                        (outcome,) = await ble.outcomes.wait_for(lambda items: len(items) >= 1)
            assert result.executor == NODE.public_key
            assert outcome.replied

    trio.run(main)


def test_exactly_one_claim_is_granted_per_offer() -> None:
    async def main() -> None:
        other = NodeIdentity.generate()
        first, second = FakeIntake(), FakeIntake(executor=other)
        with trio.fail_after(DEADLINE_S):
            async with open_simulated_radio() as radio:
                laptop = await radio.add_offering_peer(OFFERER, signed_offer())
                a, b = await radio.central_backend(), await radio.central_backend()
                async with BleTransport.open(first, FAST, claimant=NODE, backend=a) as t1:
                    await t1.outcomes.wait_for(lambda items: len(items) >= 1)
                    async with BleTransport.open(second, FAST, claimant=other, backend=b) as t2:
                        (late,) = await t2.outcomes.wait_for(lambda items: len(items) >= 1)
                state = await laptop.state()
        assert state.granted_to == NODE.peer_id
        assert [c.granted for c in state.claims] == [True, False]
        assert late.verdict.reason == Reason.CLAIM_REFUSED  # type: ignore[union-attr]
        assert fault_code(late) == "ble/claim_refused"

    trio.run(main)


def test_flood_of_advertisers_holds_the_session_caps() -> None:
    # The caps are under test, not the connect: a connect that outlasts FAST's 2 s on a loaded machine would end a
    # session as ble/connect_failed instead of the stalled transfer's ble/timeout (seen at load 20).
    policy = dataclasses.replace(FAST, max_sessions=2, max_peers=5, peer_window_s=60.0, connect_timeout_s=60.0)

    async def main() -> None:
        intake = FakeIntake()
        with trio.fail_after(DEADLINE_S):
            async with open_simulated_radio() as radio:
                for _ in range(12):
                    await radio.add_offering_peer(OFFERER, signed_offer(), faults=PeripheralFaults(stall_offer_after=1))
                backend = await radio.central_backend()
                async with BleTransport.open(intake, policy, claimant=NODE, backend=backend) as ble:
                    outcomes = await ble.outcomes.wait_for(lambda items: len(items) >= 5)
                    stats = await ble.stats()
        assert stats.peak_sessions <= 2
        assert stats.sessions_started == 5
        assert stats.busy > 0 and stats.over_peer_budget > 0
        assert {fault_code(o) for o in outcomes} == {"ble/timeout"}

    trio.run(main)


def test_far_away_advertisers_are_never_contacted() -> None:
    async def main() -> None:
        intake = FakeIntake()
        with trio.fail_after(DEADLINE_S):
            async with open_simulated_radio() as radio:
                await radio.add_offering_peer(OFFERER, signed_offer(), rssi=-95)
                near = await radio.add_offering_peer(OFFERER, signed_offer(), rssi=-40)
                backend = await radio.central_backend()
                async with BleTransport.open(intake, FAST, claimant=NODE, backend=backend) as ble:
                    (outcome,) = await ble.outcomes.wait_for(lambda items: len(items) >= 1)
                    stats = await ble.stats()
        assert outcome.address == near.address
        assert stats.too_far > 0 and stats.sessions_started == 1

    trio.run(main)


def test_not_participating_means_no_scan_and_no_connection_then_resume() -> None:
    async def main() -> None:
        intake = FakeIntake(participating=False)
        with trio.fail_after(DEADLINE_S):
            async with open_simulated_radio() as radio:
                laptop = await radio.add_offering_peer(OFFERER, signed_offer())
                backend = await radio.central_backend()
                async with BleTransport.open(intake, FAST, claimant=NODE, backend=backend) as ble:
                    # Let the participation watcher run several times while withdrawn.
                    await trio.sleep(FAST.participation_poll_s * 10)
                    stats = await ble.stats()
                    assert not ble.scanning and stats.scans_started == 0 and stats.sessions_started == 0
                    assert (await laptop.state()).claims == []
                    intake.participating = True
                    await ble.wait_scanning(True)
                    await laptop.wait_result()
                    intake.participating = False
                    await ble.wait_scanning(False)
        assert len(intake.deliveries) == 1

    trio.run(main)
