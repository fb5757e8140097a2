"""Resilience over the simulated radio: bounded jittered connect retries, a reply that survives a dropped link, and
a refusal the offering side is told about."""

from __future__ import annotations

import asyncio
import dataclasses
import random

import pytest
import trio

from tests.test_ble_support import FAST, NODE, OFFERER, FakeIntake, signed_offer
from transports.base import Admitted
from transports.ble import BleReason, BleTransport
from transports.ble.central import connect_with_retries
from transports.ble.peripheral import PeripheralFaults
from transports.ble.reasons import BleFault
from transports.ble.sim import open_simulated_radio
from transports.wire.reasons import Reason

DEADLINE_S = 60  # a failure guard for readiness waits, never a speed assertion


class RecordingRandom(random.Random):
    def __init__(self) -> None:
        super().__init__(7)
        self.ceilings: list[float] = []

    def uniform(self, a: float, b: float) -> float:
        self.ceilings.append(b)
        value = super().uniform(a, b)
        assert a <= value <= b
        return value


def test_connect_retries_are_bounded_and_jittered() -> None:
    policy = dataclasses.replace(FAST, connect_attempts=4, connect_backoff_s=0.01, connect_backoff_cap_s=0.03)
    calls = 0

    async def flaky(fail: int) -> int:
        nonlocal calls
        calls = 0

        async def connect() -> None:
            nonlocal calls
            calls += 1
            if calls <= fail:
                raise OSError("le-connection-abort-by-local")

        return await connect_with_retries(connect, policy, rng)

    rng = RecordingRandom()
    assert asyncio.run(flaky(2)) == 3  # two failures, then connected
    assert rng.ceilings == [0.02, 0.03]  # base * 2^n, capped; the sleep is a random point below it
    rng = RecordingRandom()
    with pytest.raises(BleFault) as info:
        asyncio.run(flaky(99))
    assert info.value.code == BleReason.CONNECT_FAILED and calls == 4  # never more than connect_attempts
    assert "le-connection-abort-by-local" in info.value.detail


def test_a_connect_that_hangs_is_cut_by_the_connect_timeout_each_attempt() -> None:
    policy = dataclasses.replace(FAST, connect_attempts=2, connect_timeout_s=0.05, connect_backoff_s=0.0)

    async def hang() -> None:
        await asyncio.Event().wait()

    with pytest.raises(BleFault) as info:
        asyncio.run(connect_with_retries(hang, policy))
    assert info.value.code == BleReason.CONNECT_FAILED and "TimeoutError" in info.value.detail


def test_a_reply_survives_a_dropped_link_by_reconnecting_and_resuming() -> None:
    async def main() -> None:
        intake = FakeIntake()
        with trio.fail_after(DEADLINE_S):
            async with open_simulated_radio() as radio:
                laptop = await radio.add_offering_peer(
                    OFFERER, signed_offer(), faults=PeripheralFaults(drop_link_on_result=1)
                )
                backend = await radio.central_backend()
                async with BleTransport.open(intake, FAST, claimant=NODE, backend=backend) as ble:
                    result = await laptop.wait_result()
                    (outcome,) = await ble.outcomes.wait_for(lambda items: len(items) >= 1)
                    stats = await ble.stats()
                state = await laptop.state()
        assert result.executor == NODE.public_key
        assert isinstance(outcome.verdict, Admitted) and outcome.replied and outcome.fault is None
        assert outcome.reconnects == 1 and stats.reply_reconnects == 1
        assert state.links_served == 2  # the first link, dropped mid-reply, and the one that finished it
        assert [c.granted for c in state.claims] == [True, True]  # the grant holder, granted again

    trio.run(main)


def test_a_link_that_keeps_dropping_ends_in_a_typed_fault_not_a_loop() -> None:
    async def main() -> None:
        intake = FakeIntake()
        policy = dataclasses.replace(FAST, reply_reconnects=1)
        with trio.fail_after(DEADLINE_S):
            async with open_simulated_radio() as radio:
                laptop = await radio.add_offering_peer(
                    OFFERER, signed_offer(), faults=PeripheralFaults(drop_link_on_result=5)
                )
                backend = await radio.central_backend()
                async with BleTransport.open(intake, policy, claimant=NODE, backend=backend) as ble:
                    (outcome,) = await ble.outcomes.wait_for(lambda items: len(items) >= 1)
                state = await laptop.state()
        assert outcome.fault is not None and outcome.fault.detail.startswith("ble/disconnected")
        assert outcome.reconnects == 1 and not outcome.replied and not state.has_result
        assert len(intake.reply_errors) == 1  # the node's worker got a typed failure, and went on

    trio.run(main)


def test_the_offering_side_is_told_why_the_intake_refused() -> None:
    async def main() -> None:
        intake = FakeIntake()
        with trio.fail_after(DEADLINE_S):
            async with open_simulated_radio() as radio:
                laptop = await radio.add_offering_peer(OFFERER, signed_offer(sandbox="host"))
                backend = await radio.central_backend()
                async with BleTransport.open(intake, FAST, claimant=NODE, backend=backend) as ble:
                    (outcome,) = await ble.outcomes.wait_for(lambda items: len(items) >= 1)
                state = await laptop.state()
        assert outcome.verdict is not None and outcome.verdict.reason == Reason.SANDBOX_REQUIRED  # type: ignore[union-attr]
        assert [r.reason for r in state.refusals] == ["sandbox_required_for_remote_task"]
        assert state.claims == []  # refused before any claim

    trio.run(main)
