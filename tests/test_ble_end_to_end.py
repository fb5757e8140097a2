"""A Trio node with `BleTransport` and a simulated nearby laptop offering a real signed offer, end to end."""

from __future__ import annotations

import trio

from tests.test_ble_support import FAST, NODE, OFFERER, FakeIntake, signed_offer
from transports.base import Admitted
from transports.ble import BleTransport
from transports.ble.sim import open_simulated_radio
from transports.wire.results import TaskResult


def test_offer_claim_and_verified_result_over_simulated_radio() -> None:
    async def main() -> None:
        offer = signed_offer(pad=6000)  # several KB: many chunks, long reads not enough
        intake = FakeIntake()
        with trio.fail_after(10):
            async with open_simulated_radio() as radio:
                laptop = await radio.add_offering_peer(OFFERER, offer)
                backend = await radio.central_backend()
                async with BleTransport.open(intake, FAST, claimant=NODE, backend=backend) as ble:
                    result = await laptop.wait_result()
                    outcomes = await ble.outcomes.wait_for(lambda items: len(items) >= 1)
        assert isinstance(result, TaskResult)
        assert result.executor == NODE.public_key
        assert result.result.stdout == "hello from ble\n"
        (delivery,) = intake.deliveries
        assert delivery.raw == offer
        assert delivery.transport == "ble"
        assert delivery.sender == laptop.address
        (outcome,) = outcomes
        assert isinstance(outcome.verdict, Admitted)
        assert outcome.fault is None and outcome.claimed and outcome.replied
        assert outcome.advertised_peer_id == OFFERER.peer_id

    trio.run(main)
