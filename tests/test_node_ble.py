"""BLE into a real node: a simulated nearby laptop's offers reach the one intake and run only in Docker."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
import trio

from executor.container_config import SANDBOX_UID_BASE, SANDBOX_UID_COUNT
from executor.contract import SANDBOX_REQUIRED
from mesh.node import MeshNode, NodeConfig
from tests.docker_support import sandbox_policy
from transports.ble import BleTransport
from transports.ble.sim import SimulatedRadioHandle, open_simulated_radio
from transports.wire.identity import NodeIdentity
from transports.wire.offers import TaskOffer
from transports.wire.reasons import Reason

LAPTOP = NodeIdentity.generate()


@contextlib.asynccontextmanager
async def ble_node(mode: str = "docker") -> AsyncIterator[tuple[MeshNode, SimulatedRadioHandle, BleTransport]]:
    config = NodeConfig(identity=NodeIdentity.generate(), sandbox_mode=mode, executor_policy=sandbox_policy())  # type: ignore[arg-type]
    async with (
        MeshNode.open(config) as node,
        open_simulated_radio() as radio,
        trio.open_nursery() as nursery,
    ):
        transport = await nursery.start(node.run_ble, radio)
        yield node, radio, transport
        nursery.cancel_scope.cancel()


@pytest.mark.docker
def test_a_nearby_laptops_offer_runs_in_docker_and_the_laptop_verifies_the_result() -> None:
    async def main() -> None:
        async with ble_node() as (node, radio, _):
            offer = TaskOffer.create(LAPTOP, language="python", code="import os\nprint(os.getuid())")
            laptop = await radio.add_offering_peer(LAPTOP, offer.sign(LAPTOP))
            with trio.fail_after(30):
                result = await laptop.wait_result()
            assert result.executor == node.identity.public_key  # verified by the laptop against the claimant
            uid = int(result.result.stdout)  # each sandbox runs as a uid of its own, from the reserved range
            assert result.result.ok and SANDBOX_UID_BASE <= uid < SANDBOX_UID_BASE + SANDBOX_UID_COUNT
            assert node.intake.admitted["ble"] == 1 and list(node.ran) == [offer.offer_id]

    trio.run(main)


@pytest.mark.docker
def test_tampered_and_host_offers_over_ble_are_refused_by_the_real_intake_and_executor() -> None:
    async def main() -> None:
        async with ble_node() as (node, radio, transport):
            good = TaskOffer.create(LAPTOP, language="python", code="print(1)").sign(LAPTOP)
            tampered = bytearray(good)
            tampered[-3] ^= 0x10
            await radio.add_offering_peer(LAPTOP, bytes(tampered))
            host = TaskOffer.create(LAPTOP, language="python", code="print('host?')", sandbox="host")
            asks_host = await radio.add_offering_peer(LAPTOP, host.sign(LAPTOP))
            with trio.fail_after(30):
                while (
                    node.intake.rejected[("ble", "bad_signature")] < 1
                    or node.intake.rejected[("ble", SANDBOX_REQUIRED)] < 1
                ):
                    await trio.sleep(0.05)
            # Refused by the intake before any claim: the laptop's offer stays open for a node that may take it.
            state = await asks_host.state()
            assert not state.claims and not state.has_result
            assert not node.ran  # refused before any container
            outcomes = list(transport.outcomes._items)
            assert any(getattr(o.verdict, "reason", None) == Reason.BAD_SIGNATURE for o in outcomes)

    trio.run(main)


def test_a_sandbox_mode_none_node_does_not_scan_for_offers() -> None:
    async def main() -> None:
        async with ble_node(mode="none") as (node, radio, transport):
            await radio.add_offering_peer(LAPTOP, TaskOffer.create(LAPTOP, language="python", code="1").sign(LAPTOP))
            await trio.sleep(1.0)  # several participation polls: nothing may happen, so there is no event to await
            assert not transport.scanning
            assert (await transport.stats()).scans_started == 0
            assert sum(node.intake.admitted.values()) == 0 and not node.intake.rejected

    trio.run(main)
